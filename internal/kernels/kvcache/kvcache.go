// Package kvcache is kv_cache_write and kv_cache_gather (reference/CONTRACTS.md §3.4, §3.5), the paged MLA latent cache's writer and reader: the contract, the validated
// problems (WriteProblem, GatherProblem) that the reference and the CUDA
// launchers take, the reference adapter over reference/kvcache, the coordinates that name an output element, and what the
// tools ask of each kernel (cost, case inputs, slicing, contexts,
// roofline).
//
// The family is written in the framework's vocabulary, dot-imported: its
// code reads as it did inside internal/kernel, where it was born.
package kvcache

import (
	"context"
	"encoding/binary"
	"fmt"
	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/kernels/paged"
	"math"

	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/kvcache"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// kv_cache_write and kv_cache_gather (reference/CONTRACTS.md §3.4, §3.5): the contract tensors
// and parameters adapted to reference/kvcache.

// write is kv_cache_write.
type write struct{ spec Spec }

// gather is kv_cache_gather.
type gather struct{ spec Spec }

var (
	// tokenDTypes are the dtypes of a write's kv_c and k_pe.
	tokenDTypes = []tensor.DType{tensor.BF16, tensor.F16, tensor.F32}
	// gatheredDTypes are those of a gather's dst (vLLM's dst is the model
	// dtype or fp32: vllm/_custom_ops.py@0002bde5 gather_and_maybe_dequant_cache).
	gatheredDTypes = []tensor.DType{tensor.BF16, tensor.F16, tensor.F32}
)

func init() {
	Register(&write{Spec{
		Name:    "kv_cache_write",
		Stage:   StageCache,
		Summary: "paged MLA latent cache write (vLLM concat_and_cache_mla, DeepSeek-V3.2 fp8_ds_mla, DeepSeek-V4 fp8_ds_mla_model1)",
		Inputs: []TensorSpec{
			// An fp16 model's tokens are F16, and an engine may write bf16
			// tokens into an fp16 cache (reference/CONTRACTS.md §3.4).
			{Name: "kv_c", DTypes: tokenDTypes},
			{Name: "k_pe", DTypes: tokenDTypes},
			{Name: "slot_mapping", DTypes: paged.IndexDTypes},
			{Name: "cache_before", DTypes: paged.CacheDTypes, Read: paged.ReadsNothing},
			{Name: "k_scale", DTypes: []tensor.DType{tensor.F32}, Optional: true},
		},
		Outputs: []TensorSpec{{Name: "cache_after", DTypes: paged.CacheDTypes}},
		Params: []ParamSpec{
			paged.CacheDTypeParam, paged.DSMLAScaleParam, paged.PageSizeParam,
		},
	}})
	Register(&gather{Spec{
		Name:    "kv_cache_gather",
		Stage:   StageCache,
		Summary: "paged latent cache lookup and dequantization (vLLM gather_and_maybe_dequant_cache)",
		Inputs: []TensorSpec{
			{Name: "cache", DTypes: paged.CacheDTypes, Read: gatheredRows},
			{Name: "block_table", DTypes: paged.IndexDTypes},
			{Name: "seq_lens", DTypes: paged.IndexDTypes},
			{Name: "k_scale", DTypes: []tensor.DType{tensor.F32}, Optional: true},
			// vLLM's chunked context gather (mla_attention.py passes each
			// chunk's per-request context offset): request b's rows are its
			// tokens seq_starts[b] .. seq_starts[b]+seq_lens[b]-1.
			{Name: "seq_starts", DTypes: paged.IndexDTypes, Optional: true},
		},
		// A U8 gathered is a byte copy of the entries (vLLM's
		// cp_gather_cache over an fp8 cache), judged bit for bit.
		Outputs: []TensorSpec{{Name: "gathered", DTypes: append(append([]tensor.DType(nil), gatheredDTypes...), tensor.U8)}},
		Params: []ParamSpec{
			paged.CacheDTypeParam, paged.DSMLAScaleParam, paged.PageSizeParam,
		},
	}})
}

// Spec implements Kernel.
func (k *write) Spec() *Spec { return &k.spec }

// Spec implements Kernel.
func (k *gather) Spec() *Spec { return &k.spec }

// WriteProblem is a validated kv_cache_write: T' token rows of kv_c
// [T', L] and k_pe [T', R], the slots the first T = len(Slots) of them go
// to (a negative slot skips its token), over cache_before in Layout.
type WriteProblem struct {
	in Inputs
	// KVC, KPE, SlotMapping and Before are the contract tensors.
	KVC, KPE, SlotMapping, Before *tensor.Tensor
	// Layout is the cache's; its Saturate is what the parameters declare,
	// and the reference applies the precision it is called at.
	Layout kvcache.Layout
	// KScale is fp8_e4m3's per-tensor scale (0 for the other layouts).
	KScale float64
	Slots  []int64
	ov     *kvcache.Overlay
}

// Inputs implements Problem.
func (p *WriteProblem) Inputs() Inputs { return p.in }

// Validate implements Kernel.
func (*write) Validate(in Inputs) (Problem, error) {
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
	prec, err := PrecisionFrom(in.Params)
	if err != nil {
		return nil, err
	}
	lay, err := paged.CacheLayout(in.Params, prec, "cache_before", before, kvc.Shape[1], kpe.Shape[1])
	if err != nil {
		return nil, err
	}
	ks, err := paged.KScale(in, lay)
	if err != nil {
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
	return &WriteProblem{in: in, KVC: kvc, KPE: kpe, SlotMapping: sm, Before: before, Layout: lay, KScale: ks, Slots: slots, ov: ov}, nil
}

// Reference implements Kernel. cache_after's dtype is checked here, after
// the inputs: only the call knows it.
func (*write) Reference(ctx context.Context, pr Problem, prec Precision, outDTypes OutDTypes) ([]Output, error) {
	p := pr.(*WriteProblem)
	kvc, kpe := p.KVC, p.KPE
	lay := p.Layout
	lay.Saturate = prec.FP8Saturate
	before, err := paged.AsDType("cache_after", p.Before, outDTypes["cache_after"], lay)
	if err != nil {
		return nil, err
	}
	// The problem's overlay over the bytes as the output's dtype reads
	// them, at the call's precision; the rest it shares, read-only.
	ovc := *p.ov
	ovc.Layout, ovc.Before = lay, before
	ov := &ovc
	derived := func(dst []Coord, idx []int) []Coord {
		// the entry an element belongs to: its own row, except in a
		// block-split cache, whose [block, offset] rows are not entries
		slot, col := lay.Entry((idx[0]*lay.PageSize+idx[1])*lay.EntrySize() + idx[2])
		part, tile := lay.PartOf(col)
		c := append(dst, Coord{Kind: KindPart, Value: int(part)}, Coord{Kind: KindToken, Value: ov.TokenAt(slot)})
		if lay.Kind == kvcache.FP8DSMLA {
			c = append(c, Coord{Kind: KindTile128, Value: tile})
		}
		return c
	}
	return []Output{{
		Name:       "cache_after",
		Shape:      append([]int(nil), before.Shape...),
		DType:      before.DType,
		Exact:      newCacheAfter(ov, true).copying(kvc, kpe),
		Expected:   newCacheAfter(ov, false).copying(kvc, kpe),
		Mode:       Bitwise,
		Equivalent: ov.Equivalent,
		// Overlay.Equivalent reads the overlay and the inputs only
		EquivalentConcurrent: true,
		Reduction:            1,
		Coords:               Coords{Axes: []CoordKind{KindBlock, KindPageOffset, KindColumn}, Derived: derived},
		Before:               TensorValues{T: before},
		Suspects:             writeSuspects(ov),
	}}, nil
}

// writeSuspects is, for a DeepSeek-V4.1 write, the cache a writer of
// FlashMLA's pre-2026.09.30 block-split V4.1 order leaves
// (kvcache.Layout.OldV41Offset): the same bytes a token, so no shape check
// catches it, and a reader of today's interleaved order misreads every
// token but block offset 0's data. Pages of one token are the same bytes
// in both orders.
func writeSuspects(ov *kvcache.Overlay) []Suspect {
	if ov.Layout.Kind != kvcache.FP8DSMLAV41 || ov.Layout.PageSize < 2 {
		return nil
	}
	c := newCacheAfter(ov, false)
	c.entryOf, c.runs = ov.Layout.OldV41Entry, false
	return []Suspect{{Pattern: "v41_written_block_split", Values: c,
		Detail: "a writer of the block-split V4.1 order FlashMLA used before its 2026.09.30 release (a page's data rows, then its scale rows)"}}
}

// cacheAfter is kv_cache_write's cache_after as Values: cache_before's
// values where no token was written, and the written entries computed from
// their tokens on demand, an entry at a time (the last one kept), so that
// the whole cache is never copied, let alone widened to float64. The exact
// values of a float layout's written entries are the tokens' own, before
// the cache's rounding (Overlay.ExactValue): a token an fp16 cache rounds
// to inf is finite there, which is how Compare tells an overflow.
type cacheAfter struct {
	ov    *kvcache.Overlay
	exact bool
	e     int // values an entry
	// slot is the entry last read and k its index among the written ones
	// (-1: not written, read from cache_before); entry holds its bytes.
	slot, k int
	entry   *tensor.Tensor
	// entryOf places element i in an entry: the layout's Entry, or another
	// order for a suspect's cache; runs says whether entries are runs of
	// e elements in that order (ReadBlock copies whole runs then).
	entryOf func(i int) (slot, col int)
	runs    bool
	// kvc and kpe are the tokens when a written entry is a copy of them
	// (copying), else nil.
	kvc, kpe *tensor.Tensor
}

// copying makes c vouch for written entries too (kernel.Settler) where
// they are the tokens' bytes: a bf16 or fp16 cache written from tokens of
// its own dtype, which Overlay.floatBits copies bit for bit and whose
// exact values (Overlay.ExactValue) are the tokens' values, decoded from
// the same bits.
func (c *cacheAfter) copying(kvc, kpe *tensor.Tensor) *cacheAfter {
	if d := c.ov.Before.DType; c.runs && c.ov.Layout.Kind.IsFloat() && kvc.DType == d && kpe.DType == d {
		c.kvc, c.kpe = kvc, kpe
	}
	return c
}

func newCacheAfter(ov *kvcache.Overlay, exact bool) *cacheAfter {
	e := ov.Layout.EntrySize()
	return &cacheAfter{ov: ov, exact: exact, e: e, slot: -1, k: -1, entryOf: ov.Layout.Entry, runs: !ov.Layout.Kind.BlockSplit(),
		entry: &tensor.Tensor{DType: ov.Before.DType, Shape: []int{e}, Data: make([]byte, ov.EntryBytes())}}
}

// Fork implements Forker.
func (c *cacheAfter) Fork() Values {
	f := newCacheAfter(c.ov, c.exact)
	f.entryOf, f.runs = c.entryOf, c.runs
	f.kvc, f.kpe = c.kvc, c.kpe
	return f
}

// load makes slot the entry c keeps: k its index among the written ones
// (-1: not written) and, when written, entry its bytes.
func (c *cacheAfter) load(slot int) {
	if slot != c.slot {
		c.slot, c.k = slot, c.ov.Find(slot)
		if c.k >= 0 {
			c.ov.EntryInto(c.k, c.exact, c.entry.Data)
		}
	}
}

// Len implements Values.
func (c *cacheAfter) Len() int { return c.ov.Before.Len() }

// At implements Values.
func (c *cacheAfter) At(i int) float64 {
	slot, col := c.entryOf(i)
	c.load(slot)
	if c.k < 0 {
		return c.ov.Before.Float64At(i)
	}
	if c.exact {
		if v, ok := c.ov.ExactValue(c.k, col); ok {
			return v
		}
	}
	return c.entry.Float64At(col)
}

// ReadBlock implements kernel.BlockReader: an entry at a time, copied (an
// element at a time for a block-split cache, whose entries are not runs).
func (c *cacheAfter) ReadBlock(lo int, dst []float64) {
	if !c.runs {
		for j := range dst {
			dst[j] = c.At(lo + j)
		}
		return
	}
	for len(dst) > 0 {
		slot := lo / c.e
		in := lo - slot*c.e
		n := min(len(dst), c.e-in)
		c.load(slot)
		switch {
		case c.k < 0:
			c.ov.Before.RowInto(dst[:n], lo, n)
		default:
			c.entry.RowInto(dst[:n], in, n)
			if c.exact { // the tokens' own values, as At reads them
				for j := range dst[:n] {
					if v, ok := c.ov.ExactValue(c.k, in+j); ok {
						dst[j] = v
					}
				}
			}
		}
		lo, dst = lo+n, dst[n:]
	}
}

// Settled implements kernel.Settler: a run of entries no token was written
// to is cache_before's bytes, exactly and as expected alike (a write leaves
// them as they were: Overlay), so the run is vouched for by those bytes,
// not copied. A written entry is vouched for only where it is a copy of
// its token (copying): its kv_c part by the token's kv_c row, its k_pe
// part by its k_pe row; otherwise its bytes are computed (fp8 codes, or a
// rounding to the cache's dtype) and it is not. Runs of unwritten entries
// end at the next written one. Where entries are not runs (DeepSeek-V4's
// block-split fp8_ds_mla_model1, Layout.Entry, or a suspect's other
// order: entryOf) a block's bytes interleave its tokens' parts, so the
// unit is a whole block, vouched for when none of its slots was written.
// A written entry of a byte layout is vouched for by the bytes it is
// computed to (settledEntry), in the entry c keeps for At: both sides
// compute theirs, and a check takes it in bulk where the actual's bytes
// equal both.
func (c *cacheAfter) Settled(lo, n int) (tensor.DType, []byte, int) {
	d := c.ov.Before.DType
	sz := d.Size()
	unit, per := c.e, 1 // elements and slots a unit
	if !c.runs {
		per = c.ov.Layout.PageSize
		unit = per * c.e
	}
	u := lo / unit
	m := min(n, (u+1)*unit-lo)
	if c.unwritten(u, per) {
		for m < n && c.unwritten((lo+m)/unit, per) {
			m = min(n, m+unit)
		}
		return d, c.ov.Before.Data[lo*sz : (lo+m)*sz], m
	}
	if per > 1 {
		for m < n && !c.unwritten((lo+m)/unit, per) {
			m = min(n, m+unit)
		}
		return "", nil, m
	}
	if c.kvc == nil {
		return c.settledEntry(u, lo-u*c.e, m)
	}
	slot := u
	t, col, l := c.ov.TokenAt(slot), lo-slot*c.e, c.ov.Layout.L
	if col < l {
		m = min(n, l-col)
		at := t*l + col
		return d, c.kvc.Data[at*sz : (at+m)*sz], m
	}
	r := c.ov.Layout.R
	at := t*r + col - l
	return d, c.kpe.Data[at*sz : (at+m)*sz], m
}

// settledEntry is Settled over columns [in, in+m) of written entry slot
// of a byte layout (fp8_e4m3, fp8_ds_mla: a U8 or F8_E4M3 cache_after):
// its bytes as EntryInto computes them, which At decodes one by one (the
// exact side's too: a byte layout's exact entry is its exactly divided
// codes, never the tokens' values), from the entry c keeps. A float
// layout's entry rounded from other tokens is not vouched for: its exact
// values are the tokens' (Overlay.ExactValue).
func (c *cacheAfter) settledEntry(slot, in, m int) (tensor.DType, []byte, int) {
	if c.ov.Layout.Kind.IsFloat() {
		return "", nil, m
	}
	c.load(slot)
	sz := c.entry.DType.Size()
	return c.entry.DType, c.entry.Data[in*sz : (in+m)*sz], m
}

// unwritten reports whether no token was written to the per slots of unit u.
func (c *cacheAfter) unwritten(u, per int) bool {
	for s := u * per; s < (u+1)*per; s++ {
		if c.ov.Find(s) >= 0 {
			return false
		}
	}
	return true
}

// GatherProblem is a validated kv_cache_gather: a cache of NB blocks of P
// entries in Layout, and the requests' tokens to gather (a chunked
// gather's block table already starts at each chunk: Chunked). A gather
// has two readings, which only the output's dtype chooses: a dequantizing
// one (Dequant) and, into a U8 gathered, a byte copy (ByteCopy), which
// reads no k_scale. Validate checks both: it refuses inputs whose first
// error is both readings' (a block table that leaves the cache), and keeps
// an error of one reading only for its method to return.
type GatherProblem struct {
	in Inputs
	// Cache, BlockTable and SeqLens are the tensors the gather reads;
	// BlockTable is a chunked gather's table from each chunk on.
	Cache, BlockTable, SeqLens *tensor.Tensor
	Layout                     kvcache.Layout
	NB, P                      int

	dequant  *GatherDequant
	deqErr   error
	bytes    *kvcache.Pages
	bytesErr error
}

// GatherDequant is the dequantizing reading of a gather: the cache view
// over k_scale and the requests' pages.
type GatherDequant struct {
	KScale float64
	Cache  *kvcache.Cache
	Pages  *kvcache.Pages
}

// Inputs implements Problem.
func (p *GatherProblem) Inputs() Inputs { return p.in }

// Dequant returns the dequantizing reading, or why these inputs have none
// (a missing k_scale, a cache that is not of the layout, a block table
// that leaves it).
func (p *GatherProblem) Dequant() (*GatherDequant, error) { return p.dequant, p.deqErr }

// ByteCopy returns the requests' pages for a byte-copy gather (a U8
// gathered), or why these inputs have none.
func (p *GatherProblem) ByteCopy() (*kvcache.Pages, error) { return p.bytes, p.bytesErr }

// Validate implements Kernel.
func (*gather) Validate(orig Inputs) (Problem, error) {
	in, err := Chunked(orig)
	if err != nil {
		return nil, err
	}
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
	prec, err := PrecisionFrom(in.Params)
	if err != nil {
		return nil, err
	}
	lay, err := paged.CacheLayout(in.Params, prec, "cache", ct, d-r, r)
	if err != nil {
		return nil, err
	}
	if err := paged.RefuseV4("kv_cache_gather", lay); err != nil {
		return nil, err
	}
	p := &GatherProblem{in: orig, Cache: ct, BlockTable: bt, SeqLens: sl, Layout: lay, NB: ct.Shape[0], P: lay.PageSize}
	// One block table read serves both readings (the same arguments);
	// each reports its errors in its own order.
	pages, pagesErr := kvcache.NewPages(bt, sl, lay.PageSize, ct.Shape[0])
	switch {
	case ct.DType.Size() == 0:
		p.bytesErr = fmt.Errorf("tensor cache has dtype %s, which has no byte size", ct.DType)
	case pagesErr != nil:
		p.bytesErr = pagesErr
	case ct.Shape[1] != lay.PageSize:
		p.bytesErr = fmt.Errorf("tensor cache has %d tokens a block; page_size is %d", ct.Shape[1], lay.PageSize)
	default:
		p.bytes = pages
	}
	ks, err := paged.KScale(in, lay)
	if err != nil {
		p.deqErr = err
		return p, nil
	}
	c, err := kvcache.New(ct, lay, ks)
	if err != nil {
		p.deqErr = err
		return p, nil
	}
	if pagesErr != nil {
		p.deqErr = pagesErr
		if p.bytesErr == pagesErr {
			// the first error of both readings: no output dtype escapes it
			return nil, pagesErr
		}
		return p, nil
	}
	p.dequant = &GatherDequant{KScale: ks, Cache: c, Pages: pages}
	return p, nil
}

// Reference implements Kernel: the byte copy for a U8 gathered, else the
// dequantizing gather at the output's dtype.
func (*gather) Reference(ctx context.Context, pr Problem, prec Precision, outDTypes OutDTypes) ([]Output, error) {
	p := pr.(*GatherProblem)
	ct, lay := p.Cache, p.Layout
	lay.Saturate = prec.FP8Saturate
	if outDTypes["gathered"] == tensor.U8 {
		pages, err := p.ByteCopy()
		if err != nil {
			return nil, err
		}
		return gatherBytes(ct, pages, lay), nil
	}
	dq, err := p.Dequant()
	if err != nil {
		return nil, err
	}
	c, pages := dq.Cache, dq.Pages
	// The default dst is the model's dtype: an fp16 cache's is F16.
	def := tensor.BF16
	if lay.Kind == kvcache.FP16 {
		def = tensor.F16
	}
	out, err := OutDType(outDTypes, "gathered", def, gatheredDTypes...)
	if err != nil {
		return nil, err
	}
	// vLLM dequantizes to fp32 (e4m3 * scale) and stores in the output dtype.
	exact := newGathered(c, pages, tensor.F64, tensor.F64)
	expected := newGathered(c, pages, tensor.F32, out)
	exact.settle(ct)
	expected.settle(ct)
	if codes := codeTableOf(c, out); codes != nil {
		exact.codes, expected.codes = codes, codes
	}
	dd := lay.D()
	derived := gatheredCoords(pages, lay.PageSize, func(col int) kvcache.Part {
		if col >= lay.L { // a value index here, not an entry column
			return kvcache.PartRope
		}
		return kvcache.PartLatent
	})
	return []Output{{
		Name:      "gathered",
		Shape:     []int{pages.Total(), dd},
		DType:     out,
		Exact:     exact,
		Expected:  expected,
		Mode:      Numeric,
		Reduction: 1,
		Coords:    Coords{Axes: []CoordKind{KindRow, KindDim}, Derived: derived},
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
	// out is the dtype the values are stored in: the output's (F32 leaves
	// the fp32 dequantization as it is, F64 is the exact answer).
	out tensor.DType
	row int // the row buf holds (-1: none)
	buf []float64
	// cache is the cache tensor when a row's values are its bytes' values
	// unchanged (settle), else nil.
	cache *tensor.Tensor
	// codes: an fp8_e4m3 cache with one per-tensor scale, whose rows are
	// settled through the table of each code's output code (codeTableOf);
	// cbuf holds the codes of the last row Settled returned.
	codes *codeTable
	cbuf  []byte
}

// codeTable is, for an fp8_e4m3 cache with one per-tensor scale gathered
// to a 16-bit dtype, the output code of every fp8 code's expected value
// (the fp32 product rounded to out, as At stores it) and whether that
// value is also, bit for bit, the exact product: a row whose codes are all
// such is its expected values' bytes, which both references vouch for (a
// scale of 1 or any power of two leaves every finite code so; a scale
// with more significant bits leaves few, and the rows are read as values).
type codeTable struct {
	out  tensor.DType
	code [256]uint16
	// bad[c] is 1 where code c's exact and expected values differ
	bad [256]byte
}

// codeTableOf returns c's code table for a gather to out, or nil where
// the cache's values are not one per code (kvcache.Cache.CodeValue), out
// is not a 16-bit float, or no code but the zeros keeps its exact value.
func codeTableOf(c *kvcache.Cache, out tensor.DType) *codeTable {
	if out != tensor.BF16 && out != tensor.F16 {
		return nil
	}
	t := &codeTable{out: out}
	kept := 0
	for code := 0; code < 256; code++ {
		x, ok1 := c.CodeValue(byte(code), tensor.F64)
		p, ok2 := c.CodeValue(byte(code), tensor.F32)
		if !ok1 || !ok2 {
			return nil
		}
		var e float64
		if out == tensor.BF16 {
			e = formats.RoundBF16(p)
			t.code[code] = formats.BF16Encode(float32(e))
		} else {
			e = formats.RoundFP16(p)
			t.code[code] = formats.FP16Encode(float32(e))
		}
		if !math.IsNaN(x) && !math.IsInf(x, 0) && math.Float64bits(x) == math.Float64bits(e) {
			if x != 0 {
				kept++
			}
		} else {
			t.bad[code] = 1
		}
	}
	if kept == 0 {
		return nil
	}
	return t
}

// settle makes g a kernel.Settler over the cache tensor t when every value
// it holds is the value of the cache's own bytes: for the bf16 and fp16
// layouts (one value of the cache's dtype a column, Cache.Row widens it
// exactly at every precision) stored as the cache's dtype, as F32 (exact:
// a 16-bit float widens to fp32 exactly) or F64 (the exact answer). A bf16
// cache gathered to F16 or the reverse is rounded (At), and fp8 values are
// products of a code and a scale: those are never settled.
func (g *gathered) settle(t *tensor.Tensor) {
	if k := g.c.Layout.Kind; k.IsFloat() && (g.out == t.DType || g.out == tensor.F32 || g.out == tensor.F64) {
		g.cache = t
	}
}

func newGathered(c *kvcache.Cache, pages *kvcache.Pages, deq, out tensor.DType) *gathered {
	return &gathered{c: c, pages: pages, deq: deq, out: out, row: -1, buf: make([]float64, c.D())}
}

// Fork implements Forker.
func (g *gathered) Fork() Values {
	f := newGathered(g.c, g.pages, g.deq, g.out)
	f.cache, f.codes = g.cache, g.codes
	return f
}

// Settled implements kernel.Settler where settle found the rows to be
// their bytes: a run of consecutive rows at consecutive slots (a request's
// tokens within one block) is one run of the cache's bytes, [NB, P, D]
// row-major (reference/kvcache's bf16 and fp16 layouts).
func (g *gathered) Settled(lo, n int) (tensor.DType, []byte, int) {
	d := len(g.buf)
	r := lo / d
	m := min(n, (r+1)*d-lo)
	if g.codes != nil {
		return g.settledCodes(r, lo-r*d, m)
	}
	if g.cache == nil {
		return "", nil, m
	}
	slot := g.slot(r)
	for k := 1; m < n && g.slot(r+k) == slot+k; k++ {
		m = min(n, m+d)
	}
	sz := g.cache.DType.Size()
	at := slot*d + lo - r*d
	return g.cache.DType, g.cache.Data[at*sz : (at+m)*sz], m
}

// settledCodes is Settled over an fp8_e4m3 row through g.codes: columns
// [in, in+m) of row r as the output's codes, in g's own buffer (valid
// until g's next Settled, as At's row is until its next At), or not
// settled when one of them is a code whose exact and expected values
// differ.
func (g *gathered) settledCodes(r, in, m int) (tensor.DType, []byte, int) {
	d := len(g.buf)
	at := g.slot(r)*d + in
	src := g.c.Entries()[at : at+m]
	if cap(g.cbuf) < 2*d {
		g.cbuf = make([]byte, 2*d)
	}
	dst := g.cbuf[:2*m]
	t := g.codes
	var bad byte
	for k, c := range src {
		bad |= t.bad[c]
		binary.LittleEndian.PutUint16(dst[2*k:], t.code[c])
	}
	if bad != 0 {
		return "", nil, m
	}
	return t.out, dst, m
}

// slot is the cache slot (block*P + offset) row r is read from.
func (g *gathered) slot(r int) int {
	blk, off := g.pages.Locate(g.pages.Request(r))
	return blk*g.c.Layout.PageSize + off
}

// Len implements Values.
func (g *gathered) Len() int { return g.pages.Total() * len(g.buf) }

// At implements Values.
func (g *gathered) At(i int) float64 {
	d := len(g.buf)
	if r := i / d; r != g.row {
		blk, off := g.pages.Locate(g.pages.Request(r))
		g.c.Row(blk, off, g.buf, g.deq)
		switch g.out {
		case tensor.BF16:
			for j, v := range g.buf {
				g.buf[j] = formats.RoundBF16(v)
			}
		case tensor.F16:
			for j, v := range g.buf {
				g.buf[j] = formats.RoundFP16(v)
			}
		}
		g.row = r
	}
	return g.buf[i%d]
}

// ReadBlock implements kernel.BlockReader: a row at a time, copied.
func (g *gathered) ReadBlock(lo int, dst []float64) {
	d := len(g.buf)
	for len(dst) > 0 {
		r := lo / d
		in := lo - r*d
		g.At(lo) // decodes row r into buf
		n := copy(dst, g.buf[in:])
		lo, dst = lo+n, dst[n:]
	}
}

// gatherBytes is kv_cache_gather with a U8 gathered: each request's entries
// copied as bytes, row CuSeqLens[b]+t holding the entry of request b's token
// t, its bytes as the cache stores them (vLLM's cp_gather_cache, a
// cp_gather_cache_page byte copy of any cache: vllm-project/vllm@00eb0c87
// csrc/libtorch_stable/cache_kernels.cu, vllm 0.33.0 _custom_ops.py
// cp_gather_cache). Nothing is dequantized, so no k_scale is read and the
// check is bitwise; the layout only names the coordinates.
func gatherBytes(ct *tensor.Tensor, pages *kvcache.Pages, lay kvcache.Layout) []Output {
	es := ct.DType.Size()
	entry := ct.Shape[2] * es
	raw := &entryBytes{data: ct.Data, pages: pages, entry: entry, page: lay.PageSize}
	derived := gatheredCoords(pages, lay.PageSize, func(col int) kvcache.Part {
		part, _ := lay.PartOf(col / es) // a byte of the entry's element col / es
		return part
	})
	return []Output{{
		Name:      "gathered",
		Shape:     []int{pages.Total(), entry},
		DType:     tensor.U8,
		Exact:     raw,
		Expected:  raw,
		Mode:      Bitwise,
		Reduction: 1,
		Coords:    Coords{Axes: []CoordKind{KindRow, KindDim}, Derived: derived},
	}}
}

// entryBytes is a byte-copy gather's answer as Values: byte j of row r is
// byte j of the cache entry that row copies. It holds no state, so it is
// its own fork.
type entryBytes struct {
	data        []byte
	pages       *kvcache.Pages
	entry, page int
}

// Fork implements Forker.
func (e *entryBytes) Fork() Values { return e }

// Len implements Values.
func (e *entryBytes) Len() int { return e.pages.Total() * e.entry }

// At implements Values.
func (e *entryBytes) At(i int) float64 {
	r, j := i/e.entry, i%e.entry
	blk, off := e.pages.Locate(e.pages.Request(r))
	return float64(e.data[(blk*e.page+off)*e.entry+j])
}

// gatheredCoords names a gathered element [row, col]: the request and token
// its row copies, where the cache holds it, and its column's part (partOf:
// the dequantized gather's columns are values, the byte copy's bytes).
func gatheredCoords(pages *kvcache.Pages, pageSize int, partOf func(col int) kvcache.Part) func([]Coord, []int) []Coord {
	return func(dst []Coord, idx []int) []Coord {
		b, t := pages.Request(idx[0])
		blk, off := pages.Locate(b, t)
		return append(dst, Coord{Kind: KindRequest, Value: b}, Coord{Kind: KindToken, Value: t}, Coord{Kind: KindPage, Value: t / pageSize}, Coord{Kind: KindPageOffset, Value: off},
			Coord{Kind: "block", Value: blk}, Coord{Kind: "part", Value: int(partOf(idx[1]))})
	}
}
