// Package transfer is kv_cache_transfer (reference/CONTRACTS.md §3.10),
// prefill/decode disaggregation's KV move: a prefill node's paged cache and
// block table, the decode node's cache before and after the transfer and its
// block table, and the requests' lengths. Every token's decode-side entry
// must hold the prefill side's bytes (or, between different layouts, the
// entry decoded and re-encoded by the decode side's writer), every other
// decode-side byte what it held. The package holds the contract, its
// validated problem, the reference adapter over reference/kvcache, the bugs
// a failure is compared with (a block-table shift, a page-size mismatch, a
// layout mismatch, a partial transfer), and what the tools ask of a kernel
// (cost, case inputs, slicing, contexts, roofline).
//
// The transports move raw bytes: vLLM's NIXL connector pairs remote and
// local block ids and, for a larger local block, splits it into
// remote-sized sub-blocks in token order (vllm 0.33.0,
// vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py:3551-3569
// get_mapped_blocks; block_size_ratio in kv_connector/utils.py:541-547);
// SGLang's MLA pool describes each layer's buffer for the transfer as whole
// pages, kv_item_len = kv_buffer[i][0].nbytes * page_size (sglang 0.5.23,
// sglang/srt/mem_cache/memory_pool.py:4884-4891 get_contiguous_buf_infos),
// and mooncake's transfer addresses both sides with the prefill side's
// item_len (sglang/srt/disaggregation/mooncake/conn.py:1186-1191). Neither
// converts a dtype: a conversion is this contract's declared semantics for
// two nodes whose caches differ, which no engine performs.
//
// The family is written in the framework's vocabulary, dot-imported, as the
// other kernel folders are.
package transfer

