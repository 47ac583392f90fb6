package kvcache

import (
	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/kernels/paged"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// CaseSizes implements Slicer.
func (*write) CaseSizes() CaseSizes { return paged.Sizes(512) }

// CaseSizes implements Slicer.
func (*gather) CaseSizes() CaseSizes { return paged.Sizes(512) }

// Axes implements Slicer: a write's tokens, then the blocks no kept token
// writes and whose bytes did not change are dropped (a stray write
// elsewhere is evidence and stays).
func (*write) Axes(ts map[string]*tensor.Tensor, meta map[string]string) ([]Axis, bool) {
	sm, before, after := ts["slot_mapping"], ts["cache_before"], ts["cache_after"]
	if sm == nil || before == nil || after == nil || len(before.Shape) != 3 {
		return nil, true
	}
	page := paged.PageSizeOf(meta, before)
	nb := before.Shape[0]
	blockBytes := len(before.Data) / max(nb, 1)
	return []Axis{{Name: "tokens", N: sm.Len(), Slice: func(keep []int) (map[string]*tensor.Tensor, error) {
		repl := SliceNamed(ts, keep, map[string]int{"kv_c": 0, "k_pe": 0, "slot_mapping": 0})
		var blocks []int
		for _, i := range keep {
			if s := sm.Int64At(i); s >= 0 && int(s)/page < nb {
				blocks = append(blocks, int(s)/page)
			}
		}
		for b := 0; b < nb; b++ {
			if string(before.Data[b*blockBytes:(b+1)*blockBytes]) != string(after.Data[b*blockBytes:(b+1)*blockBytes]) {
				blocks = append(blocks, b)
			}
		}
		if len(blocks) == 0 {
			blocks = []int{0}
		}
		nc, remap := paged.CompactCache(blocks, before, after)
		repl["cache_before"], repl["cache_after"] = nc[0], nc[1]
		slots := make([]int64, len(keep))
		for j, i := range keep {
			s := sm.Int64At(i)
			slots[j] = s
			if s >= 0 && int(s)/page < nb {
				slots[j] = int64(remap[int(s)/page]*page) + s%int64(page)
			}
		}
		repl["slot_mapping"] = tensor.FromInt64s(sm.DType, []int{len(keep)}, slots)
		return repl, nil
	}}}, true
}

// Axes implements Slicer: the requests, with their gathered rows. A
// chunked gather is sliced as the plain gather it is (Chunked): the sliced
// capture's block table starts at each kept request's chunk, and its
// seq_starts are 0.
func (*gather) Axes(ts map[string]*tensor.Tensor, meta map[string]string) ([]Axis, bool) {
	st, chunked := ts["seq_starts"]
	if chunked {
		chunk, err := Chunked(Inputs{Tensors: ts, Params: meta})
		if err != nil {
			return nil, false
		}
		ts = chunk.Tensors
	}
	g, sl := ts["gathered"], ts["seq_lens"]
	if g == nil || sl == nil {
		return nil, false
	}
	rows := func(keep []int, lens []int) map[string]*tensor.Tensor {
		var idx []int
		start := make([]int, sl.Len()+1)
		for i := 0; i < sl.Len(); i++ {
			start[i+1] = start[i] + int(sl.Int64At(i))
		}
		for _, r := range keep {
			for t := start[r]; t < start[r+1]; t++ {
				idx = append(idx, t)
			}
		}
		return map[string]*tensor.Tensor{"gathered": SelectAxis(g, 0, idx)}
	}
	axes := paged.Requests(ts, meta, "cache", rows, map[string]int{"seq_lens": 0})
	if chunked {
		for i, a := range axes {
			slice := a.Slice
			axes[i].Slice = func(keep []int) (map[string]*tensor.Tensor, error) {
				repl, err := slice(keep)
				if err == nil {
					repl["seq_starts"] = tensor.FromInt64s(st.DType, []int{len(keep)}, make([]int64, len(keep)))
				}
				return repl, err
			}
		}
	}
	return axes, true
}
