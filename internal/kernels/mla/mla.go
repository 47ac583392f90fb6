// Package mla is mla_decode and mla_decode_sparse (reference/CONTRACTS.md §3.6, §3.7), absorbed MLA decode attention over a paged latent cache: the contract, the validated
// problems (DecodeProblem, SparseProblem) that the reference and the CUDA
// launcher take, the reference adapter over reference/mla, the coordinates that name an output element, and what the
// tools ask of each kernel (cost, case inputs, slicing, contexts,
// roofline).
//
// The family is written in the framework's vocabulary, dot-imported: its
// code reads as it did inside internal/kernel, where it was born.
package mla

import (
	"context"
	"fmt"
	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/kernels/paged"
	"math"

	"github.com/kcheck-dev/kcheck/reference/kvcache"
	"github.com/kcheck-dev/kcheck/reference/mla"
	"github.com/kcheck-dev/kcheck/reference/splitk"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// mla_decode and mla_decode_sparse (reference/CONTRACTS.md §3.6, §3.7): the contract tensors and
// parameters adapted to reference/mla.
//
// Parameters beyond the spec's: `latent_dim` (L) for bf16 and fp8_e4m3
// caches whose D is not L + 64 (small test shapes; the default takes R = 64
// when D > 64, else L = D, as kv_cache_gather does); `num_splits` (S) asks
// for the split-K partials when neither captured partials nor a
// split_bounds tensor give S (a capture's partials give S by their shape,
// reference/CONTRACTS.md §3.6.1); `topk` for the sparse decode must agree with the indices
// tensor when given.
//
// Coordinates. out [B, s_q, H, L] is named request, q_pos, head, latent;
// lse [B, H, s_q] request, head, q_pos; partial_out [B, s_q, H, S, L]
// request, q_pos, head, split, latent; partial_lse likewise without latent.
// Attention reduces over tokens, which no output axis shows, so the derived
// coordinates carry what a token-side bug correlates with:
//   - context_len: the request's seq_len (sparse: the query's attended slots),
//     for "error grows with context length";
//   - visible: tokens this row attends (causal rows see fewer);
//   - last_page_fill: visible mod page_size, 0 when the row ends on a page
//     boundary, for "partial last page" bugs;
//   - head_tile: (q_pos·H + head) / 64, the 64-row tile of FlashMLA's
//     [s_q·H] query block, for "one head group" bugs;
//   - tile128: latent / 128, the fp8_ds_mla scale tile a value column falls in;
//   - split_start, split_len (partials): the split's token range.

const headTileRows = 64

// decode is mla_decode.
type decode struct{ spec Spec }

// sparseDecode is mla_decode_sparse.
type sparseDecode struct{ spec Spec }

func init() {
	qTypes := []tensor.DType{tensor.BF16, tensor.F16, tensor.F32}
	outTypes := []tensor.DType{tensor.BF16, tensor.F32, tensor.F16}
	// The lse and the partials may be stored in the query's dtype: vLLM's
	// TRITON_MLA returns lse in q.dtype (reference/CONTRACTS.md §8.2).
	lseTypes := []tensor.DType{tensor.F32, tensor.BF16, tensor.F16}
	Register(&decode{Spec{
		Name:    "mla_decode",
		Stage:   StageAttn,
		Summary: "absorbed MLA decode over a paged latent cache (FlashMLA layout), optional split-K partials",
		Inputs: []TensorSpec{
			{Name: "q", DTypes: qTypes},
			{Name: "kv_cache", DTypes: paged.CacheDTypes, Read: paged.AttendedRows("kv_cache")},
			{Name: "block_table", DTypes: paged.IndexDTypes},
			{Name: "seq_lens", DTypes: paged.IndexDTypes},
			{Name: "k_scale", DTypes: []tensor.DType{tensor.F32}, Optional: true},
			// FlashInfer's FP8 MLA scales (reference/CONTRACTS.md §3.6): see paged.ScaledCache.
			paged.KScaleRopeSpec, paged.KScaleTilesSpec,
			{Name: "split_bounds", DTypes: paged.IndexDTypes, Optional: true},
		},
		Outputs: []TensorSpec{
			{Name: "out", DTypes: outTypes},
			{Name: "lse", DTypes: lseTypes},
			{Name: "partial_out", DTypes: lseTypes, Optional: true, Rank: 5},
			{Name: "partial_lse", DTypes: lseTypes, Optional: true, Rank: 4},
		},
		Params: []ParamSpec{
			paged.CacheDTypeParam, paged.DSMLAScaleParam, paged.PageSizeParam, paged.KScaleDTypeParam,
			{Name: "softmax_scale", Kind: ParamFloat, Doc: "the scale of q·k (no default: the engines pass qk_head_dim^-0.5·mscale², 0.1352337788608801 for DeepSeek-V3)"},
			{Name: "causal", Kind: ParamBool, Default: "false", Doc: "a query of s_q > 1 tokens attends causally (query i sees the context up to its own position)"},
			{Name: "latent_dim", Kind: ParamInt, Doc: "L, for bf16 and fp8_e4m3 caches whose D is not L + 64 (default: D - 64 when D > 64, else D)"},
			{Name: "lse_base", Kind: ParamEnum, Default: "e", Allowed: []string{"e", "2"}, Doc: "the base the lse outputs are in"},
			{Name: "lse_empty", Kind: ParamEnum, Default: "-inf", Allowed: []string{"-inf", "+inf", "inf"}, Doc: "the lse of a row that sees no token"},
			{Name: "empty_row", Kind: ParamEnum, Default: "zero", Allowed: []string{"zero", "nan"}, Doc: "the out of a row that sees no token: zero (the contract), or nan, a stage 2 dividing its zero accumulator by its zero sum (vLLM's and SGLang's Triton decode; reference/CONTRACTS.md §3.6)"},
			{Name: "num_splits", Kind: ParamInt, Doc: "S, asking for the split-K partials; captured partials or split_bounds give it by their shape, and all that are given must agree (reference/CONTRACTS.md §3.6.1)"},
		},
	}})
	Register(&sparseDecode{Spec{
		Name:    "mla_decode_sparse",
		Stage:   StageAttn,
		Summary: "DeepSeek-V3.2 and V4 sparse MLA decode over top-k cache slots",
		Inputs: []TensorSpec{
			{Name: "q", DTypes: qTypes},
			{Name: "kv_cache", DTypes: paged.CacheDTypes, Read: indexedRows},
			{Name: "indices", DTypes: paged.IndexDTypes},
			{Name: "k_scale", DTypes: []tensor.DType{tensor.F32}, Optional: true},
			// FlashMLA's optional arguments (deepseek-ai/FlashMLA@9241ae3
			// flash_mla/flash_mla_interface.py:65-69, :90-93): see mla.Sparse.
			{Name: "topk_length", DTypes: paged.IndexDTypes, Optional: true},
			{Name: "attn_sink", DTypes: []tensor.DType{tensor.F32}, Optional: true},
			{Name: "extra_k_cache", DTypes: paged.CacheDTypes, Optional: true, Read: extraIndexedRows},
			{Name: "extra_indices_in_kvcache", DTypes: paged.IndexDTypes, Optional: true},
			{Name: "extra_topk_length", DTypes: paged.IndexDTypes, Optional: true},
		},
		Outputs: []TensorSpec{
			{Name: "out", DTypes: outTypes},
			{Name: "lse", DTypes: lseTypes},
		},
		Params: []ParamSpec{
			paged.CacheDTypeParam, paged.DSMLAScaleParam, paged.PageSizeParam,
			{Name: "softmax_scale", Kind: ParamFloat, Doc: "the scale of q·k (no default: the engines pass qk_head_dim^-0.5·mscale², 0.1352337788608801 for DeepSeek-V3)"},
			{Name: "causal", Kind: ParamBool, Default: "false", Doc: "a query of s_q > 1 tokens attends causally (query i sees the context up to its own position)"},
			{Name: "latent_dim", Kind: ParamInt, Doc: "L, for bf16 and fp8_e4m3 caches whose D is not L + 64 (default: D - 64 when D > 64, else D)"},
			{Name: "lse_base", Kind: ParamEnum, Default: "e", Allowed: []string{"e", "2"}, Doc: "the base the lse outputs are in"},
			{Name: "lse_empty", Kind: ParamEnum, Default: "-inf", Allowed: []string{"-inf", "+inf", "inf"}, Doc: "the lse of a row that sees no token"},
			{Name: "topk", Kind: ParamInt, Doc: "slots a query attends; when given it must equal the indices' last dimension, its default"},
			{Name: "invalid_index", Kind: ParamEnum, Default: invalidOutside, Allowed: []string{invalidOutside, invalidMinusOne},
				Doc: "which indices are not attended: outside (-1 or any slot outside the cache, reference/CONTRACTS.md §3.7) or minus_one (only -1, as FlashMLA: any other slot outside the cache is an input error, since FlashMLA would read it)"},
			{Name: "ds_mla_scale_read", Kind: ParamEnum, Default: string(kvcache.ScaleReadF32), Allowed: kvcache.ScaleReads,
				Doc: "how the reader turns each fp8_ds_mla tile scale into its factor: f32 (as stored), bf16 (rounded to nearest, FlashMLA sm90) or e8m0_rz (the power of two at or below it, FlashMLA sm100); both the exact and the expected reference read it so, and the result's notes give how far that moves the exact output from the f32 reading"},
			headDimVParam,
		},
	}})
}

// headDimVParam is V, FlashMLA's head_dim_v (flash_mla_interface.py:58,
// "Head_dim of v. Must be 512"): the leading columns of each cache row that
// are its value. DeepSeek-V3.2 attends 576-dim keys with 512-dim values
// (the latent part); DeepSeek-V4's 512-dim entry is key and value both,
// rope dims included (deepseek-ai/FlashMLA@9241ae3 csrc/api/sparse_decode.h:236
// d_v == 512 with :293 d_qk == 512 for MODEL1, tests/ref.py:90
// gathered_kv[..., :d_v]), so the default is D for fp8_ds_mla_model1 and L
// otherwise (and for fp8_ds_mla_v41, V4.1's cache of the same rows).
var headDimVParam = ParamSpec{Name: "head_dim_v", Kind: ParamInt,
	Doc: "V, the value width: out holds the first V columns of the attended rows (default L, the latent part; D, the whole entry, for the DeepSeek-V4 caches fp8_ds_mla_model1 and fp8_ds_mla_v41)"}

// The invalid_index conventions. FlashMLA's sparse decode masks only -1
// (deepseek-ai/FlashMLA@9241ae3 csrc/sm90/decode/sparse_fp8/splitkv_mla.cuh:632,
// csrc/sm100/decode/head64/kernel.cuh:701, tests/ref.py:71): any other
// slot it is given is read, so a caller's out-of-range index is a bad input
// there, not a masked one (audit F10). The contract masks any slot outside.
const (
	invalidOutside  = "outside"
	invalidMinusOne = "minus_one"
)

// indexedRows is the sparse decode's Read of kv_cache: the entries whose
// global slots (block*P + offset) the indices name; -1, or any slot outside
// the cache, is not attended.
func indexedRows(in Inputs) (func(int) bool, error) {
	ct, it := in.Tensors["kv_cache"], in.Tensors["indices"]
	if ct == nil || it == nil || len(ct.Shape) != 3 || it.Check() != nil {
		return nil, fmt.Errorf("tensors kv_cache or indices missing or misshapen")
	}
	if kvcache.Kind(in.Params.String("kv_cache_dtype", "")).BlockSplit() {
		// a token's bytes are two runs of its block: read them by Entry
		lay := kvcache.Layout{Kind: kvcache.FP8DSMLAModel1, PageSize: ct.Shape[1]}
		read, err := sparseSlotsRead(it, in.Tensors["topk_length"], ct.Shape[0]*ct.Shape[1])
		if err != nil {
			return nil, err
		}
		return func(i int) bool { s, _ := lay.Entry(i); return s < len(read) && read[s] }, nil
	}
	read, err := sparseSlotsRead(it, in.Tensors["topk_length"], ct.Shape[0]*ct.Shape[1])
	if err != nil {
		return nil, err
	}
	return paged.RowsRead(read, ct.Shape[2]), nil
}

// extraIndexedRows is indexedRows for the extra KV scope: the entries of
// extra_k_cache that extra_indices_in_kvcache names (within
// extra_topk_length).
func extraIndexedRows(in Inputs) (func(int) bool, error) {
	ct, it := in.Tensors["extra_k_cache"], in.Tensors["extra_indices_in_kvcache"]
	if ct == nil || it == nil || len(ct.Shape) != 3 || it.Check() != nil {
		return nil, fmt.Errorf("tensors extra_k_cache or extra_indices_in_kvcache missing or misshapen")
	}
	read, err := sparseSlotsRead(it, in.Tensors["extra_topk_length"], ct.Shape[0]*ct.Shape[1])
	if err != nil {
		return nil, err
	}
	if kvcache.Kind(in.Params.String("kv_cache_dtype", "")).BlockSplit() {
		lay := kvcache.Layout{Kind: kvcache.FP8DSMLAModel1, PageSize: ct.Shape[1]}
		return func(i int) bool { s, _ := lay.Entry(i); return s < len(read) && read[s] }, nil
	}
	return paged.RowsRead(read, ct.Shape[2]), nil
}

// sparseSlotsRead marks the slots the indices attend (those within
// topk_length when it is given).
func sparseSlotsRead(it, tl *tensor.Tensor, slots int) ([]bool, error) {
	read := make([]bool, slots)
	perReq := 0 // indices a request holds: s_q * topk
	if len(it.Shape) == 3 {
		perReq = it.Shape[1] * it.Shape[2]
	}
	for i := 0; i < it.Len(); i++ {
		if tl != nil && perReq > 0 && it.Shape[2] > 0 && i/perReq < tl.Len() && int64(i%it.Shape[2]) >= tl.Int64At(i/perReq) {
			continue // past the request's topk_length: not read
		}
		if s := it.Int64At(i); s >= 0 && s < int64(len(read)) {
			read[s] = true
		}
	}
	return read, nil
}

// Spec implements Kernel.
func (k *decode) Spec() *Spec { return &k.spec }

// Spec implements Kernel.
func (k *sparseDecode) Spec() *Spec { return &k.spec }

// Common is what both decodes' problems hold alike: the query [B, s_q, H,
// D], the cache view in its layout, and the attention's configuration.
type Common struct {
	// QT and KVCache are the contract tensors q and kv_cache.
	QT, KVCache *tensor.Tensor
	Q           mla.Query
	Cache       *kvcache.Cache
	// Layout is the cache's (L + R = D); its Saturate is the parameters'
	// and plays no part in a read.
	Layout kvcache.Layout
	// Config is the softmax scale, causality, lse convention and empty
	// row (and for the sparse decode the value width).
	Config mla.Config
}

// precision is the reference's precision for a call at prec whose outputs
// are stored as outDTypes: each output is judged at its stored dtype.
func (c *Common) precision(prec Precision, outDTypes OutDTypes) (mla.Precision, error) {
	mp := mla.DefaultPrecision()
	mp.Acc, mp.P, mp.KVDequant, mp.SoftmaxBlock = prec.Acc, prec.P, prec.KVDequant, prec.SoftmaxBlock
	// out defaults to BF16, or to F16 for an F16 query (an fp16 model's
	// kernels store out in the query's dtype: FlashMLA, vLLM TRITON_MLA).
	outDef := tensor.BF16
	if c.QT.DType == tensor.F16 {
		outDef = tensor.F16
	}
	var err error
	if mp.Out, err = OutDType(outDTypes, "out", outDef, tensor.BF16, tensor.F32, tensor.F16); err != nil {
		return mp, err
	}
	// Each is judged at its stored dtype: the reference rounds its answer
	// to it, and the tolerance follows from that rounding.
	for _, o := range []struct {
		name string
		dst  *tensor.DType
	}{{"lse", &mp.LSE}, {"partial_out", &mp.PartialOut}, {"partial_lse", &mp.PartialLSE}} {
		if *o.dst, err = OutDType(outDTypes, o.name, tensor.F32, tensor.F32, tensor.BF16, tensor.F16); err != nil {
			return mp, err
		}
	}
	return mp, nil
}

// validateCommon checks what both decodes share; scaled (mla_decode)
// reads the fp8_e4m3 cache's k_scale_rope, k_scale_tiles and
// k_scale_dtype too (paged.ScaledCache).
func validateCommon(in Inputs, scaled bool) (*Common, error) {
	qt := in.Tensors["q"]
	if err := CheckShape("q", qt, -1, -1, -1, -1); err != nil {
		return nil, err
	}
	ct := in.Tensors["kv_cache"]
	if len(ct.Shape) != 3 {
		return nil, fmt.Errorf("tensor kv_cache has shape %v; the contract wants [NB, P, entry]", ct.Shape)
	}
	d := qt.Shape[3]
	kind := in.Params.String("kv_cache_dtype", string(kvcache.BF16))
	if byteEntry := kind == string(kvcache.FP8DSMLA) || kvcache.Kind(kind).V4(); !byteEntry && ct.Shape[2] != d {
		return nil, fmt.Errorf("tensor q has D = %d but tensor kv_cache rows hold %d values (shape %v)", d, ct.Shape[2], ct.Shape)
	}
	l := d
	if d > 64 {
		l = d - 64
	}
	l, err := in.Params.Int("latent_dim", l)
	if err != nil {
		return nil, err
	}
	if l < 1 || l > d {
		return nil, fmt.Errorf("parameter latent_dim = %d: want 1 <= L <= D = %d", l, d)
	}
	prec, err := PrecisionFrom(in.Params)
	if err != nil {
		return nil, err
	}
	lay, err := paged.CacheLayout(in.Params, prec, "kv_cache", ct, l, d-l)
	if err != nil {
		return nil, err
	}
	if lay.D() != d {
		return nil, fmt.Errorf("tensor q has D = %d but kv_cache_dtype %s rows hold D = L + R = %d + %d = %d", d, lay.Kind, lay.L, lay.R, lay.D())
	}
	var cache *kvcache.Cache
	if scaled {
		var read []bool
		if in.Tensors["k_scale_tiles"] != nil {
			if read, err = paged.AttendedEntries(in, "kv_cache"); err != nil {
				return nil, err
			}
		}
		cache, err = paged.ScaledCache(in, ct, lay, read)
	} else {
		var ks float64
		if ks, err = paged.KScale(in, lay); err == nil {
			cache, err = kvcache.NewNamed("kv_cache", ct, lay, ks)
		}
	}
	if err != nil {
		return nil, err
	}
	scale, err := in.Params.RequiredFloat("softmax_scale")
	if err != nil {
		return nil, fmt.Errorf("%v: the engines pass qk_head_dim^-0.5·mscale², 0.1352337788608801 for DeepSeek-V3", err)
	}
	if math.IsNaN(scale) || math.IsInf(scale, 0) {
		return nil, fmt.Errorf("parameter softmax_scale = %v: want a finite number", scale)
	}
	causal, err := in.Params.Bool("causal", false)
	if err != nil {
		return nil, err
	}
	base, err := splitk.ParseBase(in.Params.String("lse_base", "e"))
	if err != nil {
		return nil, err
	}
	empty, err := splitk.ParseEmpty(in.Params.String("lse_empty", "-inf"))
	if err != nil {
		return nil, err
	}
	emptyRow := in.Params.String("empty_row", "zero")
	if emptyRow != "zero" && emptyRow != "nan" {
		return nil, fmt.Errorf("parameter empty_row = %q: want zero or nan", emptyRow)
	}
	q := mla.Query{B: qt.Shape[0], SQ: qt.Shape[1], H: qt.Shape[2], D: d, Data: qt.Float64s()}
	return &Common{QT: qt, KVCache: ct, Q: q, Cache: cache, Layout: lay,
		Config: mla.Config{SoftmaxScale: scale, Causal: causal, LSE: splitk.Convention{Base: base, Empty: empty}, EmptyRowNaN: emptyRow == "nan"}}, nil
}

// DecodeProblem is a validated mla_decode: the common part, the requests'
// pages, and the split-K partials asked for (S = 0: none; Bounds nil: the
// default split).
type DecodeProblem struct {
	in Inputs
	Common
	Pages  *kvcache.Pages
	S      int
	Bounds []int
}

// Inputs implements Problem.
func (p *DecodeProblem) Inputs() Inputs { return p.in }

// Validate implements Kernel.
func (*decode) Validate(in Inputs) (Problem, error) {
	c, err := validateCommon(in, true)
	if err != nil {
		return nil, err
	}
	if err := paged.RefuseV4("mla_decode", c.Layout); err != nil {
		return nil, err
	}
	bt := in.Tensors["block_table"]
	sl := in.Tensors["seq_lens"]
	pages, err := kvcache.NewPages(bt, sl, c.Layout.PageSize, c.Cache.NB)
	if err != nil {
		return nil, err
	}
	if pages.B() != c.Q.B {
		return nil, fmt.Errorf("tensor q has B = %d requests but seq_lens has %d", c.Q.B, pages.B())
	}
	s, bounds, err := splitSpec(in, pages.SeqLens)
	if err != nil {
		return nil, err
	}
	return &DecodeProblem{in: in, Common: *c, Pages: pages, S: s, Bounds: bounds}, nil
}

// Reference implements Kernel. The outputs' dtypes are checked here,
// after the inputs: only the call knows them.
func (*decode) Reference(ctx context.Context, pr Problem, prec Precision, outDTypes OutDTypes) ([]Output, error) {
	dp := pr.(*DecodeProblem)
	mp, err := dp.precision(prec, outDTypes)
	if err != nil {
		return nil, err
	}
	c := &mlaCommon{q: dp.Q, cache: dp.Cache, lay: dp.Layout, cfg: dp.Config, prec: mp}
	pages, s, bounds := dp.Pages, dp.S, dp.Bounds
	p := &mla.Dense{Q: c.q, Cache: c.cache, Pages: pages}
	ex, xp, err := mla.Decode(ctx, p, c.cfg, c.prec)
	if err != nil {
		return nil, err
	}
	B, SQ, H, L, P := c.q.B, c.q.SQ, c.q.H, c.lay.L, c.lay.PageSize
	maxSeq := 1
	for _, n := range pages.SeqLens {
		maxSeq = max(maxSeq, n)
	}
	rowCoords := func(dst []Coord, b, i, h int) []Coord {
		n := pages.SeqLens[b]
		vis := mla.Visible(n, SQ, i, c.cfg.Causal)
		return append(dst, Coord{Kind: KindContextLen, Value: n}, Coord{Kind: KindVisible, Value: vis}, Coord{Kind: KindLastPageFill, Value: vis % P}, Coord{Kind: KindHeadTile, Value: (i*H + h) / headTileRows})
	}
	outs := []Output{
		{
			Name: "out", Shape: []int{B, SQ, H, L}, DType: c.prec.Out, Exact: Dense(ex.Out), Expected: Dense(xp.Out),
			Mode: Numeric, Reduction: maxSeq,
			Coords: Coords{Axes: []CoordKind{KindRequest, KindQPos, KindHead, KindLatent}, Derived: func(dst []Coord, idx []int) []Coord {
				return append(rowCoords(dst, idx[0], idx[1], idx[2]), Coord{Kind: KindTile128, Value: idx[3] / 128})
			}},
		},
		{
			Name: "lse", Shape: []int{B, H, SQ}, DType: c.prec.LSE, Exact: Dense(ex.LSE), Expected: Dense(xp.LSE),
			Mode: Numeric, Reduction: maxSeq, Noise: Dense(ex.LSENoise), NoiseWhat: scoreNoiseWhat,
			Coords: Coords{Axes: []CoordKind{KindRequest, KindHead, KindQPos}, Derived: func(dst []Coord, idx []int) []Coord {
				return rowCoords(dst, idx[0], idx[2], idx[1])
			}},
		},
	}
	if s == 0 {
		for _, name := range []string{"partial_out", "partial_lse"} {
			if _, ok := outDTypes[name]; ok {
				// a caller that names the partials without their shape
				return nil, fmt.Errorf("tensor %s is present but nothing says how many splits (S) it holds: its shape, a split_bounds tensor or the num_splits parameter", name)
			}
		}
		return outs, nil
	}
	pex, pxp, err := mla.DecodePartials(ctx, p, c.cfg, c.prec, s, bounds)
	if err != nil {
		return nil, err
	}
	maxSplit := 1
	for b := 0; b < B; b++ {
		for k := 0; k < s; k++ {
			maxSplit = max(maxSplit, pex.Bounds[b*(s+1)+k+1]-pex.Bounds[b*(s+1)+k])
		}
	}
	splitCoords := func(dst []Coord, b, i, h, k int) []Coord {
		lo, hi := pex.Bounds[b*(s+1)+k], pex.Bounds[b*(s+1)+k+1]
		vis := max(0, min(hi, mla.Visible(pages.SeqLens[b], SQ, i, c.cfg.Causal))-lo)
		return append(dst, Coord{Kind: KindContextLen, Value: pages.SeqLens[b]}, Coord{Kind: KindSplitStart, Value: lo}, Coord{Kind: KindSplitLen, Value: hi - lo},
			Coord{Kind: "visible", Value: vis}, Coord{Kind: "last_page_fill", Value: (lo + vis) % P}, Coord{Kind: "head_tile", Value: (i*H + h) / headTileRows})
	}
	return append(outs,
		Output{
			Name: "partial_out", Shape: []int{B, SQ, H, s, L}, DType: c.prec.PartialOut, Exact: Dense(pex.Out), Expected: Dense(pxp.Out),
			Mode: Numeric, Reduction: maxSplit,
			Coords: Coords{Axes: []CoordKind{KindRequest, KindQPos, KindHead, KindSplit, KindLatent}, Derived: func(dst []Coord, idx []int) []Coord {
				return append(splitCoords(dst, idx[0], idx[1], idx[2], idx[3]), Coord{Kind: KindTile128, Value: idx[4] / 128})
			}},
		},
		Output{
			Name: "partial_lse", Shape: []int{B, SQ, H, s}, DType: c.prec.PartialLSE, Exact: Dense(pex.LSE), Expected: Dense(pxp.LSE),
			Mode: Numeric, Reduction: maxSplit, Noise: Dense(pex.LSENoise), NoiseWhat: scoreNoiseWhat,
			Coords: Coords{Axes: []CoordKind{KindRequest, KindQPos, KindHead, KindSplit}, Derived: func(dst []Coord, idx []int) []Coord {
				return splitCoords(dst, idx[0], idx[1], idx[2], idx[3])
			}},
		}), nil
}

// mlaCommon is a problem's common part at one call's precision, as the
// reference bodies read it.
type mlaCommon struct {
	q     mla.Query
	cache *kvcache.Cache
	lay   kvcache.Layout
	cfg   mla.Config
	prec  mla.Precision
}

// blockSplitSuspects is, for a DeepSeek-V4 cache, what out would hold had
// the kernel read the block-split cache token by token (kvcache.
// ReadInterleaved): a V3.2 kernel's addressing widened to the 584-byte
// entry. No position of out shows that bug (every row reads garbage), so
// the signature can only name it by its values (internal/signature's
// suspects). It costs a second decode, for this layout only.
func blockSplitSuspects(ctx context.Context, sp *mla.Sparse, c *mlaCommon, ct, extra *tensor.Tensor) (out, lse []Suspect, err error) {
	if !c.lay.Kind.BlockSplit() || c.lay.PageSize < 2 && (sp.Extra == nil || sp.Extra.Cache.Layout.PageSize < 2) {
		return nil, nil, nil // pages of one token: the two addressings are the same bytes
	}
	bad, err := kvcache.New(kvcache.ReadInterleaved(ct), c.lay, 0)
	if err != nil {
		return nil, nil, err
	}
	alt := *sp
	alt.Cache = bad
	if sp.Extra != nil { // the kernel reads both caches the same wrong way
		x := *sp.Extra
		if x.Cache, err = kvcache.New(kvcache.ReadInterleaved(extra), x.Cache.Layout, 0); err != nil {
			return nil, nil, err
		}
		alt.Extra = &x
	}
	_, xp, err := mla.DecodeSparse(ctx, &alt, c.cfg, c.prec)
	if err != nil {
		return nil, nil, err
	}
	const detail = "a decode that reads the block-split DeepSeek-V4 cache token by token (slot s at bytes 584s, the 656-byte layout's addressing)"
	return []Suspect{{Pattern: "block_split_read_interleaved", Detail: detail, Values: Dense(xp.Out)}},
		[]Suspect{{Pattern: "block_split_read_interleaved", Detail: detail, Values: Dense(xp.LSE)}}, nil
}

// readExtraScope reads FlashMLA's extra KV scope (extra_k_cache,
// extra_indices_in_kvcache [B, s_q, extra_topk], extra_topk_length [B]),
// nil when the capture has none. FlashMLA requires the extra cache to have
// the first one's bytes a token, so its layout is the first one's, with
// its own page size (csrc/api/sparse_decode.h:299-304, KU_CHECK_SHAPE of
// extra_kv with the same bytes_per_token; :222-225 its own
// page_block_size), and the extra indices without the cache, or the cache
// without them, are refused as FlashMLA refuses them (:239-245). Indices
// follow the same invalid_index convention.
func readExtraScope(in Inputs, c *Common, invalid string) (*mla.SparseScope, error) {
	xc, xi, xl := in.Tensors["extra_k_cache"], in.Tensors["extra_indices_in_kvcache"], in.Tensors["extra_topk_length"]
	switch {
	case xc == nil && xi == nil && xl == nil:
		return nil, nil
	case xc == nil:
		return nil, fmt.Errorf("tensor extra_indices_in_kvcache or extra_topk_length is present but extra_k_cache is not: FlashMLA refuses extra indices without their cache")
	case xi == nil:
		return nil, fmt.Errorf("tensor extra_k_cache is present but extra_indices_in_kvcache is not: FlashMLA requires both")
	}
	if len(xc.Shape) != 3 {
		return nil, fmt.Errorf("tensor extra_k_cache has shape %v; the contract wants [NB, P, entry]", xc.Shape)
	}
	lay := c.Layout
	lay.PageSize = xc.Shape[1]
	cache, err := kvcache.NewNamed("extra_k_cache", xc, lay, c.Cache.KScale)
	if err != nil {
		return nil, err
	}
	if err := CheckShape("extra_indices_in_kvcache", xi, c.Q.B, c.Q.SQ, -1); err != nil {
		return nil, err
	}
	x := &mla.SparseScope{Cache: cache, TopK: xi.Shape[2], Indices: make([]int64, xi.Len())}
	slots := int64(cache.Slots())
	for i := range x.Indices {
		x.Indices[i] = xi.Int64At(i)
		if v := x.Indices[i]; invalid == invalidMinusOne && v != -1 && (v < 0 || v >= slots) {
			return nil, fmt.Errorf("tensor extra_indices_in_kvcache[%d,%d,%d] = %d is outside extra_k_cache (%d slots) and not -1: with invalid_index = minus_one (FlashMLA's convention) only -1 is masked",
				i/(c.Q.SQ*x.TopK), i/x.TopK%c.Q.SQ, i%x.TopK, v, slots)
		}
	}
	if xl != nil {
		if err := CheckShape("extra_topk_length", xl, c.Q.B); err != nil {
			return nil, err
		}
		x.TopKLength = make([]int64, c.Q.B)
		for b := range x.TopKLength {
			if x.TopKLength[b] = xl.Int64At(b); x.TopKLength[b] < 0 || x.TopKLength[b] > int64(x.TopK) {
				return nil, fmt.Errorf("tensor extra_topk_length[%d] = %d is outside [0, extra topk = %d]", b, x.TopKLength[b], x.TopK)
			}
		}
	}
	return x, nil
}

// splitSpec returns the split count S (0: no partials) and the bounds (nil:
// the default split). S is the split dimension of the captured partials
// when there are any (partial_out [B, s_q, H, S, L], partial_lse
// [B, s_q, H, S]: reference/CONTRACTS.md §3.6.1), else the columns of split_bounds [B, S+1], else
// the num_splits parameter; whichever of them are given must agree, and an
// error names the two that do not.
func splitSpec(in Inputs, seqLens []int) (int, []int, error) {
	type source struct {
		what string // how the error names it
		s    int
	}
	var given []source
	for _, o := range []struct {
		name, layout string
		rank         int
	}{{"partial_out", "[B, s_q, H, S, L]", 5}, {"partial_lse", "[B, s_q, H, S]", 4}} {
		shape, ok := in.OutputShapes[o.name]
		if !ok {
			continue
		}
		if len(shape) != o.rank {
			return 0, nil, fmt.Errorf("tensor %s has shape %v; the contract wants %s (S, the split count, is dimension 3)", o.name, shape, o.layout)
		}
		if shape[3] < 1 {
			return 0, nil, fmt.Errorf("tensor %s has shape %v: S = %d splits, want at least 1", o.name, shape, shape[3])
		}
		given = append(given, source{fmt.Sprintf("tensor %s has S = %d splits (shape %v)", o.name, shape[3], shape), shape[3]})
	}
	bt, hasBounds := in.Tensors["split_bounds"]
	if hasBounds {
		if err := CheckDType("split_bounds", bt, paged.IndexDTypes...); err != nil {
			return 0, nil, err
		}
		if len(bt.Shape) != 2 || bt.Shape[0] != len(seqLens) || bt.Shape[1] < 2 {
			return 0, nil, fmt.Errorf("tensor split_bounds has shape %v; the contract wants [B=%d, S+1] with S >= 1", bt.Shape, len(seqLens))
		}
		given = append(given, source{fmt.Sprintf("tensor split_bounds has S+1 = %d columns", bt.Shape[1]), bt.Shape[1] - 1})
	}
	if _, ok := in.Params["num_splits"]; ok {
		n, err := in.Params.Int("num_splits", 0)
		if err != nil {
			return 0, nil, err
		}
		if n < 0 {
			return 0, nil, fmt.Errorf("parameter num_splits = %d: want a positive split count", n)
		}
		if n > 0 { // 0 is the parameter's "no partials"
			given = append(given, source{fmt.Sprintf("parameter num_splits = %d", n), n})
		}
	}
	if len(given) == 0 {
		return 0, nil, nil
	}
	s := given[0].s
	for _, g := range given[1:] {
		if g.s != s {
			return 0, nil, fmt.Errorf("%s but %s: they must give one split count S", g.what, given[0].what)
		}
	}
	if !hasBounds {
		return s, nil, nil
	}
	bounds := make([]int, bt.Len())
	for i := range bounds {
		v := bt.Int64At(i)
		if v < 0 || v > math.MaxInt32 {
			return 0, nil, fmt.Errorf("split_bounds[%d,%d] = %d is not a token position", i/(s+1), i%(s+1), v)
		}
		bounds[i] = int(v)
	}
	return s, bounds, mla.CheckBounds(bounds, seqLens, s)
}

// SparseProblem is a validated mla_decode_sparse: the common part, the
// attended slots (FlashMLA's optional topk_length, attn_sink and extra
// scope included), the value width V (Config.ValueDims) and how the
// fp8_ds_mla tile scales are read.
type SparseProblem struct {
	in Inputs
	Common
	// Sparse holds Q, Cache, TopK, Indices (-1 and, with invalid_index =
	// outside, any slot outside the cache not attended) and the optional
	// parts.
	Sparse *mla.Sparse
	// MinusOneOnly: invalid_index = minus_one, every index in the cache
	// or -1.
	MinusOneOnly bool
	ScaleRead    kvcache.ScaleRead
}

// Inputs implements Problem.
func (p *SparseProblem) Inputs() Inputs { return p.in }

// Validate implements Kernel.
func (*sparseDecode) Validate(in Inputs) (Problem, error) {
	c, err := validateCommon(in, false)
	if err != nil {
		return nil, err
	}
	it := in.Tensors["indices"]
	if err := CheckShape("indices", it, c.Q.B, c.Q.SQ, -1); err != nil {
		return nil, err
	}
	topk := it.Shape[2]
	if k, err := in.Params.Int("topk", topk); err != nil {
		return nil, err
	} else if k != topk {
		return nil, fmt.Errorf("parameter topk = %d but tensor indices has shape %v (topk = %d)", k, it.Shape, topk)
	}
	invalid, err := in.Params.Enum("invalid_index", invalidOutside, invalidOutside, invalidMinusOne)
	if err != nil {
		return nil, err
	}
	slots := int64(c.Cache.NB) * int64(c.Layout.PageSize)
	idx := make([]int64, it.Len())
	for i := range idx {
		idx[i] = it.Int64At(i)
		if v := idx[i]; invalid == invalidMinusOne && v != -1 && (v < 0 || v >= slots) {
			return nil, fmt.Errorf("tensor indices[%d,%d,%d] = %d is outside the cache (%d slots) and not -1: with invalid_index = minus_one (FlashMLA's convention) only -1 is masked, and FlashMLA would read this slot out of bounds",
				i/(c.Q.SQ*topk), i/topk%c.Q.SQ, i%topk, v, slots)
		}
	}
	extra, err := readExtraScope(in, c, invalid)
	if err != nil {
		return nil, err
	}
	v := c.Layout.L
	if c.Layout.Kind.V4() {
		v = c.Layout.D()
	}
	if v, err = in.Params.Int("head_dim_v", v); err != nil {
		return nil, err
	}
	if v < 1 || v > c.Layout.D() {
		return nil, fmt.Errorf("parameter head_dim_v = %d: the value is the first V columns of a cache row, want 1 <= V <= D = %d", v, c.Layout.D())
	}
	c.Config.ValueDims = v
	sp := &mla.Sparse{Q: c.Q, Cache: c.Cache, TopK: topk, Indices: idx, Extra: extra}
	if t := in.Tensors["topk_length"]; t != nil {
		if err := CheckShape("topk_length", t, c.Q.B); err != nil {
			return nil, err
		}
		sp.TopKLength = make([]int64, c.Q.B)
		for b := range sp.TopKLength {
			if sp.TopKLength[b] = t.Int64At(b); sp.TopKLength[b] < 0 || sp.TopKLength[b] > int64(topk) {
				return nil, fmt.Errorf("tensor topk_length[%d] = %d is outside [0, topk = %d]", b, sp.TopKLength[b], topk)
			}
		}
	}
	if t := in.Tensors["attn_sink"]; t != nil {
		if err := CheckShape("attn_sink", t, c.Q.H); err != nil {
			return nil, err
		}
		sp.AttnSink = t.Float64s()
		for h, v := range sp.AttnSink {
			if math.IsNaN(v) {
				return nil, fmt.Errorf("tensor attn_sink[%d] is NaN", h)
			}
		}
	}
	read, err := in.Params.Enum("ds_mla_scale_read", string(kvcache.ScaleReadF32), kvcache.ScaleReads...)
	if err != nil {
		return nil, err
	}
	if err := c.Cache.SetScaleRead(kvcache.ScaleRead(read)); err != nil {
		return nil, err
	}
	return &SparseProblem{in: in, Common: *c, Sparse: sp, MinusOneOnly: invalid == invalidMinusOne, ScaleRead: kvcache.ScaleRead(read)}, nil
}

// Reference implements Kernel. The outputs' dtypes are checked here,
// after the inputs: only the call knows them.
func (*sparseDecode) Reference(ctx context.Context, pr Problem, prec Precision, outDTypes OutDTypes) ([]Output, error) {
	p := pr.(*SparseProblem)
	mp, err := p.precision(prec, outDTypes)
	if err != nil {
		return nil, err
	}
	in, read := p.in, string(p.ScaleRead)
	// The scale-read note below switches the cache's reading and back: it
	// does so on a copy, so that the problem stays as Validate left it.
	cache := *p.Cache
	sp := *p.Sparse
	sp.Cache = &cache
	c := &mlaCommon{q: p.Q, cache: &cache, lay: p.Layout, cfg: p.Config, prec: mp}
	topk, extra, v := sp.TopK, sp.Extra, p.Config.ValueDims
	ex, xp, err := mla.DecodeSparse(ctx, &sp, c.cfg, c.prec)
	if err != nil {
		return nil, err
	}
	var notes map[string][]string
	if read != string(kvcache.ScaleReadF32) {
		// the same decode reading the stored F32 scales: what the declared
		// reading costs, reported beside the verdict it does not change
		if err := c.cache.SetScaleRead(kvcache.ScaleReadF32); err != nil {
			return nil, err
		}
		f32, _, err := mla.DecodeSparse(ctx, &sp, c.cfg, c.prec)
		if err != nil {
			return nil, err
		}
		// back to the declared reading, which the suspects below share
		if err := c.cache.SetScaleRead(kvcache.ScaleRead(read)); err != nil {
			return nil, err
		}
		notes = map[string][]string{
			"out": {scaleReadLoss("out", read, ex.Out, f32.Out)},
			"lse": {scaleReadLoss("lse", read, ex.LSE, f32.LSE)},
		}
	}
	B, SQ, H, L := c.q.B, c.q.SQ, c.q.H, v
	// attended slots per (request, query): the context of a sparse row
	attended := make([]int, B*SQ)
	for b := 0; b < B; b++ {
		for i := 0; i < SQ; i++ {
			attended[b*SQ+i] = len(sp.ValidSlots(b, i)) + len(sp.ExtraSlots(b, i))
		}
	}
	rowCoords := func(dst []Coord, b, i, h int) []Coord {
		return append(dst, Coord{Kind: KindContextLen, Value: attended[b*SQ+i]}, Coord{Kind: KindHeadTile, Value: (i*H + h) / headTileRows})
	}
	red := max(1, topk)
	if extra != nil {
		red = max(1, topk+extra.TopK)
	}
	outSus, lseSus, err := blockSplitSuspects(ctx, &sp, c, in.Tensors["kv_cache"], in.Tensors["extra_k_cache"])
	if err != nil {
		return nil, err
	}
	return []Output{
		{
			Name: "out", Shape: []int{B, SQ, H, L}, DType: c.prec.Out, Exact: Dense(ex.Out), Expected: Dense(xp.Out),
			Mode: Numeric, Reduction: red, Suspects: outSus, Notes: notes["out"],
			Coords: Coords{Axes: []CoordKind{KindRequest, KindQPos, KindHead, KindLatent}, Derived: func(dst []Coord, idx []int) []Coord {
				// part: whether the value column is a latent (quantized) or
				// a rope one, for "V = the whole entry" bugs
				part, _ := c.lay.PartOf(idx[3])
				return append(rowCoords(dst, idx[0], idx[1], idx[2]), Coord{Kind: KindTile128, Value: idx[3] / 128}, Coord{Kind: KindPart, Value: int(part)})
			}},
		},
		{
			Name: "lse", Shape: []int{B, H, SQ}, DType: c.prec.LSE, Exact: Dense(ex.LSE), Expected: Dense(xp.LSE),
			Mode: Numeric, Reduction: red, Suspects: lseSus, Notes: notes["lse"], Noise: Dense(ex.LSENoise), NoiseWhat: scoreNoiseWhat,
			Coords: Coords{Axes: []CoordKind{KindRequest, KindHead, KindQPos}, Derived: func(dst []Coord, idx []int) []Coord {
				return rowCoords(dst, idx[0], idx[2], idx[1])
			}},
		},
	}, nil
}

// scoreNoiseWhat names an lse's Output.Noise: its scores are D-term dots
// in the accumulator dtype whose order is the kernel's own. Expected sums
// them in MMA-sized blocks of 16 exact products (reference/mla), so its
// floor can sit far below another correct order's error: SGLang 0.5.23's
// Triton decode (decode_attention.py, a 512 + 64 tl.dot pair) erred by 13
// fp32 ulp on an lse over three tokens (Σ_d|q_d·k_d| = 363 for a score of
// 6.6) where the floor alone allowed 4.
const scoreNoiseWhat = "the p-weighted rms error of the scores' fp32 accumulation in an order of the kernel's own (reference/mla ScoreNoise)"

// scaleReadLoss says how far reading the tile scales as read moves the
// exact output from the stored-F32 reading's: max abs and rms of the
// difference, and the rms relative to the F32 reading's rms, over the
// elements finite in both.
func scaleReadLoss(name, read string, got, f32 []float64) string {
	var maxAbs, sd, sf float64
	n := 0
	for i, g := range got {
		f := f32[i]
		if math.IsNaN(g) || math.IsInf(g, 0) || math.IsNaN(f) || math.IsInf(f, 0) {
			continue
		}
		d := math.Abs(g - f)
		maxAbs = max(maxAbs, d)
		sd += d * d
		sf += f * f
		n++
	}
	rel := 0.0
	if sf > 0 {
		rel = math.Sqrt(sd / sf)
	}
	rms := 0.0
	if n > 0 {
		rms = math.Sqrt(sd / float64(n))
	}
	return fmt.Sprintf("%s: ds_mla_scale_read = %s, the declared reading of the fp8_ds_mla tile scales, moves the exact %s from the stored-F32 reading's by max abs %.3g, rms %.3g (%.3g of its rms): precision the reader loses by its definition, reported, not tolerated", name, read, name, maxAbs, rms, rel)
}
