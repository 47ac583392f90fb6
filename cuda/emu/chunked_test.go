//go:build cudaemu

package emu_test

import (
	"context"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// TestChunkedGather: the launcher runs a chunked gather (seq_starts, vLLM's
// chunked context) as the reference defines it: request b's tokens
// seq_starts[b] + t. The emulated kernel's bf16 rows equal the
// reference's bit for bit (a gather of a bf16 cache copies).
func TestChunkedGather(t *testing.T) {
	dir := modules(t)
	const nb, page, d = 6, 16, 576
	cache := tensor.New(tensor.BF16, nb, page, d)
	for i := 0; i < cache.Len(); i++ {
		cache.SetFloat64(i, float64(i%251)-125)
	}
	in := kernel.Inputs{Tensors: map[string]*tensor.Tensor{
		"cache":       cache,
		"block_table": tensor.FromInt64s(tensor.I32, []int{2, 3}, []int64{4, 0, 5, 2, 3, 1}),
		"seq_lens":    tensor.FromInt64s(tensor.I32, []int{2}, []int64{20, 9}),
		"seq_starts":  tensor.FromInt64s(tensor.I32, []int{2}, []int64{16, 32}),
	}, Params: kernel.Params{"kv_cache_dtype": "bf16", "page_size": "16"}}
	k, err := kernel.Lookup("kv_cache_gather")
	if err != nil {
		t.Fatal(err)
	}
	want, err := kernel.Produce(context.Background(), k, in, kernel.DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := backendFor(t, dir, "").Run(context.Background(), "kv_cache_gather", in)
	if err != nil {
		t.Fatal(err)
	}
	g, w := got["gathered"], want["gathered"]
	if g == nil || len(g.Data) != len(w.Data) {
		t.Fatalf("gathered %v, want shape %v", g, w.Shape)
	}
	for i := 0; i < w.Len(); i++ {
		if g.Float64At(i) != w.Float64At(i) {
			t.Fatalf("row %d dim %d: %v, want %v", i/d, i%d, g.Float64At(i), w.Float64At(i))
		}
	}
}
