package shrink

import (
	"context"
	"fmt"
	"sort"

	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/reference/nvfp4"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// A capture is shrunk along its independent axes: the outputs of a kept
// request, head or row depend only on that request's, head's or row's
// inputs, so the captured outputs, sliced, are still what the kernel under
// test produced for the sliced inputs.

// dim is one axis a capture can be sliced along.
type dim struct {
	name  string
	n     int
	apply func(keep []int) (check.Capture, error)
}

// selectAxis returns t with only the indices keep of axis ax.
func selectAxis(t *tensor.Tensor, ax int, keep []int) *tensor.Tensor {
	outer, n, inner := 1, t.Shape[ax], 1
	for d, s := range t.Shape {
		switch {
		case d < ax:
			outer *= s
		case d > ax:
			inner *= s
		}
	}
	shape := append([]int(nil), t.Shape...)
	shape[ax] = len(keep)
	r := tensor.New(t.DType, shape...)
	es := t.DType.Size() * inner
	for o := 0; o < outer; o++ {
		for j, i := range keep {
			copy(r.Data[(o*len(keep)+j)*es:(o*len(keep)+j+1)*es], t.Data[(o*n+i)*es:(o*n+i+1)*es])
		}
	}
	return r
}

// derived copies c with new tensors replacing some.
func derived(c check.Capture, repl map[string]*tensor.Tensor) check.Capture {
	ts := make(map[string]*tensor.Tensor, len(c.Tensors))
	for k, v := range c.Tensors {
		ts[k] = v
	}
	for k, v := range repl {
		ts[k] = v
	}
	meta := make(map[string]string, len(c.Metadata))
	for k, v := range c.Metadata {
		meta[k] = v
	}
	return check.Capture{Name: c.Name, Metadata: meta, Tensors: ts}
}

// sliceNamed slices every present tensor of names along its axis.
func sliceNamed(c check.Capture, keep []int, axes map[string]int) map[string]*tensor.Tensor {
	repl := map[string]*tensor.Tensor{}
	for name, ax := range axes {
		if t, ok := c.Tensors[name]; ok && len(t.Shape) > ax {
			repl[name] = selectAxis(t, ax, keep)
		}
	}
	return repl
}

// scaleRows slices the rows of an NVFP4 block-scale tensor in either
// layout (a swizzled one is unswizzled, sliced and swizzled again, its
// padding zero).
func scaleRows(sc *tensor.Tensor, rows, kSF int, swizzled bool, keep []int) (*tensor.Tensor, error) {
	if !swizzled {
		return selectAxis(sc, 0, keep), nil
	}
	lin, err := nvfp4.UnswizzleScales(sc.Data, rows, kSF)
	if err != nil {
		return nil, err
	}
	sub := make([]uint8, 0, len(keep)*kSF)
	for _, r := range keep {
		sub = append(sub, lin[r*kSF:(r+1)*kSF]...)
	}
	sw, err := nvfp4.SwizzleScales(sub, len(keep), kSF)
	if err != nil {
		return nil, err
	}
	mPad, kPad := nvfp4.PaddedShape(len(keep), kSF)
	shape := []int{mPad, kPad}
	if len(sc.Shape) == 1 {
		shape = []int{mPad * kPad}
	}
	return &tensor.Tensor{DType: sc.DType, Shape: shape, Data: sw}, nil
}

// compactCache keeps only the blocks of cache the kept block-table rows
// use (and, for a write, blocks whose bytes changed), renumbered in order
// of first use; it returns the new cache tensors and the block renumbering.
func compactCache(blocks []int, caches ...*tensor.Tensor) ([]*tensor.Tensor, map[int]int) {
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
		out[i] = selectAxis(c, 0, order)
	}
	return out, remap
}

func isSwizzled(c check.Capture) bool { return c.Metadata["scale_layout"] == "swizzled_128x4" }

func pageSize(c check.Capture, cache *tensor.Tensor) int {
	p := cache.Shape[1]
	if v, ok := c.Metadata["page_size"]; ok {
		fmt.Sscan(v, &p)
	}
	return max(p, 1)
}

