package check

import (
	"context"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/evidence"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/safetensors"
	"github.com/kcheck-dev/kcheck/internal/signature"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// TestFP16OverflowCulprit: a bf16 model's token past fp16's range (65536)
// written into an fp16 cache (reference/CONTRACTS.md §8.2: a BF16 kv_c
// into an fp16 cache, rounded to nearest even) is an inf in the cache
// although the exact value is finite: the write is the culprit, named an
// overflow in its verdict and signature. The decode that reads the cache
// carries the inf it was given (its exact answer, from its own inputs, is
// no longer finite) and is not at fault. Every output is what a correct
// kernel of the declared precision stores.
func TestFP16OverflowCulprit(t *testing.T) {
	const L, R, P = 4, 2, 2
	ctx := context.Background()
	kvc := tensor.FromFloat64s(tensor.BF16, []int{3, L}, []float64{1, 2, -1, 0.5, 65536, 1, 0.25, -2, 3, -0.5, 1, 1})
	kpe := tensor.FromFloat64s(tensor.BF16, []int{3, R}, []float64{0.5, 1, -1, 2, 1, 1})
	slots := tensor.FromInt64s(tensor.I64, []int{3}, []int64{4, 5, 0})
	before := tensor.New(tensor.F16, 3, P, L+R)
	wp := kernel.Params{"kv_cache_dtype": "fp16"}
	w, _ := kernel.Lookup("kv_cache_write")
	wout, err := kernel.Produce(ctx, w, kernel.Inputs{Tensors: map[string]*tensor.Tensor{"kv_c": kvc, "k_pe": kpe, "slot_mapping": slots, "cache_before": before}, Params: wp}, kernel.DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	after := wout["cache_after"]
	q := tensor.FromFloat64s(tensor.F16, []int{1, 1, 2, L + R}, []float64{1, 0, 0, 0, 0, 0, 0.5, -1, 0.25, 1, 0, 2})
	bt := tensor.FromInt64s(tensor.I32, []int{1, 2}, []int64{2, 0})
	sl := tensor.FromInt64s(tensor.I32, []int{1}, []int64{3})
	ap := kernel.Params{"kv_cache_dtype": "auto", "softmax_scale": "0.5", "latent_dim": "4"}
	a, _ := kernel.Lookup("mla_decode")
	aout, err := kernel.Produce(ctx, a, kernel.Inputs{Tensors: map[string]*tensor.Tensor{"q": q, "kv_cache": after, "block_table": bt, "seq_lens": sl}, Params: ap}, kernel.DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	meta := map[string]string{"kcheck.format": "1", "kcheck.kernel": "pipeline", "kcheck.stages": "cache,attn",
		"kcheck.cache.kernel": "kv_cache_write", "kcheck.attn.kernel": "mla_decode", "kcheck.attn.from.kv_cache": "cache.cache_after"}
	for k, v := range wp {
		meta["cache."+k] = v
	}
	for k, v := range ap {
		meta["attn."+k] = v
	}
	ts := map[string]*tensor.Tensor{"cache.kv_c": kvc, "cache.k_pe": kpe, "cache.slot_mapping": slots, "cache.cache_before": before,
		"cache.cache_after": after, "attn.q": q, "attn.block_table": bt, "attn.seq_lens": sl, "attn.out": aout["out"], "attn.lse": aout["lse"]}
	r := Run(t.Context(), evidence.Capture{Name: "fp16-overflow", Metadata: meta, Tensors: ts}, Options{})
	if r.Error != nil {
		t.Fatalf("error: %s (notes %q)", *r.Error, r.Notes)
	}
	if r.Verdict != Fail || r.Stage == nil || *r.Stage != "cache" {
		t.Fatalf("verdict %s stage %v, want fail at cache", r.Verdict, r.Stage)
	}
	for _, st := range r.Stages {
		switch st.Prefix {
		case "cache":
			c := st.Local[0]
			if c.Metrics.Overflow != 1 || !strings.HasPrefix(c.Reason, "overflow: 1 of 36 elements are an infinity in F16") || c.Signature == nil || c.Signature.Pattern != signature.Overflow {
				t.Errorf("cache stage: overflow %d, reason %q, signature %+v; want the one overflow named", c.Metrics.Overflow, c.Reason, c.Signature)
			}
		case "attn":
			if st.Verdict != Pass {
				t.Errorf("attn stage, which carries the inf it was given: local verdict %s, want pass (%+v)", st.Verdict, st.Local)
			}
		}
	}
}

// loadTestdata reads testdata/NAME into memory (a capture the test may
// modify).
func loadTestdata(t *testing.T, name string) evidence.Capture {
	t.Helper()
	f, err := safetensors.Open("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c := evidence.Capture{Name: name, Metadata: map[string]string{}, Tensors: map[string]*tensor.Tensor{}}
	for k, v := range f.Metadata {
		c.Metadata[k] = v
	}
	for k, v := range f.Tensors {
		c.Tensors[k] = v.Clone()
	}
	return c
}

// TestVLLMTritonMLACaptures: outputs of vLLM 0.33.0's own TRITON_MLA kernel
// (decode_attention_fwd as forward_mqa calls it, o and lse in the query's
// dtype: triton_mla.py:262-265), run by the Triton interpreter through
// `kcheck run --backend worker:vllm --out` (TRITON_INTERPRET=1; the
// worker's provenance, shims and declared precision are in each file's
// metadata): an fp16 model (fp16 q and cache, case
// mla_decode/fp16/deepseek-v3/tp8/p16/ctx-P-1) and a bf16 one with its bf16
// lse (mla_decode/deepseek-v3/tp8/bf16/p16/ctx-P+1, the audit's tested case
// V15, which was "ERROR tensor lse has dtype BF16"). Both pass, each output
// judged at its own dtype; the same lse upcast to F32 claims a precision
// the kernel does not have and fails (the audit's false FAIL); a planted
// fault fails with its pattern: a base-2 lse (constant_factor), head 3's
// output overwritten by head 4's (one_head).
func TestVLLMTritonMLACaptures(t *testing.T) {
	for _, c := range []struct {
		file  string
		dtype tensor.DType
	}{{"vllm_triton_mla_fp16.safetensors", tensor.F16}, {"vllm_triton_mla_bf16_lse.safetensors", tensor.BF16}} {
		r := Run(t.Context(), loadTestdata(t, c.file), Options{})
		if r.Verdict != Pass {
			t.Errorf("%s: verdict %s (error %v), want pass", c.file, r.Verdict, r.Error)
		}
		for _, ch := range r.Checks {
			if (ch.Tensor == "out" || ch.Tensor == "lse") && ch.DType != c.dtype {
				t.Errorf("%s: %s judged as %s, want %s", c.file, ch.Tensor, ch.DType, c.dtype)
			}
		}
		for _, p := range []struct {
			name, tensor, pattern string
			edit                  func(evidence.Capture)
			verdict               compare.Verdict
		}{
			{"lse upcast to F32", "lse", "", func(cp evidence.Capture) {
				l := cp.Tensors["lse"]
				cp.Tensors["lse"] = tensor.FromFloat64s(tensor.F32, l.Shape, l.Float64s())
			}, Fail},
			{"base-2 lse", "lse", signature.ConstantFactor, func(cp evidence.Capture) {
				l := cp.Tensors["lse"]
				for i := 0; i < l.Len(); i++ {
					l.SetFloat64(i, l.Float64At(i)*1.4426950408889634)
				}
			}, Fail},
			{"head 3 written with head 4's output", "out", signature.OneHead, func(cp evidence.Capture) {
				o := cp.Tensors["out"] // [B, 1, H, L]
				L := o.Shape[3]
				for l := 0; l < L; l++ {
					o.SetFloat64(3*L+l, o.Float64At(4*L+l))
				}
			}, Fail},
		} {
			cp := loadTestdata(t, c.file)
			p.edit(cp)
			r := Run(t.Context(), cp, Options{})
			if r.Verdict != p.verdict {
				t.Errorf("%s, %s: verdict %s, want %s", c.file, p.name, r.Verdict, p.verdict)
				continue
			}
			for _, ch := range r.Checks {
				if ch.Tensor != p.tensor {
					continue
				}
				if ch.Verdict != Fail || (p.pattern != "" && (ch.Signature == nil || ch.Signature.Pattern != p.pattern)) {
					t.Errorf("%s, %s: %s %s, signature %+v; want fail, %q", c.file, p.name, ch.Tensor, ch.Verdict, ch.Signature, p.pattern)
				}
			}
		}
	}
}
