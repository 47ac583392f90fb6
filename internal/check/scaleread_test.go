package check

import (
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/evidence"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// TestDSMLAScaleRead (audit row F15): an amax-written fp8_ds_mla cache read
// the way FlashMLA's sm100 sparse decode reads it (each F32 tile scale
// converted to E8M0 toward zero, deepseek-ai/FlashMLA@9241ae3
// csrc/sm100/decode/head64/kernel.cuh:708-709) or its sm90 one (rounded to
// bf16, csrc/sm90/decode/sparse_fp8/splitkv_mla.cuh:550). The captures are
// kcheck's model of those readings (kvcache.ScaleRead), made here: no GPU
// ran FlashMLA. Each passes when its reading is declared, with the loss
// against the stored-F32 reading in the notes, and is judged against the
// F32 reading when it is not: the sm100 capture fails there.
func TestDSMLAScaleRead(t *testing.T) {
	c := cases.Case{Name: "f15", Kernel: "mla_decode_sparse", Preset: "deepseek-v3", TP: 8, SeqLens: []int{300, 77},
		PageSize: 64, TopK: 128, KVCacheDType: "fp8_ds_mla", Seed: 21, Params: map[string]string{"ds_mla_scale": "amax"}}
	def := kernel.DefaultPrecision()
	for _, tc := range []struct {
		read       string
		undeclared compare.Verdict // the verdict when the capture is checked as an f32 reader's
	}{
		{"e8m0_rz", Fail},
		{"bf16", Fail}, // out worst 2.26x of the f32 reading's tolerance (seed 21)
		{"f32", Pass},
	} {
		outs := produce(t, c, def, map[string]string{"ds_mla_scale_read": tc.read})
		cp := captureOf(t, c, outs)
		declared := cp
		declared.Metadata = map[string]string{}
		for k, v := range cp.Metadata {
			declared.Metadata[k] = v
		}
		declared.Metadata["ds_mla_scale_read"] = tc.read
		res := Run(t.Context(), declared, Options{})
		if res.Verdict != Pass {
			t.Fatalf("%s capture, declared: verdict %s (%v)", tc.read, res.Verdict, res.Checks)
		}
		var loss []string
		for _, n := range res.Notes {
			if strings.Contains(n, "ds_mla_scale_read = "+tc.read) {
				loss = append(loss, n)
			}
		}
		if (tc.read == "f32") != (len(loss) == 0) {
			t.Errorf("%s capture, declared: notes %q", tc.read, res.Notes)
		}
		for _, n := range loss {
			t.Logf("%s", n)
		}
		plain := Run(t.Context(), cp, Options{})
		t.Logf("%s capture read as f32: %s; out worst err/tol %.3g", tc.read, plain.Verdict, float64(plain.Checks[0].Metrics.MaxExcess))
		if tc.undeclared != "" && plain.Verdict != tc.undeclared {
			t.Errorf("%s capture read as f32: verdict %s, want %s", tc.read, plain.Verdict, tc.undeclared)
		}
	}
	// the same sm100 capture as the attn stage of a one-stage pipeline:
	// the loss is in the result's notes, named after the stage
	outs := produce(t, c, def, map[string]string{"ds_mla_scale_read": "e8m0_rz"})
	one := captureOf(t, c, outs)
	pipe := evidence.Capture{Name: "pipe", Metadata: map[string]string{"kcheck.kernel": "pipeline", "kcheck.stages": "attn",
		"kcheck.attn.kernel": "mla_decode_sparse", "attn.ds_mla_scale_read": "e8m0_rz"}, Tensors: map[string]*tensor.Tensor{}}
	for k, v := range one.Metadata {
		if strings.HasPrefix(k, "kcheck.") {
			if k != "kcheck.kernel" {
				pipe.Metadata[k] = v
			}
			continue
		}
		pipe.Metadata["attn."+k] = v
	}
	for k, v := range one.Tensors {
		pipe.Tensors["attn."+k] = v
	}
	res := Run(t.Context(), pipe, Options{})
	found := false
	for _, n := range res.Notes {
		found = found || strings.HasPrefix(n, "stage attn: out: ds_mla_scale_read = e8m0_rz")
	}
	if res.Verdict != Pass || !found {
		t.Errorf("pipeline: verdict %s (%v), notes %q", res.Verdict, res.Error, res.Notes)
	}

	// a 16-bit cache has no tile scales to read
	b := c
	b.KVCacheDType, b.Params = "bf16", nil
	cp := captureOf(t, b, produce(t, b, def, nil))
	cp.Metadata["ds_mla_scale_read"] = "e8m0_rz"
	if res := Run(t.Context(), cp, Options{}); res.Verdict != Error || res.Error == nil || !strings.Contains(*res.Error, "kv_cache_dtype = bf16 has none") {
		t.Errorf("e8m0_rz on a bf16 cache: %s %v", res.Verdict, res.Error)
	}
}
