// Package dsa is dsa_indexer (reference/CONTRACTS.md §3.9), DeepSeek Sparse Attention's lightning indexer: the contract, its validated
// problem (IndexerProblem), the reference adapter over reference/dsa, the coordinates that name an output element, and what the
// tools ask of each kernel (cost, case inputs, slicing, contexts,
// roofline).
//
// The family is written in the framework's vocabulary, dot-imported: its
// code reads as it did inside internal/kernel, where it was born.
package dsa

import (
	"context"
	"fmt"
	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/kernels/paged"

	"github.com/kcheck-dev/kcheck/reference/dsa"
	"github.com/kcheck-dev/kcheck/reference/kvcache"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// dsa_indexer (reference/CONTRACTS.md §3.9): the contract tensors adapted to reference/dsa.

// indexer is dsa_indexer.
type indexer struct{ spec Spec }

func init() {
	Register(&indexer{Spec{
		Name:    "dsa_indexer",
		Stage:   StageAttn,
		Summary: "DeepSeek Sparse Attention lightning indexer scores and top-k",
		Inputs: []TensorSpec{
			// an fp16 model's query and key cache are F16
			{Name: "q", DTypes: []tensor.DType{tensor.BF16, tensor.F16, tensor.F8E4M3}},
			{Name: "k_cache", DTypes: []tensor.DType{tensor.BF16, tensor.F16, tensor.U8}, Read: indexerRows},
			{Name: "weights", DTypes: []tensor.DType{tensor.F32}},
			{Name: "block_table", DTypes: paged.IndexDTypes},
			{Name: "seq_lens", DTypes: paged.IndexDTypes},
		},
		Outputs: []TensorSpec{
			{Name: "scores", DTypes: []tensor.DType{tensor.F32}},
			{Name: "topk_indices", DTypes: []tensor.DType{tensor.I32}},
		},
		Params: []ParamSpec{
			paged.PageSizeParam,
			{Name: "k_cache_dtype", Kind: ParamEnum, Default: "bf16", Allowed: indexerCacheKinds,
				Doc: "bf16: k_cache BF16 [NB, P, Dk]; fp16: F16 [NB, P, Dk] (an fp16 model's); auto: the k_cache tensor's own 16-bit dtype; fp8_e4m3: vLLM's indexer cache, U8 [NB, P, Dk+4] holding per block the P tokens' Dk e4m3 codes then their P F32 scales (the q scale of an fp8 q is folded into weights, as vLLM does)"},
			{Name: "max_seq", Kind: ParamInt, Doc: "the scores' width (default: the captured scores', else the longest request)"},
			{Name: "topk", Kind: ParamInt, Doc: "indices a request keeps (default: the captured topk_indices' width; one of the two is needed)"},
			{Name: "next_n", Kind: ParamInt, Default: "1", Doc: "query rows a request has (MTP: next_n > 1 verifies next_n - 1 draft tokens): q, weights, scores and topk_indices have B·next_n rows, request-major, and row n sees the tokens t < seq_len - next_n + n + 1 (t < context_len and t <= its own position, vLLM's causal next_n), or with seq_lens [B, next_n] its own seq_lens[b, n] (vLLM's per-row lengths)"},
			{Name: "k_scale_fmt", Kind: ParamEnum, Default: dsa.ScaleAny, Allowed: []string{dsa.ScaleAny, dsa.ScaleAmax, dsa.ScaleUE8M0},
				Doc: "the writer convention of the fp8_e4m3 cache's per-token scales (vLLM's scale_fmt): any (default: not declared), amax (max(amax, 1e-4)/448) or ue8m0 (that rounded up to a power of two, vLLM 0.33's DeepSeek-V3.2 indexer); the scores read each stored scale as it is, and a declared convention is checked on every attended token"},
			{Name: "topk_index", Kind: ParamEnum, Default: "request", Allowed: topkIndexKinds,
				Doc: "request: topk_indices are token positions in the request (vLLM's indexer output); global_slot: cache slots block_table[b, t / P]·P + t % P, -1 kept as -1 (vLLM's triton_convert_req_index_to_global_index, what FLASHMLA_SPARSE receives as indices)"},
		},
	}})
}

// indexerRows is k_cache's Read: the entries of the attended tokens; in the
// fp8 layout a token's codes and its scale are in two places of its block
// (vllm 0.33.0 vllm/v1/attention/ops/rocm_aiter_mla_sparse.py:462-479).
func indexerRows(in Inputs) (func(int) bool, error) {
	if sl := in.Tensors["seq_lens"]; sl != nil && len(sl.Shape) == 2 {
		in = withRequestLens(in, sl)
	}
	if in.Params.String("k_cache_dtype", "bf16") != "fp8_e4m3" {
		return paged.AttendedRows("k_cache")(in)
	}
	read, err := paged.AttendedEntries(in, "k_cache")
	if err != nil {
		return nil, err
	}
	q := in.Tensors["q"]
	if q == nil || len(q.Shape) != 3 {
		return nil, fmt.Errorf("tensor q missing or misshapen")
	}
	p, dk := in.Tensors["k_cache"].Shape[1], q.Shape[2]
	block := dsa.FP8BlockBytes(p, dk)
	return func(i int) bool {
		blk, r := i/block, i%block
		off := r / max(dk, 1)
		if r >= p*dk {
			off = (r - p*dk) / 4
		}
		return blk*p+off < len(read) && read[blk*p+off]
	}, nil
}

// withRequestLens is in with per-row seq_lens [B, next_n] replaced by each
// request's longest row, the tokens its pages hold.
func withRequestLens(in Inputs, sl *tensor.Tensor) Inputs {
	b, n := sl.Shape[0], sl.Shape[1]
	lens := make([]int64, b)
	for i := 0; i < b*n; i++ {
		lens[i/max(n, 1)] = max(lens[i/max(n, 1)], sl.Int64At(i))
	}
	ts := make(map[string]*tensor.Tensor, len(in.Tensors))
	for k, v := range in.Tensors {
		ts[k] = v
	}
	ts["seq_lens"] = tensor.FromInt64s(sl.DType, []int{b}, lens)
	in.Tensors = ts
	return in
}

// outWidth is an output's second dimension: the parameter when given, else
// the captured output's own (when the inputs carry it), else def.
func outWidth(in Inputs, param, output string, def int) (int, error) {
	v, err := in.Params.Int(param, -1)
	if err != nil || v >= 0 {
		return v, err
	}
	if t, ok := in.Tensors[output]; ok && len(t.Shape) == 2 {
		return t.Shape[1], nil
	}
	return def, nil
}

// Spec implements Kernel.
func (k *indexer) Spec() *Spec { return &k.spec }

// IndexerProblem is a validated dsa_indexer: B·next_n query rows over a
// paged key cache, the scores' width and the top-k asked for.
type IndexerProblem struct {
	in Inputs
	// Input is the invocation as reference/dsa reads it (pages checked
	// against the cache, per-row lengths when seq_lens is [B, next_n]).
	Input dsa.Input
	// PageSize, MaxSeq (0: the longest request) and TopK as the
	// parameters and the captured outputs give them.
	PageSize, MaxSeq, TopK int
	// GlobalSlot: topk_indices are cache slots, not token positions.
	GlobalSlot bool
	plan       *dsa.Plan
}

// Inputs implements Problem.
func (p *IndexerProblem) Inputs() Inputs { return p.in }

// Validate implements Kernel.
func (*indexer) Validate(in Inputs) (Problem, error) {
	q := in.Tensors["q"]
	kc := in.Tensors["k_cache"]
	w := in.Tensors["weights"]
	bt := in.Tensors["block_table"]
	sl := in.Tensors["seq_lens"]
	if err := CheckShape("k_cache", kc, -1, -1, -1); err != nil {
		return nil, err
	}
	ps, err := in.Params.Int("page_size", kc.Shape[1])
	if err != nil {
		return nil, err
	}
	if ps != kc.Shape[1] {
		return nil, fmt.Errorf("parameter page_size = %d but tensor k_cache holds %d tokens a block (shape %v)", ps, kc.Shape[1], kc.Shape)
	}
	nextN, err := in.Params.Int("next_n", 1)
	if err != nil {
		return nil, err
	}
	if nextN < 1 {
		return nil, fmt.Errorf("parameter next_n = %d: want at least 1 query a request", nextN)
	}
	// seq_lens [B, next_n]: each row's own length (vLLM's native
	// speculative decode, CTX_PER_ROW); the request's pages hold the
	// longest
	var rowLens []int
	if sl != nil && len(sl.Shape) == 2 {
		if sl.Shape[1] != nextN || !sl.DType.IsInt() {
			return nil, fmt.Errorf("tensor seq_lens is %s %v: per-row lengths are an integer [B, next_n = %d]", sl.DType, sl.Shape, nextN)
		}
		rowLens = make([]int, sl.Len())
		for i := range rowLens {
			rowLens[i] = int(sl.Int64At(i))
		}
		sl = withRequestLens(in, sl).Tensors["seq_lens"]
	}
	pages, err := kvcache.NewPages(bt, sl, ps, kc.Shape[0])
	if err != nil {
		return nil, err
	}
	maxSeq, err := outWidth(in, "max_seq", "scores", 0)
	if err != nil {
		return nil, err
	}
	topk, err := outWidth(in, "topk", "topk_indices", -1)
	if err != nil {
		return nil, err
	}
	if topk <= 0 {
		return nil, fmt.Errorf("parameter topk is missing or not positive (%d), and no topk_indices tensor gives it", topk)
	}
	kd, err := indexerCacheKind(in.Params, kc)
	if err != nil {
		return nil, err
	}
	global, err := in.Params.Enum("topk_index", "request", topkIndexKinds...)
	if err != nil {
		return nil, err
	}
	scaleFmt, err := in.Params.Enum("k_scale_fmt", dsa.ScaleAny, dsa.ScaleAny, dsa.ScaleAmax, dsa.ScaleUE8M0)
	if err != nil {
		return nil, err
	}
	if scaleFmt != dsa.ScaleAny && kd != "fp8_e4m3" {
		return nil, fmt.Errorf("parameter k_scale_fmt = %s declares how an fp8 indexer cache's scales were written, but k_cache_dtype = %s has no scales", scaleFmt, kd)
	}
	din := dsa.Input{Q: q, KCache: kc, FP8: kd == "fp8_e4m3", Weights: w, Pages: pages, NextN: nextN, RowLens: rowLens, ScaleFmt: scaleFmt}
	plan, err := dsa.Prepare(din, maxSeq)
	if err != nil {
		return nil, err
	}
	return &IndexerProblem{in: in, Input: din, PageSize: ps, MaxSeq: maxSeq, TopK: topk, GlobalSlot: global == "global_slot", plan: plan}, nil
}

// Reference implements Kernel.
func (*indexer) Reference(ctx context.Context, pr Problem, prec Precision, outDTypes OutDTypes) ([]Output, error) {
	p := pr.(*IndexerProblem)
	din, q, pages, ps, maxSeq, topk, nextN := p.Input, p.Input.Q, p.Input.Pages, p.PageSize, p.MaxSeq, p.TopK, max(p.Input.NextN, 1)
	s, err := p.plan.Compute(ctx)
	if err != nil {
		return nil, err
	}
	exTop, epTop := s.TopK(topk)
	slots := dsa.NewSlots(pages, s)
	if p.GlobalSlot {
		exTop, epTop = slots.Map(exTop, topk), slots.Map(epTop, topk)
	}
	hi, dk := q.Shape[1], q.Shape[2]
	// With next_n > 1 an output row is a query, not a request: the
	// request and the query's place in it are named beside it.
	rowAxis := KindRequest
	rowOf := func(dst []Coord, _ int) []Coord { return dst }
	if nextN > 1 {
		rowAxis = KindRow
		rowOf = func(dst []Coord, r int) []Coord {
			return append(dst, Coord{Kind: KindRequest, Value: r / nextN}, Coord{Kind: KindQPos, Value: r % nextN})
		}
	}
	pos := func(dst []Coord, idx []int) []Coord {
		r, t := idx[0], idx[1]
		b := r / nextN
		blk := -1
		if t < pages.SeqLens[b] {
			blk, _ = pages.Locate(b, t)
		}
		cs := append(dst, Coord{Kind: KindPage, Value: t / ps}, Coord{Kind: KindPageOffset, Value: t % ps}, Coord{Kind: KindBlock, Value: blk})
		return rowOf(cs, r)
	}
	scores := Output{
		Name:      "scores",
		Shape:     []int{s.B, s.MaxSeq},
		DType:     tensor.F32,
		Exact:     Dense(s.Exact),
		Expected:  Dense(s.Expected),
		Mode:      Numeric,
		Reduction: dk + hi + 1,
		Coords:    Coords{Axes: []CoordKind{rowAxis, KindToken}, Derived: pos},
	}
	top := Output{
		Name:     "topk_indices",
		Shape:    []int{s.B, topk},
		DType:    tensor.I32,
		Exact:    Dense(int32s(exTop)),
		Expected: Dense(int32s(epTop)),
		Mode:     Bitwise,
		// A top-k entry is judged by its score, not its position: any
		// token whose score ties the k-th within the fp32 noise is right.
		Equivalent: func(i int, actual float64) bool {
			return s.TopKAccepts(i/topk, topk, int64(actual))
		},
		Reduction: dk + hi + 1,
		Coords:    Coords{Axes: []CoordKind{rowAxis, KindRank}, Derived: func(dst []Coord, idx []int) []Coord { return rowOf(dst, idx[0]) }},
	}
	if p.GlobalSlot {
		// a slot is judged as the request's token it holds: one the row
		// cannot see (another request's, a future one's) is no token of it
		top.Equivalent = func(i int, actual float64) bool {
			r := i / topk
			if actual == -1 {
				return s.TopKAccepts(r, topk, -1)
			}
			t, ok := slots.Token(r, int64(actual))
			return ok && s.TopKAccepts(r, topk, int64(t))
		}
	}
	if nextN > 1 {
		sus, err := futureSuspects(ctx, din, maxSeq, topk, p.GlobalSlot)
		if err != nil {
			return nil, err
		}
		scores.Suspects, top.Suspects = sus[:1], sus[1:]
	}
	return []Output{scores, top}, nil
}

// topkIndexKinds are the topk_index values: the indexer's own output
// (token positions in the request) or vLLM's conversion of it to global
// cache slots (vllm 0.33.0 vllm/v1/attention/backends/mla/sparse_utils.py:
// 493-637, triton_convert_req_index_to_global_index: `out = block_table[req,
// tok // BLOCK_SIZE] * BLOCK_STRIDE_ROWS + tok % BLOCK_SIZE`, -1 where tok
// < 0 or its block is outside the table, :150-194; called by FLASHMLA_SPARSE
// before the attention, vllm/v1/attention/backends/mla/flashmla_sparse.py:
// 914-922). kcheck's slots are block·P + offset (BLOCK_STRIDE_ROWS = P, a
// cache whose blocks are contiguous; reference/CONTRACTS.md §3.7).
var topkIndexKinds = []string{"request", "global_slot"}

// futureTokensVisible is the suspect's pattern, one internal/signature
// declares (not imported: its tests register every kernel family).
const futureTokensVisible = "future_tokens_visible"

// futureSuspects are the scores and top-k an indexer that drops the next_n
// causal limit leaves: every query row of a request sees all seq_len
// tokens, its own future included. The signature names the failure
// future_tokens_visible when the failing elements hold these values.
func futureSuspects(ctx context.Context, din dsa.Input, maxSeq, topk int, global bool) ([]Suspect, error) {
	rows, err := dsa.AllVisible(din)
	if err != nil {
		return nil, err
	}
	s, err := dsa.Compute(ctx, rows, maxSeq)
	if err != nil {
		return nil, err
	}
	_, ep := s.TopK(topk)
	if global {
		// each row is a request of its own here, with its request's table
		ep = dsa.NewSlots(rows.Pages, s).Map(ep, topk)
	}
	const detail = "an indexer that lets each next_n query row see every token of its request, its own future ones included (the causal limit t <= q_offset dropped)"
	// A kernel with the bug is an fp32 evaluation in its own order: within
	// Bound of the exact score, as Expected is, so within twice Bound of it.
	within := make([]float64, len(s.Bound))
	for i, b := range s.Bound {
		within[i] = 2 * b
	}
	return []Suspect{
		{Pattern: futureTokensVisible, Detail: detail, Values: Dense(s.Expected), Within: Dense(within)},
		{Pattern: futureTokensVisible, Detail: detail, Values: Dense(int32s(ep))},
	}, nil
}

func int32s(v []int32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// indexerCacheKinds are the k_cache_dtype values: the two 16-bit caches,
// auto (the tensor's own of them, as kv_cache_dtype's auto) and vLLM's fp8
// layout.
var indexerCacheKinds = []string{"bf16", "fp16", "auto", "fp8_e4m3"}

// indexerCacheKind reads k_cache_dtype for the cache kc: auto is resolved
// from its dtype, and a 16-bit kind must be the tensor's.
func indexerCacheKind(p Params, kc *tensor.Tensor) (string, error) {
	kd, err := p.Enum("k_cache_dtype", "bf16", indexerCacheKinds...)
	if err != nil {
		return "", err
	}
	want := map[string]tensor.DType{"bf16": tensor.BF16, "fp16": tensor.F16}
	if kd == "auto" {
		for k, d := range want {
			if kc.DType == d {
				return k, nil
			}
		}
		return "", fmt.Errorf("parameter k_cache_dtype = auto means the cache's own dtype (BF16 or F16), but tensor k_cache is %s: vLLM's fp8 indexer cache needs k_cache_dtype fp8_e4m3", kc.DType)
	}
	if d, ok := want[kd]; ok && kc.DType != d {
		return "", fmt.Errorf("tensor k_cache has dtype %s; k_cache_dtype %s stores %s", kc.DType, kd, d)
	}
	return kd, nil
}
