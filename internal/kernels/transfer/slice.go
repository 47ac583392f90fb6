package transfer

import (
	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/kernels/paged"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// CaseSizes implements Slicer.
func (kernelTransfer) CaseSizes() CaseSizes { return paged.Sizes(512) }

// Axes implements Slicer: the requests. Each kept request keeps its pages
// on both sides; the decode cache also keeps every block whose bytes the
// transfer changed (a stray write elsewhere is evidence), and both block
// tables are renumbered.
func (kernelTransfer) Axes(ts map[string]*tensor.Tensor, meta map[string]string) ([]Axis, bool) {
	src, sbt, dst, dbt, sl, after := ts["src_cache"], ts["src_block_table"], ts["dst_cache_before"], ts["dst_block_table"], ts["seq_lens"], ts["dst_cache_after"]
	if src == nil || sbt == nil || dst == nil || dbt == nil || sl == nil || after == nil ||
		len(src.Shape) != 3 || len(dst.Shape) != 3 || len(sbt.Shape) != 2 || len(dbt.Shape) != 2 ||
		len(after.Data) != len(dst.Data) {
		return nil, false
	}
	ps, pd := src.Shape[1], dst.Shape[1]
	nb := dst.Shape[0]
	blockBytes := len(dst.Data) / max(nb, 1)
	used := func(bt *tensor.Tensor, page, nb, r, n int) []int {
		var out []int
		mb := bt.Shape[1]
		for k := 0; k*page < n && k < mb; k++ {
			if v := int(bt.Int64At(r*mb + k)); v >= 0 && v < nb {
				out = append(out, v)
			}
		}
		return out
	}
	renumber := func(bt *tensor.Tensor, page, nb int, keep []int, remap map[int]int) *tensor.Tensor {
		mb := bt.Shape[1]
		tab := make([]int64, len(keep)*mb)
		for j, r := range keep {
			for k := 0; k*page < int(sl.Int64At(r)) && k < mb; k++ {
				if v := int(bt.Int64At(r*mb + k)); v >= 0 && v < nb {
					tab[j*mb+k] = int64(remap[v])
				}
			}
		}
		return tensor.FromInt64s(bt.DType, []int{len(keep), mb}, tab)
	}
	return []Axis{{Name: "requests", N: sl.Len(), Slice: func(keep []int) (map[string]*tensor.Tensor, error) {
		repl := SliceNamed(ts, keep, map[string]int{"seq_lens": 0})
		var sb, db []int
		for _, r := range keep {
			n := int(sl.Int64At(r))
			sb = append(sb, used(sbt, ps, src.Shape[0], r, n)...)
			db = append(db, used(dbt, pd, nb, r, n)...)
		}
		// A dropped request's entries were the dropped request's to write:
		// they go back to what they held before, and a change left
		// anywhere else is evidence that stays.
		after := after.Clone()
		dropped := map[int]bool{}
		for r := 0; r < sl.Len(); r++ {
			dropped[r] = true
		}
		for _, r := range keep {
			delete(dropped, r)
		}
		whole := meta["whole_pages"] == "true"
		eb := blockBytes / max(pd, 1)
		mb := dbt.Shape[1]
		for r := range dropped {
			n := int(sl.Int64At(r))
			if whole {
				n = (n + pd - 1) / pd * pd
			}
			for t := 0; t < n && t/pd < mb; t++ {
				if v := int(dbt.Int64At(r*mb + t/pd)); v >= 0 && v < nb {
					at := (v*pd + t%pd) * eb
					copy(after.Data[at:at+eb], dst.Data[at:at+eb])
				}
			}
		}
		for b := 0; b < nb; b++ {
			if string(dst.Data[b*blockBytes:(b+1)*blockBytes]) != string(after.Data[b*blockBytes:(b+1)*blockBytes]) {
				db = append(db, b)
			}
		}
		if len(sb) == 0 {
			sb = []int{0}
		}
		if len(db) == 0 {
			db = []int{0}
		}
		sc, sremap := paged.CompactCache(sb, src)
		dc, dremap := paged.CompactCache(db, dst, after)
		repl["src_cache"], repl["dst_cache_before"], repl["dst_cache_after"] = sc[0], dc[0], dc[1]
		repl["src_block_table"] = renumber(sbt, ps, src.Shape[0], keep, sremap)
		repl["dst_block_table"] = renumber(dbt, pd, nb, keep, dremap)
		return repl, nil
	}}}, true
}
