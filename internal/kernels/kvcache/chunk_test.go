package kvcache

import (
	"context"
	"strings"
	"testing"

	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// chunkedInputs is a bf16 cache of 6 blocks of 2 tokens (each value
// distinct and exact in bf16: 16*block + 4*offset + dim) and two requests whose full
// contexts are 5 and 6 tokens over shuffled blocks; the chunk gathers
// tokens 2..4 of request 0 and 4..5 of request 1.
func chunkedInputs(starts []int64) Inputs {
	const nb, page, d = 6, 2, 4
	cache := tensor.New(tensor.BF16, nb, page, d)
	for blk := 0; blk < nb; blk++ {
		for off := 0; off < page; off++ {
			for j := 0; j < d; j++ {
				cache.SetFloat64((blk*page+off)*d+j, float64(16*blk+4*off+j))
			}
		}
	}
	ts := map[string]*tensor.Tensor{
		"cache":       cache,
		"block_table": tensor.FromInt64s(tensor.I32, []int{2, 3}, []int64{4, 0, 5, 2, 3, 1}),
		"seq_lens":    tensor.FromInt64s(tensor.I32, []int{2}, []int64{3, 2}),
	}
	if starts != nil {
		ts["seq_starts"] = tensor.FromInt64s(tensor.I32, []int{2}, starts)
	}
	return Inputs{Tensors: ts, Params: Params{"kv_cache_dtype": "bf16", "page_size": "2"}}
}

// TestChunkedGather: with seq_starts, request b's rows are its tokens
// seq_starts[b] + t, read straight from the cache tensor at
// block_table[b, (s+t)/P], (s+t)%P (a bf16 cache gathers exactly); the
// inputs the caller gave are left as they were.
func TestChunkedGather(t *testing.T) {
	g, _ := Lookup("kv_cache_gather")
	starts := []int64{2, 4}
	in := chunkedInputs(starts)
	bt := in.Tensors["block_table"]
	btBefore := append([]byte(nil), bt.Data...)
	outs, err := Evaluate(context.Background(), g, in, DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	o := outs[0]
	if o.Shape[0] != 5 || o.Shape[1] != 4 {
		t.Fatalf("gathered shape %v, want [5 4] (3 + 2 rows)", o.Shape)
	}
	cache := in.Tensors["cache"]
	row := 0
	for b, n := range []int{3, 2} {
		for tok := int(starts[b]); tok < int(starts[b])+n; tok++ {
			blk := int(bt.Int64At(b*3 + tok/2))
			for j := 0; j < 4; j++ {
				want := cache.Float64At((blk*2+tok%2)*4 + j)
				if got := o.Exact.At(row*4 + j); got != want {
					t.Errorf("request %d token %d dim %d (row %d): exact %v, want %v", b, tok, j, row, got, want)
				}
				if got := o.Expected.At(row*4 + j); got != want {
					t.Errorf("request %d token %d dim %d (row %d): expected %v, want %v", b, tok, j, row, got, want)
				}
			}
			row++
		}
	}
	if string(bt.Data) != string(btBefore) || in.Tensors["block_table"] != bt || in.Tensors["seq_starts"] == nil {
		t.Error("the caller's inputs were modified")
	}
}

// TestChunkedGatherReads: the cache entries the chunk reads are those of
// its tokens only (the notes on NaN in inputs read this).
func TestChunkedGatherReads(t *testing.T) {
	in := chunkedInputs([]int64{2, 4})
	read, err := gatheredRows(in)
	if err != nil {
		t.Fatal(err)
	}
	// request 0 tokens 2, 3, 4: block_table[0, 1] = 0 (offsets 0, 1) and
	// [0, 2] = 5 (offset 0); request 1 tokens 4, 5: [1, 2] = 1.
	want := map[int]bool{0*2 + 0: true, 0*2 + 1: true, 5*2 + 0: true, 1*2 + 0: true, 1*2 + 1: true}
	for entry := 0; entry < 12; entry++ {
		if got := read(entry * 4); got != want[entry] {
			t.Errorf("entry %d (block %d offset %d): read %v, want %v", entry, entry/2, entry%2, got, want[entry])
		}
	}
}

// TestChunkedGatherErrors: a seq_starts the gather cannot mean is refused,
// naming the tensor and the entry.
func TestChunkedGatherErrors(t *testing.T) {
	g, _ := Lookup("kv_cache_gather")
	for _, tc := range []struct {
		name   string
		starts *tensor.Tensor
		want   string
	}{
		{"negative", tensor.FromInt64s(tensor.I32, []int{2}, []int64{0, -2}), "seq_starts[1] = -2 is negative"},
		{"not block-aligned", tensor.FromInt64s(tensor.I32, []int{2}, []int64{1, 0}), "seq_starts[0] = 1 is not a multiple of page_size 2"},
		{"past the table", tensor.FromInt64s(tensor.I32, []int{2}, []int64{4, 0}), "seq_starts[0] + seq_lens[0] = 4 + 3 exceeds the block table's capacity 3*2 = 6"},
		{"one a request", tensor.FromInt64s(tensor.I32, []int{3}, []int64{0, 0, 0}), "tensor seq_starts has shape [3]; the contract wants [B] = [2]"},
		{"not integers", tensor.FromFloat64s(tensor.F32, []int{2}, []float64{0, 0}), "tensor seq_starts has dtype F32"},
	} {
		in := chunkedInputs(nil)
		in.Tensors["seq_starts"] = tc.starts
		_, err := Evaluate(context.Background(), g, in, DefaultPrecision(), nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want one saying %q", tc.name, err, tc.want)
		}
	}
}

// TestChunkedGatherSlices: shrink's requests axis keeps a chunked
// request's rows: the sliced capture's gather is what the whole one gave
// for that request.
func TestChunkedGatherSlices(t *testing.T) {
	g, _ := Lookup("kv_cache_gather")
	in := chunkedInputs([]int64{2, 4})
	whole, err := Produce(context.Background(), g, in, DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ts := map[string]*tensor.Tensor{"gathered": whole["gathered"]}
	for k, v := range in.Tensors {
		ts[k] = v
	}
	axes, ok := g.(Slicer).Axes(ts, map[string]string{"kv_cache_dtype": "bf16", "page_size": "2"})
	if !ok || len(axes) != 1 || axes[0].Name != "requests" || axes[0].N != 2 {
		t.Fatalf("axes %v (ok %v), want the two requests", axes, ok)
	}
	repl, err := axes[0].Slice([]int{1})
	if err != nil {
		t.Fatal(err)
	}
	sliced := Inputs{Tensors: map[string]*tensor.Tensor{}, Params: in.Params}
	for k, v := range ts {
		sliced.Tensors[k] = v
	}
	for k, v := range repl {
		sliced.Tensors[k] = v
	}
	delete(sliced.Tensors, "gathered")
	part, err := Produce(context.Background(), g, sliced, DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, want := part["gathered"].Float64s(), whole["gathered"].Float64s()[3*4:]
	if len(got) != len(want) {
		t.Fatalf("sliced gather has %d values, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] || repl["gathered"].Float64At(i) != want[i] {
			t.Fatalf("value %d: sliced %v (captured %v), want %v", i, got[i], repl["gathered"].Float64At(i), want[i])
		}
	}
}
