package mla

import (
	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/kernels/paged"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// CaseSizes implements Slicer.
func (*decode) CaseSizes() CaseSizes { return paged.Sizes(512) }

// CaseSizes implements Slicer.
func (*sparseDecode) CaseSizes() CaseSizes { return paged.Sizes(512) }

// Axes implements Slicer: the requests (the cache compacted to theirs),
// then the heads.
func (*decode) Axes(ts map[string]*tensor.Tensor, meta map[string]string) ([]Axis, bool) {
	q := ts["q"]
	if q == nil || len(q.Shape) != 4 {
		return nil, false
	}
	per := map[string]int{"q": 0, "seq_lens": 0, "split_bounds": 0, "out": 0, "lse": 0, "partial_out": 0, "partial_lse": 0}
	axes := paged.Requests(ts, meta, "kv_cache", func([]int, []int) map[string]*tensor.Tensor { return nil }, per)
	if tt := ts["k_scale_tiles"]; tt != nil && len(axes) == 1 {
		axes[0].Slice = withTiles(axes[0].Slice, ts, meta, tt)
	}
	heads := map[string]int{"q": 2, "out": 2, "lse": 1, "partial_out": 2, "partial_lse": 2}
	axes = append(axes, Axis{Name: "heads", N: q.Shape[2], Slice: func(keep []int) (map[string]*tensor.Tensor, error) {
		return SliceNamed(ts, keep, heads), nil
	}})
	return axes, true
}

// Axes implements Slicer: a sparse decode's captures have no slicing yet
// (kcheck shrink says so; its cases shrink).
func (*sparseDecode) Axes(map[string]*tensor.Tensor, map[string]string) ([]Axis, bool) {
	return nil, false
}

// withTiles makes a requests slice compact k_scale_tiles [NB, P, L/128]
// as it compacts kv_cache: the same blocks in the same order
// (paged.CompactCache renumbers the used blocks in sorted order, whichever
// tensors it is given).
func withTiles(slice func([]int) (map[string]*tensor.Tensor, error), ts map[string]*tensor.Tensor, meta map[string]string, tt *tensor.Tensor) func([]int) (map[string]*tensor.Tensor, error) {
	return func(keep []int) (map[string]*tensor.Tensor, error) {
		repl, err := slice(keep)
		if err != nil {
			return nil, err
		}
		bt, sl := ts["block_table"], ts["seq_lens"]
		page := paged.PageSizeOf(meta, ts["kv_cache"])
		mb := bt.Shape[1]
		var used []int
		for _, r := range keep {
			for k := 0; k*page < int(sl.Int64At(r)) && k < mb; k++ {
				used = append(used, int(bt.Int64At(r*mb+k)))
			}
		}
		nc, _ := paged.CompactCache(used, tt)
		repl["k_scale_tiles"] = nc[0]
		return repl, nil
	}
}
