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
