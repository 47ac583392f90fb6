package paged

import (
	"fmt"
	"sort"

	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Sizes are what a paged case reads: the requests' contexts, the page
// size (default 64), and a latent of latent (0: none to shrink).
func Sizes(latent int) CaseSizes {
	return CaseSizes{SeqLens: true, PageSize: 64, Latent: latent}
}

// PageSizeOf is the page size of a captured cache: the page_size
// parameter, else its second dimension.
func PageSizeOf(meta map[string]string, cache *tensor.Tensor) int {
	p := cache.Shape[1]
	if v, ok := meta["page_size"]; ok {
		fmt.Sscan(v, &p)
	}
	return max(p, 1)
}

// CompactCache keeps only the blocks of caches that the kept requests use
// (and, for a write, blocks whose bytes changed), renumbered in order of
// first use; it returns the new cache tensors and the block renumbering.
func CompactCache(blocks []int, caches ...*tensor.Tensor) ([]*tensor.Tensor, map[int]int) {
	sort.Ints(blocks)
	remap := map[int]int{}
	var order []int
	for _, b := range blocks {
		if _, ok := remap[b]; !ok {
			remap[b] = len(order)
			order = append(order, b)
		}
	}
	out := make([]*tensor.Tensor, len(caches))
	for i, c := range caches {
		out[i] = SelectAxis(c, 0, order)
	}
	return out, remap
}

// Requests is the requests axis of a paged read (a decode, a gather): the
// kept requests' rows of the perRequest tensors (name: axis), the cache
// compacted to their blocks and the block table renumbered, and whatever
// rowsOf slices given the kept requests and their contexts. It is nil
// when the tensors are not shaped for it.
func Requests(ts map[string]*tensor.Tensor, meta map[string]string, cacheName string, rowsOf func(keep []int, lens []int) map[string]*tensor.Tensor, perRequest map[string]int) []Axis {
	bt, sl, cache := ts["block_table"], ts["seq_lens"], ts[cacheName]
	if bt == nil || sl == nil || cache == nil || len(bt.Shape) != 2 || len(cache.Shape) != 3 {
		return nil
	}
	page := PageSizeOf(meta, cache)
	return []Axis{{Name: "requests", N: sl.Len(), Slice: func(keep []int) (map[string]*tensor.Tensor, error) {
		repl := SliceNamed(ts, keep, perRequest)
		mb := bt.Shape[1]
		var used []int
		lens := make([]int, len(keep))
		for j, r := range keep {
			lens[j] = int(sl.Int64At(r))
			for k := 0; k*page < lens[j] && k < mb; k++ {
				used = append(used, int(bt.Int64At(r*mb+k)))
			}
		}
		nc, remap := CompactCache(used, cache)
		repl[cacheName] = nc[0]
		tab := make([]int64, len(keep)*mb)
		for j, r := range keep {
			for k := 0; k*page < lens[j] && k < mb; k++ {
				tab[j*mb+k] = int64(remap[int(bt.Int64At(r*mb+k))])
			}
		}
		repl["block_table"] = tensor.FromInt64s(bt.DType, []int{len(keep), mb}, tab)
		for k, v := range rowsOf(keep, lens) {
			repl[k] = v
		}
		return repl, nil
	}}}
}
