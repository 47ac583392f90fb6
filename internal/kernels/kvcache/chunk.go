package kvcache

import (
	"fmt"

	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/kernels/paged"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// A chunked gather (seq_starts). vLLM gathers a long context in chunks
// that fit its workspace (vllm 0.33.0,
// vllm/model_executor/layers/attention/mla_attention.py: each chunk's
// `starts` are the requests' context offsets, passed to
// gather_and_maybe_dequant_cache as seq_starts, vllm/_custom_ops.py), and
// "the gather_and_maybe_dequant_cache kernel cannot handle chunk starts
// that are not aligned to block_size" (the same file, which aligns them).
// So request b's rows are its tokens seq_starts[b] + t, t < seq_lens[b],
// which is the plain gather over the block table's row b from entry
// seq_starts[b] / P on: Chunked makes that table and the rest of the
// kernel reads it as it reads any.

// Chunked returns in with block_table starting at each request's chunk and
// seq_starts gone, or in itself when it has no seq_starts: the gather the
// reference and the CUDA launcher run. Inputs it cannot
// read the page size or the tables of are returned as they are, for the
// gather's own checks to name.
func Chunked(in Inputs) (Inputs, error) {
	st, ok := in.Tensors["seq_starts"]
	if !ok {
		return in, nil
	}
	ct, bt, sl := in.Tensors["cache"], in.Tensors["block_table"], in.Tensors["seq_lens"]
	if ct == nil || bt == nil || sl == nil || len(ct.Shape) != 3 || len(bt.Shape) != 2 || len(sl.Shape) != 1 ||
		bt.Check() != nil || sl.Check() != nil || !bt.DType.IsInt() || !sl.DType.IsInt() {
		return in, nil
	}
	page, err := in.Params.Int("page_size", ct.Shape[1])
	if err != nil || page <= 0 {
		return in, nil
	}
	if err := st.Check(); err != nil {
		return in, fmt.Errorf("tensor seq_starts: %v", err)
	}
	b, mb := bt.Shape[0], bt.Shape[1]
	if len(st.Shape) != 1 || st.Shape[0] != b {
		return in, fmt.Errorf("tensor seq_starts has shape %v; the contract wants [B] = [%d] (one start a block_table row)", st.Shape, b)
	}
	if sl.Shape[0] != b {
		return in, nil // NewPages names it
	}
	table := make([]int64, b*mb)
	for r := 0; r < b; r++ {
		s, n := st.Int64At(r), sl.Int64At(r)
		switch {
		case s < 0:
			return in, fmt.Errorf("seq_starts[%d] = %d is negative", r, s)
		case s%int64(page) != 0:
			return in, fmt.Errorf("seq_starts[%d] = %d is not a multiple of page_size %d: vLLM's gather reads a chunk from block seq_starts/page_size on, so chunk starts are block-aligned (vllm/model_executor/layers/attention/mla_attention.py)", r, s, page)
		case n >= 0 && s+n > int64(mb)*int64(page):
			return in, fmt.Errorf("seq_starts[%d] + seq_lens[%d] = %d + %d exceeds the block table's capacity %d*%d = %d", r, r, s, n, mb, page, int64(mb)*int64(page))
		}
		first := int(s / int64(page))
		for j := 0; j < mb; j++ {
			table[r*mb+j] = -1 // past the row's end: never read (the capacity check above)
			if first+j < mb {
				table[r*mb+j] = bt.Int64At(r*mb + first + j)
			}
		}
	}
	ts := make(map[string]*tensor.Tensor, len(in.Tensors))
	for k, v := range in.Tensors {
		ts[k] = v
	}
	delete(ts, "seq_starts")
	ts["block_table"] = tensor.FromInt64s(bt.DType, bt.Shape, table)
	out := in
	out.Tensors = ts
	return out, nil
}

// gatheredRows is the Read of the gather's cache: the entries of the
// tokens each request's chunk gathers.
func gatheredRows(in Inputs) (func(int) bool, error) {
	chunk, err := Chunked(in)
	if err != nil {
		return nil, err
	}
	return paged.AttendedRows("cache")(chunk)
}