import (
	"context"
	"fmt"

	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/kernels/paged"
	"github.com/kcheck-dev/kcheck/reference/kvcache"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

func init() { Register(kernelTransfer{}) }

// kernelTransfer is kv_cache_transfer.
type kernelTransfer struct{}

var spec = Spec{
	Name:    "kv_cache_transfer",
	Stage:   StageCache,
	Summary: "prefill/decode KV-cache transfer between two paged caches (vLLM NIXL connector, SGLang disaggregation)",
	Inputs: []TensorSpec{
		{Name: "src_cache", DTypes: paged.CacheDTypes, Read: sentRows},
		{Name: "src_block_table", DTypes: paged.IndexDTypes},
		{Name: "dst_cache_before", DTypes: paged.CacheDTypes, Read: paged.ReadsNothing},
		{Name: "dst_block_table", DTypes: paged.IndexDTypes},
		{Name: "seq_lens", DTypes: paged.IndexDTypes},
		{Name: "src_k_scale", DTypes: []tensor.DType{tensor.F32}, Optional: true},
		{Name: "dst_k_scale", DTypes: []tensor.DType{tensor.F32}, Optional: true},
	},
	Outputs: []TensorSpec{{Name: "dst_cache_after", DTypes: paged.CacheDTypes}},
	Params: []ParamSpec{
		{Name: "kv_cache_dtype", Kind: ParamEnum, Default: string(kvcache.BF16), Allowed: kvcache.Kinds,
			Doc: "the decode side's cache layout (dst_cache_before, dst_cache_after): bf16, fp8_e4m3 over dst_k_scale, or fp8_ds_mla"},
		{Name: "src_kv_cache_dtype", Kind: ParamEnum, Allowed: kvcache.Kinds,
			Doc: "the prefill side's cache layout (src_cache); default kv_cache_dtype"},
		{Name: "page_size", Kind: ParamInt, Doc: "tokens a decode-side block holds; default dst_cache_before's second dimension, which it must equal"},
		{Name: "src_page_size", Kind: ParamInt, Doc: "tokens a prefill-side block holds; default src_cache's second dimension, which it must equal"},
		{Name: "ds_mla_scale", Kind: ParamEnum, Default: string(kvcache.ScaleAmax), Allowed: kvcache.ScaleConventions,
			Doc: "the decode side's fp8_ds_mla tile-scale convention: how its writer re-encodes a converted entry"},
		{Name: "src_ds_mla_scale", Kind: ParamEnum, Allowed: kvcache.ScaleConventions,
			Doc: "the convention the prefill side's fp8_ds_mla cache was written in; default ds_mla_scale (an entry moves as bytes only when the two agree)"},
		{Name: "whole_pages", Kind: ParamBool, Default: "false",
			Doc: "the transport moves whole pages (NIXL, SGLang): the slots past seq_len in a decode page a request uses hold the prefill page's bytes; needs equal page sizes and layouts"},
	},
}

// Spec implements Kernel.
func (kernelTransfer) Spec() *Spec { return &spec }

// side is one node's cache: its tensor, layout and per-tensor scale.
type side struct {
	t     *tensor.Tensor
	lay   kvcache.Layout
	scale float64
	cache *kvcache.Cache
}

// problem is a validated kv_cache_transfer.
type problem struct {
	in       Inputs
	src, dst side
	routing  *kvcache.Routing
	mode     kvcache.CopyMode
	whole    bool
}

// Inputs implements Problem.
func (p *problem) Inputs() Inputs { return p.in }

// widths are the latent and rope widths of a cache entry of d values, as
// kv_cache_gather reads them: only fp8_ds_mla fixes them; the other layouts
// store D = L + R values alike, and the split only names the "part"
// coordinate (DeepSeek's R = 64 where the entry is wide enough).
func widths(d int) (l, r int) {
	if d > 64 {
		return d - 64, 64
	}
	return d, 0
}

// Validate implements Kernel.
func (kernelTransfer) Validate(in Inputs) (Problem, error) { return validate(in) }

func validate(in Inputs) (*problem, error) {
	p := &problem{in: in}
	prec, err := PrecisionFrom(in.Params)
	if err != nil {
		return nil, err
	}
	dstKind, err := in.Params.Enum("kv_cache_dtype", string(kvcache.BF16), kvcache.Kinds...)
	if err != nil {
		return nil, err
	}
	srcKind, err := in.Params.Enum("src_kv_cache_dtype", dstKind, kvcache.Kinds...)
	if err != nil {
		return nil, err
	}
	for _, k := range []struct{ param, kind string }{{"src_kv_cache_dtype", srcKind}, {"kv_cache_dtype", dstKind}} {
		if kvcache.Kind(k.kind).V4() {
			// no engine's transfer of them is known to kcheck, and a
			// block-split block only moves whole
			return nil, fmt.Errorf("kernel kv_cache_transfer does not read parameter %s = %s (a DeepSeek-V4 sparse cache; fp8_ds_mla_model1's tokens are not even contiguous entries): of the readers only mla_decode_sparse does", k.param, k.kind)
		}
	}
	dstConv, err := in.Params.Enum("ds_mla_scale", string(kvcache.ScaleAmax), kvcache.ScaleConventions...)
	if err != nil {
		return nil, err
	}
	srcConv, err := in.Params.Enum("src_ds_mla_scale", dstConv, kvcache.ScaleConventions...)
	if err != nil {
		return nil, err
	}
	if p.whole, err = in.Params.Bool("whole_pages", false); err != nil {
		return nil, err
	}
	for _, name := range []string{"src_cache", "dst_cache_before"} {
		if t := in.Tensors[name]; len(t.Shape) != 3 {
			return nil, fmt.Errorf("tensor %s has shape %v; the contract wants [NB, P, entry]", name, t.Shape)
		}
	}
	// L and R: fp8_ds_mla fixes them (a side opposite it reads its D = 576
	// with the same split); otherwise the decode side's entry says.
	l, r := widths(in.Tensors["dst_cache_before"].Shape[2])
	if kvcache.Kind(srcKind) == kvcache.FP8DSMLA || kvcache.Kind(dstKind) == kvcache.FP8DSMLA {
		l, r = kvcache.DSLatent, kvcache.DSRope
	}
	for _, s := range []struct {
		name, kind, conv, page, scale string
		into                          *side
	}{
		{"src_cache", srcKind, srcConv, "src_page_size", "src_k_scale", &p.src},
		{"dst_cache_before", dstKind, dstConv, "page_size", "dst_k_scale", &p.dst},
	} {
		t := in.Tensors[s.name]
		ps, err := in.Params.Int(s.page, t.Shape[1])
		if err != nil {
			return nil, err
		}
		if ps != t.Shape[1] {
			return nil, fmt.Errorf("parameter %s = %d but tensor %s has pages of %d tokens (shape %v)", s.page, ps, s.name, t.Shape[1], t.Shape)
		}
		lay := kvcache.Layout{Kind: kvcache.Kind(s.kind), L: l, R: r, PageSize: ps, DSScale: kvcache.ScaleConvention(s.conv), Saturate: prec.FP8Saturate}
		if err := lay.Validate(); err != nil {
			return nil, fmt.Errorf("tensor %s: %v", s.name, err)
		}
		if lay.Kind != kvcache.FP8DSMLA && t.Shape[2] != lay.D() {
			return nil, fmt.Errorf("tensor %s has shape %v: %d values a token, where the other node's cache holds %d (kv_cache_dtype %s, src_kv_cache_dtype %s): the two nodes' caches are of different models or TP shards",
				s.name, t.Shape, t.Shape[2], lay.D(), dstKind, srcKind)
		}
		scale := 0.0
		if lay.NeedsKScale() {
			st, ok := in.Tensors[s.scale]
			if !ok {
				return nil, fmt.Errorf("tensor %s is missing (kv_cache_dtype %s of %s divides by it)", s.scale, lay.Kind, s.name)
			}
			if scale, err = st.Scalar(); err != nil {
				return nil, fmt.Errorf("tensor %s: %v", s.scale, err)
			}
			if !(scale > 0) || scale > 3.4e38 {
				return nil, fmt.Errorf("tensor %s = %v: want a positive finite scale", s.scale, scale)
			}
		}
		c, err := kvcache.NewNamed(s.name, t, lay, scale)
		if err != nil {
			return nil, err
		}
		*s.into = side{t: t, lay: lay, scale: scale, cache: c}
	}
	if p.whole && p.src.lay.PageSize != p.dst.lay.PageSize {
		return nil, fmt.Errorf("parameter whole_pages = true needs equal page sizes on both sides: src_page_size = %d, page_size = %d (a transport that moves whole pages cannot split or join them)", p.src.lay.PageSize, p.dst.lay.PageSize)
	}
	p.mode = kvcache.CopyConvert
	if kvcache.SameLayout(p.src.lay, p.dst.lay, p.src.scale, p.dst.scale) {
		p.mode = kvcache.CopyBytes
	} else if p.whole {
		return nil, fmt.Errorf("parameter whole_pages = true needs one layout on both sides, and src_cache is %s while dst_cache_before is %s: a transport that moves pages cannot convert them",
			describe(p.src), describe(p.dst))
	}
	p.routing, err = kvcache.RouteTransfer(in.Tensors["src_block_table"], in.Tensors["dst_block_table"], in.Tensors["seq_lens"],
		p.src.lay.PageSize, p.dst.lay.PageSize, p.src.cache.NB, p.dst.cache.NB, p.whole)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// describe names a side's layout in an error.
func describe(s side) string {
	switch s.lay.Kind {
	case kvcache.FP8E4M3:
		return fmt.Sprintf("fp8_e4m3 over k_scale %v", float32(s.scale))
	case kvcache.FP8DSMLA:
		return fmt.Sprintf("fp8_ds_mla written with %s tile scales", s.lay.DSScale)
	}
	return string(s.lay.Kind)
}

// Reference implements Kernel.
func (kernelTransfer) Reference(ctx context.Context, pr Problem, prec Precision, out OutDTypes) ([]Output, error) {
	p := pr.(*problem)
	before, err := paged.AsDType("dst_cache_after", p.dst.t, out["dst_cache_after"], p.dst.lay)
	if err != nil {
		return nil, err
	}
	x, err := kvcache.NewTransfer(p.src.cache, before, p.dst.cache, p.routing.Moves, p.mode)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	lay := p.dst.lay
	e := lay.EntrySize()
	derived := func(dst []Coord, idx []int) []Coord {
		part, tile := lay.PartOf(idx[2])
		req, tok := -1, -1
		if k := x.Find(idx[0]*lay.PageSize + idx[1]); k >= 0 {
			req, tok = int(x.Moves[k].Request), int(x.Moves[k].Token)
		}
		c := append(dst, Coord{Kind: KindPart, Value: int(part)}, Coord{Kind: KindRequest, Value: req}, Coord{Kind: KindToken, Value: tok})
		if lay.Kind == kvcache.FP8DSMLA {
			c = append(c, Coord{Kind: KindTile128, Value: tile})
		}
		return c
	}
	// The comparison calls an equivalence rule from one goroutine, so it
	// may keep the entry it last judged.
	eqEnc := x.NewEncoder(false)
	equivalent := func(i int, actual float64) bool {
		k := x.Find(i / e)
		return k >= 0 && eqEnc.Equivalent(k, i%e, actual)
	}
	return []Output{{
		Name:       "dst_cache_after",
		Shape:      append([]int(nil), before.Shape...),
		DType:      before.DType,
		Exact:      newAfter(x, true),
		Expected:   newAfter(x, false),
		Mode:       Bitwise,
		Equivalent: equivalent,
		Reduction:  1,
		Coords:     Coords{Axes: []CoordKind{KindBlock, KindPageOffset, KindColumn}, Derived: derived},
		Before:     TensorValues{T: before},
		Suspects:   suspects(p, before),
	}}, nil
}

// after is dst_cache_after as Values: dst_cache_before where no token
// lands, and each moved entry computed on demand (the last one kept).
type after struct {
	x     *kvcache.Transfer
	enc   *kvcache.Encoder
	exact bool
	e     int
	slot  int
	k     int
	entry *tensor.Tensor
}

func newAfter(x *kvcache.Transfer, exact bool) *after {
	e := x.Dst.Layout.EntrySize()
	return &after{x: x, enc: x.NewEncoder(exact), exact: exact, e: e, slot: -1, k: -1,
		entry: &tensor.Tensor{DType: x.Before.DType, Shape: []int{e}, Data: make([]byte, x.EntryBytes())}}
}

// Fork implements Forker.
func (a *after) Fork() Values { return newAfter(a.x, a.exact) }

// Len implements Values.
func (a *after) Len() int { return a.x.Before.Len() }

// At implements Values.
func (a *after) At(i int) float64 {
	if slot := i / a.e; slot != a.slot {
		a.slot, a.k = slot, a.x.Find(slot)
		if a.k >= 0 {
			a.enc.EntryInto(a.k, a.entry.Data)
		}
	}
	if a.k < 0 {
		return a.x.Before.Float64At(i)
	}
	return a.entry.Float64At(i - a.slot*a.e)
}