// pagedDims are the requests of a paged decode or gather (with the cache
// compacted to the kept requests' blocks) and, for a decode, its heads.
func pagedDims(c check.Capture, cacheName string, rowsOf func(keep []int, lens []int) map[string]*tensor.Tensor, perRequest map[string]int) []dim {
	bt, sl, cache := c.Tensors["block_table"], c.Tensors["seq_lens"], c.Tensors[cacheName]
	if bt == nil || sl == nil || cache == nil || len(bt.Shape) != 2 || len(cache.Shape) != 3 {
		return nil
	}
	page := pageSize(c, cache)
	return []dim{{name: "requests", n: sl.Len(), apply: func(keep []int) (check.Capture, error) {
		repl := sliceNamed(c, keep, perRequest)
		mb := bt.Shape[1]
		var used []int
		lens := make([]int, len(keep))
		for j, r := range keep {
			lens[j] = int(sl.Int64At(r))
			for k := 0; k*page < lens[j] && k < mb; k++ {
				used = append(used, int(bt.Int64At(r*mb+k)))
			}
		}
		nc, remap := compactCache(used, cache)
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
		return derived(c, repl), nil
	}}}
}

// dims lists the axes a capture of its kernel can be sliced along.
func dims(c check.Capture) ([]dim, error) {
	kern := c.Metadata["kcheck.kernel"]
	T := c.Tensors
	rowsDim := func(name string, n int, axes map[string]int, scales map[string]int) dim {
		return dim{name: name, n: n, apply: func(keep []int) (check.Capture, error) {
			repl := sliceNamed(c, keep, axes)
			for sc, k := range scales { // scale tensor -> its K (elements a row)
				if t, ok := T[sc]; ok {
					s, err := scaleRows(t, n, k/nvfp4.BlockSize, isSwizzled(c), keep)
					if err != nil {
						return check.Capture{}, fmt.Errorf("tensor %s: %v", sc, err)
					}
					repl[sc] = s
				}
			}
			return derived(c, repl), nil
		}}
	}
	switch kern {
	case "nvfp4_quantize":
		x := T["x"]
		if x == nil || len(x.Shape) != 2 {
			break
		}
		return []dim{rowsDim("rows", x.Shape[0], map[string]int{"x": 0, "packed": 0}, map[string]int{"block_scale": x.Shape[1]})}, nil
	case "nvfp4_dequantize":
		p := T["packed"]
		if p == nil || len(p.Shape) != 2 {
			break
		}
		return []dim{rowsDim("rows", p.Shape[0], map[string]int{"packed": 0, "out": 0}, map[string]int{"block_scale": 2 * p.Shape[1]})}, nil
	case "nvfp4_gemm":
		a, b := T["a_packed"], T["b_packed"]
		if a == nil || b == nil || len(a.Shape) != 2 || len(b.Shape) != 2 {
			break
		}
		return []dim{
			rowsDim("m", a.Shape[0], map[string]int{"a_packed": 0, "out": 0}, map[string]int{"a_scale": 2 * a.Shape[1]}),
			rowsDim("n", b.Shape[0], map[string]int{"b_packed": 0, "out": 1}, map[string]int{"b_scale": 2 * b.Shape[1]}),
		}, nil
	case "splitk_combine":
		po := T["partial_out"]
		if po == nil || len(po.Shape) != 3 {
			break
		}
		return []dim{rowsDim("rows", po.Shape[0], map[string]int{"partial_out": 0, "partial_lse": 0, "out": 0, "lse": 0}, nil)}, nil
	case "mla_decode":
		q := T["q"]
		if q == nil || len(q.Shape) != 4 {
			break
		}
		per := map[string]int{"q": 0, "seq_lens": 0, "split_bounds": 0, "out": 0, "lse": 0, "partial_out": 0, "partial_lse": 0}
		ds := pagedDims(c, "kv_cache", func([]int, []int) map[string]*tensor.Tensor { return nil }, per)
		heads := map[string]int{"q": 2, "out": 2, "lse": 1, "partial_out": 2, "partial_lse": 2}
		ds = append(ds, dim{name: "heads", n: q.Shape[2], apply: func(keep []int) (check.Capture, error) {
			return derived(c, sliceNamed(c, keep, heads)), nil
		}})
		return ds, nil
	case "kv_cache_gather":
		g, sl := T["gathered"], T["seq_lens"]
		if g == nil || sl == nil {
			break
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
			return map[string]*tensor.Tensor{"gathered": selectAxis(g, 0, idx)}
		}
		return pagedDims(c, "cache", rows, map[string]int{"seq_lens": 0}), nil
	case "kv_cache_write":
		return writeDims(c), nil
	case "pipeline":
		return nil, fmt.Errorf("a pipeline capture cannot be sliced stage by stage yet: shrink the culprit stage as a case (kcheck shrink --case) or capture that kernel alone")
	}
	return nil, fmt.Errorf("kernel %q: no slicing for this capture", kern)
}

