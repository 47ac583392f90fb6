package cases

import (
	"context"
	"fmt"
	"math"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// paging is a block allocation for a batch: a shuffled block table (so a
// kernel that assumes contiguous pages fails) and two spare blocks that no
// request owns (poisoned, so a kernel that reads past its pages sees NaN, as
// FlashMLA's tests poison unused pages).
type paging struct {
	nb, maxBlocks int
	table         []int64 // [B, maxBlocks]
}

func (b *builder) paging(seqLens []int, page int) paging {
	used, maxBlocks := 0, 1
	for _, s := range seqLens {
		n := (s + page - 1) / page
		used += n
		maxBlocks = max(maxBlocks, n)
	}
	p := paging{nb: used + 2, maxBlocks: maxBlocks, table: make([]int64, len(seqLens)*maxBlocks)}
	order := b.r.perm(p.nb)
	next := 0
	for r, s := range seqLens {
		for j := 0; j < (s+page-1)/page; j++ {
			p.table[r*maxBlocks+j] = int64(order[next])
			next++
		}
	}
	return p
}

// slot is token t of request req's global cache slot, block*P + offset.
func (p paging) slot(req, t, page int) int64 {
	return p.table[req*p.maxBlocks+t/page]*int64(page) + int64(t%page)
}

// entryWidth is the last dimension of a cache of kv_cache_dtype.
func entryWidth(cacheDType string, d int) int {
	if cacheDType == "fp8_ds_mla" {
		return 656
	}
	return d
}

// emptyCache returns a cache of nb blocks filled with fill: "poison"
// (NaN in every field) or "random" (earlier content a write must keep).
func (b *builder) emptyCache(cacheDType string, nb, page, d int, fill string) (*tensor.Tensor, error) {
	var t *tensor.Tensor
	switch cacheDType {
	case "bf16":
		t = tensor.New(tensor.BF16, nb, page, d)
	case "fp8_e4m3", "fp8_ds_mla":
		t = tensor.New(tensor.U8, nb, page, entryWidth(cacheDType, d))
	default:
		return nil, fmt.Errorf("kv_cache_dtype %q: want bf16, fp8_e4m3 or fp8_ds_mla", cacheDType)
	}
	for i := range t.Data {
		if fill == "poison" {
			t.Data[i] = 0xFF // bf16 0xFFFF, e4m3 0xFF, f32 0xFFFFFFFF: NaN in every field
		} else {
			t.Data[i] = byte(b.r.src.Uint64())
		}
	}
	if fill != "poison" && cacheDType == "bf16" {
		for i := 0; i < t.Len(); i++ {
			t.SetFloat64(i, b.r.normal())
		}
	}
	return t, nil
}

// tokens returns bf16 kv_c [T, L] and k_pe [T, R] values.
func (b *builder) tokens(n, l, r int) (kvc, kpe []float64) {
	kvc = make([]float64, n*l)
	for i := range kvc {
		kvc[i] = formats.RoundBF16(b.r.normal())
	}
	kpe = make([]float64, n*r)
	for i := range kpe {
		kpe[i] = formats.RoundBF16(b.r.normal())
	}
	return kvc, kpe
}

// writeCache stores tokens at slots through the registered kv_cache_write
// reference, so every layout is produced by the one writer the checker trusts.
func writeCache(ctx context.Context, before *tensor.Tensor, kvc, kpe []float64, l, r int, slots []int64, params kernel.Params, kScale float64) (*tensor.Tensor, error) {
	w, err := kernel.Lookup("kv_cache_write")
	if err != nil {
		return nil, err
	}
	n := len(slots)
	in := map[string]*tensor.Tensor{
		"kv_c": bf16([]int{n, l}, kvc), "k_pe": bf16([]int{n, r}, kpe),
		"slot_mapping": tensor.FromInt64s(tensor.I64, []int{n}, slots), "cache_before": before,
	}
	if params.String("kv_cache_dtype", "bf16") != "bf16" {
		in["k_scale"] = f32Scalar(kScale)
	}
	out, err := kernel.Produce(ctx, w, kernel.Inputs{Tensors: in, Params: params}, kernel.DefaultPrecision(), nil)
	if err != nil {
		return nil, err
	}
	return out["cache_after"], nil
}

func (b *builder) kScale(g geometry, kvc, kpe []float64) float64 {
	m := math.Max(amax(kvc), amax(kpe))
	if m == 0 {
		return 1
	}
	return float64(float32(m / 448))
}

func (b *builder) kvWrite() (map[string]*tensor.Tensor, error) {
	g, err := b.c.geometry()
	if err != nil {
		return nil, err
	}
	d := g.latent + g.rope
	pg := b.paging(g.seqLens, g.page)
	before, err := b.emptyCache(g.cacheDType, pg.nb, g.page, d, "random")
	if err != nil {
		return nil, err
	}
	var slots []int64
	for req, s := range g.seqLens {
		for t := 0; t < s; t++ {
			slot := pg.slot(req, t, g.page)
			if b.r.intn(10) == 0 {
				slot = -1 // a padded token the writer must skip
			}
			slots = append(slots, slot)
		}
	}
	kvc, kpe := b.tokens(len(slots), g.latent, g.rope)
	ts := map[string]*tensor.Tensor{
		"kv_c": bf16([]int{len(slots), g.latent}, kvc), "k_pe": bf16([]int{len(slots), g.rope}, kpe),
		"slot_mapping": tensor.FromInt64s(tensor.I64, []int{len(slots)}, slots), "cache_before": before,
	}
	if g.cacheDType != "bf16" {
		ts["k_scale"] = f32Scalar(b.kScale(g, kvc, kpe))
	}
	return ts, nil
}

// pagedCache builds a filled paged cache for g's requests.
func (b *builder) pagedCache(g geometry) (cache *tensor.Tensor, pg paging, kScale float64, err error) {
	d := g.latent + g.rope
	pg = b.paging(g.seqLens, g.page)
	before, err := b.emptyCache(g.cacheDType, pg.nb, g.page, d, "poison")
	if err != nil {
		return nil, pg, 0, err
	}
	var slots []int64
	for req, s := range g.seqLens {
		for t := 0; t < s; t++ {
			slots = append(slots, pg.slot(req, t, g.page))
		}
	}
	kvc, kpe := b.tokens(len(slots), g.latent, g.rope)
	kScale = b.kScale(g, kvc, kpe)
	params := kernel.Params{"kv_cache_dtype": g.cacheDType, "page_size": fmt.Sprint(g.page)}
	for k, v := range b.params {
		if k == "ds_mla_scale" || k == "fp8_saturate" {
			params[k] = v
		}
	}
	cache, err = writeCache(b.ctx, before, kvc, kpe, g.latent, g.rope, slots, params, kScale)
	return cache, pg, kScale, err
}

func (b *builder) common(g geometry, pg paging) map[string]*tensor.Tensor {
	sl := make([]int64, len(g.seqLens))
	for i, s := range g.seqLens {
		sl[i] = int64(s)
	}
	return map[string]*tensor.Tensor{
		"block_table": tensor.FromInt64s(tensor.I32, []int{len(g.seqLens), pg.maxBlocks}, pg.table),
		"seq_lens":    tensor.FromInt64s(tensor.I32, []int{len(g.seqLens)}, sl),
	}
}

func (b *builder) kvGather() (map[string]*tensor.Tensor, error) {
	g, err := b.c.geometry()
	if err != nil {
		return nil, err
	}
	cache, pg, ks, err := b.pagedCache(g)
	if err != nil {
		return nil, err
	}
	ts := b.common(g, pg)
	ts["cache"] = cache
	if g.cacheDType != "bf16" {
		ts["k_scale"] = f32Scalar(ks)
	}
	return ts, nil
}

func (b *builder) mlaDecode(sparse bool) (map[string]*tensor.Tensor, error) {
	g, err := b.c.geometry()
	if err != nil {
		return nil, err
	}
	cache, pg, ks, err := b.pagedCache(g)
	if err != nil {
		return nil, err
	}
	ts := b.common(g, pg)
	ts["kv_cache"] = cache
	if g.cacheDType != "bf16" {
		ts["k_scale"] = f32Scalar(ks)
	}
	d := g.latent + g.rope
	q := make([]float64, g.batch*g.sq*g.heads*d)
	for i := range q {
		q[i] = formats.RoundBF16(b.r.normal())
	}
	ts["q"] = bf16([]int{g.batch, g.sq, g.heads, d}, q)
	if sparse {
		topk := b.c.topK()
		idx := make([]int64, g.batch*g.sq*topk)
		for req, s := range g.seqLens {
			for i := 0; i < g.sq; i++ {
				row := idx[(req*g.sq+i)*topk:][:topk]
				picked := b.r.perm(s)
				for j := range row {
					if j < len(picked) {
						row[j] = pg.slot(req, picked[j], g.page)
					} else {
						row[j] = -1
					}
				}
			}
		}
		ts["indices"] = tensor.FromInt64s(tensor.I32, []int{g.batch, g.sq, topk}, idx)
		delete(ts, "seq_lens")
	}
	return ts, nil
}

func (b *builder) splitkCombine() (map[string]*tensor.Tensor, error) {
	g, err := b.c.geometry()
	if err != nil {
		return nil, err
	}
	s := g.splits
	if s == 0 {
		s = 4
	}
	n := g.batch * g.sq * g.heads
	po := make([]float64, n*s*g.latent)
	for i := range po {
		po[i] = b.r.normal()
	}
	pl := make([]float64, n*s)
	for i := range pl {
		pl[i] = 5 + 3*b.r.normal()
		if b.r.intn(8) == 0 {
			pl[i] = math.Inf(-1) // an empty split
		}
	}
	for j := 0; j < s; j++ { // the last row sees no token at all
		pl[(n-1)*s+j] = math.Inf(-1)
	}
	for j := 0; j < s*g.latent; j++ {
		if math.IsInf(pl[(n-1)*s+j/g.latent], -1) {
			po[(n-1)*s*g.latent+j] = 0
		}
	}
	return map[string]*tensor.Tensor{
		"partial_out": tensor.FromFloat64s(tensor.F32, []int{n, s, g.latent}, po),
		"partial_lse": tensor.FromFloat64s(tensor.F32, []int{n, s}, pl),
	}, nil
}

func (b *builder) dsaIndexer() (map[string]*tensor.Tensor, error) {
	g, err := b.c.geometry()
	if err != nil {
		return nil, err
	}
	const hi, dim = 64, 128
	heads := hi
	if b.c.Heads > 0 {
		heads = b.c.Heads
	}
	pg := b.paging(g.seqLens, g.page)
	k := tensor.New(tensor.BF16, pg.nb, g.page, dim)
	for i := 0; i < k.Len(); i++ {
		k.SetFloat64(i, b.r.normal())
	}
	q := make([]float64, g.batch*heads*dim)
	for i := range q {
		q[i] = formats.RoundBF16(b.r.normal())
	}
	w := make([]float64, g.batch*heads)
	for i := range w {
		w[i] = b.r.normal() * 0.1
	}
	ts := b.common(g, pg)
	ts["q"] = bf16([]int{g.batch, heads, dim}, q)
	ts["k_cache"] = k
	ts["weights"] = tensor.FromFloat64s(tensor.F32, []int{g.batch, heads}, w)
	return ts, nil
}
