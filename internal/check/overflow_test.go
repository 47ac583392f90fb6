package check

import (
	"context"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/evidence"
	"github.com/kcheck-dev/kcheck/internal/kernel"
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
	r := Run(evidence.Capture{Name: "fp16-overflow", Metadata: meta, Tensors: ts}, Options{})
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