// writeDims slices a cache write's tokens, then drops the blocks no kept
// token writes and whose bytes did not change (a stray write elsewhere is
// evidence and stays).
func writeDims(c check.Capture) []dim {
	T := c.Tensors
	sm, before, after := T["slot_mapping"], T["cache_before"], T["cache_after"]
	if sm == nil || before == nil || after == nil || len(before.Shape) != 3 {
		return nil
	}
	page := pageSize(c, before)
	nb := before.Shape[0]
	blockBytes := len(before.Data) / max(nb, 1)
	return []dim{{name: "tokens", n: sm.Len(), apply: func(keep []int) (check.Capture, error) {
		repl := sliceNamed(c, keep, map[string]int{"kv_c": 0, "k_pe": 0, "slot_mapping": 0})
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
		nc, remap := compactCache(blocks, before, after)
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
		return derived(c, repl), nil
	}}}
}

// subsets lists the index sets ddmin tries for n items, largest reductions
// first: each half, then the complement of each chunk at finer and finer
// granularity.
func subsets(n int) [][]int {
	var out [][]int
	rng := func(lo, hi int) []int {
		var s []int
		for i := lo; i < hi; i++ {
			s = append(s, i)
		}
		return s
	}
	if n < 2 {
		return nil
	}
	seen := map[string]bool{}
	add := func(s []int) {
		if k := fmt.Sprint(s); !seen[k] {
			seen[k] = true
			out = append(out, s)
		}
	}
	add(rng(0, 1))
	add(rng(0, n/2))
	add(rng(n/2, n))
	for g := 2; g <= n; g *= 2 {
		chunk := (n + g - 1) / g
		for lo := 0; lo < n; lo += chunk {
			if hi := min(n, lo+chunk); hi-lo < n {
				add(append(rng(0, lo), rng(hi, n)...))
			}
		}
	}
	return out
}

// Capture shrinks a failing capture by slicing it along its kernel's
// independent axes (requests, heads, rows, tokens), checking each slice
// against its own captured outputs.
func Capture(ctx context.Context, c check.Capture, opts Options) (*Result, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	res0 := check.Run(c, opts.Check)
	want := FingerprintOf(res0)
	if want.Verdict != check.Fail {
		return nil, fmt.Errorf("%s does not fail (verdict %s): nothing to shrink", c.Name, res0.Verdict)
	}
	if _, err := dims(c); err != nil {
		return nil, err
	}
	r := &Result{Fingerprint: want, Before: Size(c), Capture: c, Check: res0}
	for progress := true; progress && r.Tries < opts.maxTries(); {
		progress = false
		ds, err := dims(r.Capture)
		if err != nil {
			return nil, err
		}
	search:
		for _, d := range ds {
			for _, keep := range subsets(d.n) {
				if r.Tries >= opts.maxTries() {
					break search
				}
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				r.Tries++
				cand, err := d.apply(keep)
				if err != nil || Size(cand) >= Size(r.Capture) {
					continue
				}
				res := check.Run(cand, opts.Check)
				if FingerprintOf(res) != want {
					continue
				}
				r.Capture, r.Check = cand, res
				r.Steps = append(r.Steps, fmt.Sprintf("%s %d -> %d", d.name, d.n, len(keep)))
				progress = true
				break search
			}
		}
	}
	r.After = Size(r.Capture)
	r.BeforeBytes, r.AfterBytes = r.Before, r.After
	r.Capture.Metadata["kcheck.shrunk_from"] = c.Name
	return r, nil
}
