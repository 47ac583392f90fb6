package kernel

import (
	"context"
	"fmt"

	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/kvcache"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// kv_cache_write and kv_cache_gather (reference/CONTRACTS.md §3.4, §3.5): the contract tensors
// and parameters adapted to reference/kvcache.

var (
	cacheDTypes = []tensor.DType{tensor.BF16, tensor.U8, tensor.F8E4M3}
	indexDTypes = []tensor.DType{tensor.I32, tensor.I64}
)

func init() {
	Register(&Kernel{
		Name:    "kv_cache_write",
		Stage:   StageCache,
		Summary: "paged MLA latent cache write (vLLM concat_and_cache_mla, DeepSeek-V3.2 fp8_ds_mla)",
		Inputs: []TensorSpec{
			{Name: "kv_c", DTypes: []tensor.DType{tensor.BF16}},
			{Name: "k_pe", DTypes: []tensor.DType{tensor.BF16}},
			{Name: "slot_mapping", DTypes: indexDTypes},
			{Name: "cache_before", DTypes: cacheDTypes, Read: readsNothing},
			{Name: "k_scale", DTypes: []tensor.DType{tensor.F32}, Optional: true},
		},
		Outputs:   []TensorSpec{{Name: "cache_after", DTypes: cacheDTypes}},
		Reference: kvCacheWrite,
	})
	Register(&Kernel{
		Name:    "kv_cache_gather",
		Stage:   StageCache,
		Summary: "paged latent cache lookup and dequantization (vLLM gather_and_maybe_dequant_cache)",
		Inputs: []TensorSpec{
			{Name: "cache", DTypes: cacheDTypes, Read: attendedRows("cache")},
			{Name: "block_table", DTypes: indexDTypes},
			{Name: "seq_lens", DTypes: indexDTypes},
			{Name: "k_scale", DTypes: []tensor.DType{tensor.F32}, Optional: true},
		},
		Outputs:   []TensorSpec{{Name: "gathered", DTypes: []tensor.DType{tensor.BF16, tensor.F32}}},
		Reference: kvCacheGather,
	})
}

// readsNothing is the Read of an input whose values the kernel never reads
// as numbers: a writer's cache_before, whose entries it either overwrites
// or leaves byte for byte as they were.
func readsNothing(Inputs) (func(int) bool, error) { return func(int) bool { return false }, nil }

// attendedRows is the Read of a paged cache [NB, P, entry]: the entries of
// token t < seq_lens[b] of every request b, at block_table[b, t/P], t%P.
func attendedRows(cache string) func(Inputs) (func(int) bool, error) {
	return func(in Inputs) (func(int) bool, error) {
		ct, bt, sl := in.Tensors[cache], in.Tensors["block_table"], in.Tensors["seq_lens"]
		if ct == nil || bt == nil || sl == nil || len(ct.Shape) != 3 {
			return nil, fmt.Errorf("tensors %s, block_table or seq_lens missing or misshapen", cache)
		}
		pages, err := kvcache.NewPages(bt, sl, ct.Shape[1], ct.Shape[0])
		if err != nil {
			return nil, err
		}
		read := make([]bool, ct.Shape[0]*ct.Shape[1])
		for b, n := range pages.SeqLens {
			for t := 0; t < n; t++ {
				blk, off := pages.Locate(b, t)
				read[blk*ct.Shape[1]+off] = true
			}
		}
		return rowsRead(read, ct.Shape[2]), nil
	}
}

// rowsRead turns a set of cache entries (rows of width elements) into a
// Read.
func rowsRead(rows []bool, width int) func(int) bool {
	return func(i int) bool { r := i / max(width, 1); return r < len(rows) && rows[r] }
}

// cacheLayout reads kv_cache_dtype, page_size and ds_mla_scale for a cache
// tensor; page_size defaults to the cache's second dimension. l and r are the
// latent and rope widths (fp8_ds_mla's are fixed).
func cacheLayout(p Params, prec Precision, name string, cache *tensor.Tensor, l, r int) (kvcache.Layout, error) {
	kind, err := p.Enum("kv_cache_dtype", string(kvcache.BF16), kvcache.Kinds...)
	if err != nil {
		return kvcache.Layout{}, err
	}
	conv, err := p.Enum("ds_mla_scale", string(kvcache.ScaleAmax), kvcache.ScaleConventions...)
	if err != nil {
		return kvcache.Layout{}, err
	}
	if len(cache.Shape) != 3 {
		return kvcache.Layout{}, fmt.Errorf("tensor %s has shape %v; the contract wants [NB, P, entry]", name, cache.Shape)
	}
	ps, err := p.Int("page_size", cache.Shape[1])
	if err != nil {
		return kvcache.Layout{}, err
	}
	if kvcache.Kind(kind) == kvcache.FP8DSMLA {
		l, r = kvcache.DSLatent, kvcache.DSRope
	}
	lay := kvcache.Layout{Kind: kvcache.Kind(kind), L: l, R: r, PageSize: ps,
		DSScale: kvcache.ScaleConvention(conv), Saturate: prec.FP8Saturate}
	return lay, lay.Validate()
}

// kScale returns k_scale when the layout has one (an error naming it when it
// is missing or unusable), else 0.
func kScale(in Inputs, lay kvcache.Layout) (float64, error) {
	if !lay.NeedsKScale() {
		return 0, nil
	}
	t, err := Need(in, "k_scale", tensor.F32)
	if err != nil {
		return 0, fmt.Errorf("%v (kv_cache_dtype %s divides by it)", err, lay.Kind)
	}
	v, err := t.Scalar()
	if err != nil {
		return 0, fmt.Errorf("tensor k_scale: %v", err)
	}
	return v, kvcache.CheckKScale(v)
}

// asDType views t's bytes as dtype d (U8 and F8_E4M3 caches are the same
// bytes), when the layout allows d.
func asDType(name string, t *tensor.Tensor, d tensor.DType, lay kvcache.Layout) (*tensor.Tensor, error) {
	if d == "" || d == t.DType {
		return t, nil
	}
	for _, ok := range lay.CacheDTypes() {
		if ok == d && d.Size() == t.DType.Size() {
			return &tensor.Tensor{DType: d, Shape: t.Shape, Data: t.Data}, nil
		}
	}
	return nil, fmt.Errorf("tensor %s has dtype %s but the cache it is written over is %s (kv_cache_dtype %s)", name, d, t.DType, lay.Kind)
}

func kvCacheWrite(ctx context.Context, in Inputs, prec Precision, outDTypes map[string]tensor.DType) ([]Output, error) {
	kvc := in.Tensors["kv_c"]
	kpe := in.Tensors["k_pe"]
	sm := in.Tensors["slot_mapping"]
	before := in.Tensors["cache_before"]
	if err := CheckShape("kv_c", kvc, -1, -1); err != nil {
		return nil, err
	}
	if err := CheckShape("k_pe", kpe, -1, -1); err != nil {
		return nil, err
	}
	if err := CheckShape("slot_mapping", sm, -1); err != nil {
		return nil, err
	}
	lay, err := cacheLayout(in.Params, prec, "cache_before", before, kvc.Shape[1], kpe.Shape[1])
	if err != nil {
		return nil, err
	}
	ks, err := kScale(in, lay)
	if err != nil {
		return nil, err
	}
	if before, err = asDType("cache_after", before, outDTypes["cache_after"], lay); err != nil {
		return nil, err
	}
	slots := make([]int64, sm.Len())
	for i := range slots {
		slots[i] = sm.Int64At(i)
	}
	ov, err := kvcache.NewOverlay(before, kvc, kpe, slots, lay, ks)
	if err != nil {
		return nil, err
	}
	derived := func(idx []int) []Coord {
		part, tile := lay.PartOf(idx[2])
		c := []Coord{{"part", int(part)}, {"token", ov.TokenAt(idx[0]*lay.PageSize + idx[1])}}
		if lay.Kind == kvcache.FP8DSMLA {
			c = append(c, Coord{"tile128", tile})
		}
		return c
	}
	return []Output{{
		Name:       "cache_after",
		Shape:      append([]int(nil), before.Shape...),
		DType:      before.DType,
		Exact:      newCacheAfter(ov, true),
		Expected:   newCacheAfter(ov, false),
		Mode:       Bitwise,
		Equivalent: ov.Equivalent,
		Reduction:  1,
		Coords:     Coords{Axes: []string{"block", "page_offset", "column"}, Derived: derived},
	}}, nil
}

// cacheAfter is kv_cache_write's cache_after as Values: cache_before's
// values where no token was written, and the written entries computed from
// their tokens on demand, an entry at a time (the last one kept), so that
// the whole cache is never copied, let alone widened to float64.
type cacheAfter struct {
	ov    *kvcache.Overlay
	exact bool
	e     int // values an entry
	// slot is the entry last read and k its index among the written ones
	// (-1: not written, read from cache_before); entry holds its bytes.
	slot, k int
	entry   *tensor.Tensor
}

func newCacheAfter(ov *kvcache.Overlay, exact bool) *cacheAfter {
	e := ov.Layout.EntrySize()
	return &cacheAfter{ov: ov, exact: exact, e: e, slot: -1, k: -1,
		entry: &tensor.Tensor{DType: ov.Before.DType, Shape: []int{e}, Data: make([]byte, ov.EntryBytes())}}
}

// Fork implements Forker.
func (c *cacheAfter) Fork() Values { return newCacheAfter(c.ov, c.exact) }

// Len implements Values.
func (c *cacheAfter) Len() int { return c.ov.Before.Len() }

// At implements Values.
func (c *cacheAfter) At(i int) float64 {
	if slot := i / c.e; slot != c.slot {
		c.slot, c.k = slot, c.ov.Find(slot)
		if c.k >= 0 {
			c.ov.EntryInto(c.k, c.exact, c.entry.Data)
		}
	}
	if c.k < 0 {
		return c.ov.Before.Float64At(i)
	}
	return c.entry.Float64At(i - c.slot*c.e)
}

func kvCacheGather(ctx context.Context, in Inputs, prec Precision, outDTypes map[string]tensor.DType) ([]Output, error) {
	ct := in.Tensors["cache"]
	bt := in.Tensors["block_table"]
	sl := in.Tensors["seq_lens"]
	if len(ct.Shape) != 3 {
		return nil, fmt.Errorf("tensor cache has shape %v; the contract wants [NB, P, entry]", ct.Shape)
	}
	// Only fp8_ds_mla fixes L and R; the others read D = L + R values the
	// same way whatever the split, which only names the "part" coordinate:
	// take DeepSeek's R = 64 where the entry is wide enough.
	d := ct.Shape[2]
	r := 0
	if d > 64 {
		r = 64
	}
	lay, err := cacheLayout(in.Params, prec, "cache", ct, d-r, r)
	if err != nil {
		return nil, err
	}
	ks, err := kScale(in, lay)
	if err != nil {
		return nil, err
	}
	c, err := kvcache.New(ct, lay, ks)
	if err != nil {
		return nil, err
	}
	pages, err := kvcache.NewPages(bt, sl, lay.PageSize, c.NB)
	if err != nil {
		return nil, err
	}
	out := outDTypes["gathered"]
	if out == "" {
		out = tensor.BF16
	}
	if out != tensor.BF16 && out != tensor.F32 {
		return nil, fmt.Errorf("tensor gathered has dtype %s; the contract wants BF16 or F32", out)
	}
	// vLLM dequantizes to fp32 (e4m3 * scale) and stores in the output dtype.
	exact := newGathered(c, pages, tensor.F64, false)
	expected := newGathered(c, pages, tensor.F32, out == tensor.BF16)
	dd := lay.D()
	derived := func(idx []int) []Coord {
		b, t := pages.Request(idx[0])
		blk, off := pages.Locate(b, t)
		part := kvcache.PartLatent // a value index here, not an entry column
		if idx[1] >= lay.L {
			part = kvcache.PartRope
		}
		return []Coord{{"request", b}, {"token", t}, {"page", t / lay.PageSize}, {"page_offset", off},
			{"block", blk}, {"part", int(part)}}
	}
	return []Output{{
		Name:      "gathered",
		Shape:     []int{pages.Total(), dd},
		DType:     out,
		Exact:     exact,
		Expected:  expected,
		Mode:      Numeric,
		Reduction: 1,
		Coords:    Coords{Axes: []string{"row", "dim"}, Derived: derived},
	}}, nil
}

// gathered is kv_cache_gather's output as Values: row CuSeqLens[b]+t is
// request b's token t, dequantized from the cache on demand a row at a time
// (the last one kept), so that a gather of a whole cache holds one row
// rather than two float64 copies of the cache.
type gathered struct {
	c     *kvcache.Cache
	pages *kvcache.Pages
	deq   tensor.DType
	// roundBF16: the values are stored rounded to bf16 (a BF16 output).
	roundBF16 bool
	row       int // the row buf holds (-1: none)
	buf       []float64
}

func newGathered(c *kvcache.Cache, pages *kvcache.Pages, deq tensor.DType, roundBF16 bool) *gathered {
	return &gathered{c: c, pages: pages, deq: deq, roundBF16: roundBF16, row: -1, buf: make([]float64, c.D())}
}

// Fork implements Forker.
func (g *gathered) Fork() Values { return newGathered(g.c, g.pages, g.deq, g.roundBF16) }

// Len implements Values.
func (g *gathered) Len() int { return g.pages.Total() * len(g.buf) }

// At implements Values.
func (g *gathered) At(i int) float64 {
	d := len(g.buf)
	if r := i / d; r != g.row {
		blk, off := g.pages.Locate(g.pages.Request(r))
		g.c.Row(blk, off, g.buf, g.deq)
		if g.roundBF16 {
			for j, v := range g.buf {
				g.buf[j] = formats.RoundBF16(v)
			}
		}
		g.row = r
	}
	return g.buf[i%d]
}
