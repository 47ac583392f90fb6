// Package dsa is the reference for DeepSeek Sparse Attention's lightning
// indexer (reference/CONTRACTS.md §3.9): for each request b and each cached token t < seq_len,
//
//	score[b, t] = Σ_h w[b, h] · relu(q[b, h] · k_t)
//
// over a paged BF16 key cache [NB, P, Dk] (Dk = 128), -inf past seq_len, and
// the top-k tokens by score.
//
// With next_n > 1 (multi-token prediction: a decode step verifies next_n
// draft tokens) each request has next_n query rows, row n the query at
// position seq_len - next_n + n, and row n sees only the tokens
// t < seq_len - next_n + n + 1: t < context_len and t <= q_offset (vllm
// 0.33.0 vllm/v1/attention/ops/rocm_aiter_mla_sparse.py:500-538,
// fp8_paged_mqa_logits_torch's mask `k_offsets < context_limit &
// k_offsets <= q_offsets`; the Triton kernel's per-row length
// `tl.load(ctx_lens_ptr + b) - NEXT_N + n + 1`, :576-581; the top-k's row
// ends `seq_lens - next_n + 1 + arange(next_n)`, vllm/model_executor/
// layers/indexer_topk.py:279-299). A query must never see a token after
// its own: those scores are -inf and outside every top-k.
//
// The key cache may also be vLLM's fp8 indexer cache: per block, the P
// tokens' Dk e4m3 codes, then their P F32 scales ([P·Dk | P·4] bytes, a
// U8 [NB, P, Dk+4] tensor whose rows are not the tokens' entries), key t
// being codes_t · scale_t. vLLM's kernel scores it as
// (Σ_h w_h · relu(q_h · codes_t)) · scale_t: the scale after the head sum
// (vllm 0.33.0 vllm/v1/attention/ops/rocm_aiter_mla_sparse.py:441-488,
// fp8_paged_mqa_logits_torch, and the Triton kernel's `s = s * sc` after
// `tl.sum`), the same value since the scale is positive. The top-k set is what matters downstream (the
// sparse attention reads those tokens), and a correct fp32 kernel may order
// nearly equal scores differently, so a top-k entry is judged by its score,
// not by its position.
package dsa

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"sort"

	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/kvcache"
	"github.com/kcheck-dev/kcheck/reference/parallel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Input is one indexer invocation.
type Input struct {
	Q       *tensor.Tensor // [B·NextN, Hi, Dk], any float dtype (BF16, or F8_E4M3 with its scale in the weights)
	KCache  *tensor.Tensor // BF16 [NB, P, Dk], or with FP8 U8 [NB, P, Dk+4] (block-split)
	FP8     bool           // KCache is vLLM's block-split fp8 indexer cache
	Weights *tensor.Tensor // [B·NextN, Hi], any float dtype (F32)
	Pages   *kvcache.Pages // block_table and seq_lens ([B] requests), validated against KCache
	// NextN is the query rows a request has (0 or 1: one); rows are
	// request-major, row b·NextN + n the request's n-th query.
	NextN int
	// RowLens, when set, are the tokens each query row sees ([B·NextN],
	// vLLM's per-row context lengths, CTX_PER_ROW), each at most its
	// request's seq_len; else row n sees Visible(seq_len, NextN, n).
	RowLens []int
	// ScaleFmt is the writer convention the fp8 cache's scales declare
	// (ScaleAny, ScaleAmax or ScaleUE8M0). The scores read each stored
	// F32 scale as it is whatever it says; a declared convention is
	// checked on every attended token, so a capture that contradicts it
	// is refused by name rather than read under an assumption.
	ScaleFmt string
}

// The writer conventions of the fp8 indexer cache's per-token scales, as
// vLLM's indexer_k_quant_and_cache writes them (its scale_fmt argument):
// amax, scale = max(amax, 1e-4) / 448 in fp32; ue8m0, that scale rounded
// up to a power of two, exp2f(ceilf(log2f(scale))) (vllm 0.33.0
// vllm/v1/attention/ops/rocm_aiter_mla_sparse.py:150-158, the Triton twin
// of csrc/cache_kernels.cu's indexer_k_quant_and_cache_kernel, which
// vllm/_custom_ops.py:3191 calls). vLLM 0.33.0's DeepSeek-V3.2 indexer
// writes ue8m0 (vllm/model_executor/models/deepseek_v2.py:723
// `self.scale_fmt = "ue8m0"`, passed on by
// vllm/model_executor/layers/sparse_attn_indexer.py:573-579).
const (
	ScaleAny   = "any"
	ScaleAmax  = "amax"
	ScaleUE8M0 = "ue8m0"
)

// ScaleFloor is the smallest scale either writer stores: fp32(1e-4) / 448
// (the amax floor), and for ue8m0 that rounded up to 2^-22.
func ScaleFloor(kind string) float64 {
	s := float64(float32(1e-4) / 448)
	if kind == ScaleUE8M0 {
		return CeilPow2(s)
	}
	return s
}

// CeilPow2 is 2^ceil(log2(x)) for a positive finite x, exactly (a power
// of two is its own; math.Log2 of x a few ulp above one could round down).
func CeilPow2(x float64) float64 {
	frac, exp := math.Frexp(x) // x = frac · 2^exp, frac in [0.5, 1)
	if frac == 0.5 {
		return x
	}
	return math.Ldexp(1, exp)
}

// checkScales refuses a cache whose attended tokens contradict the
// declared writer: an ue8m0 scale must be a power of two, and above the
// floor its token's largest code must be at least 224 (amax / scale lies in
// (224, 448]); an amax scale's token must reach the code 448 (amax / scale
// = 448) unless the scale is the floor.
func (c *fp8Cache) checkScales(p *kvcache.Pages, fmtName string) error {
	if fmtName == "" || fmtName == ScaleAny {
		return nil
	}
	kv := make([]float64, c.dk)
	floor := float32(ScaleFloor(fmtName))
	for b, n := range p.SeqLens {
		for t := 0; t < n; t++ {
			blk, off := p.Locate(b, t)
			s := c.row(blk, off, kv)
			top := 0.0
			for _, v := range kv {
				top = math.Max(top, math.Abs(v))
			}
			where := fmt.Sprintf("tensor k_cache: request %d token %d (block %d, offset %d) has scale %g (%x)", b, t, blk, off, s, s)
			switch {
			case !(s > 0) || math.IsInf(s, 0):
				return fmt.Errorf("%s, not a positive finite scale (k_scale_fmt = %s)", where, fmtName)
			case fmtName == ScaleUE8M0 && CeilPow2(s) != s:
				return fmt.Errorf("%s, not a power of two: the cache was not written with ue8m0 scales as k_scale_fmt = ue8m0 declares (an amax writer's max(amax, 1e-4)/448?)", where)
			case fmtName == ScaleUE8M0 && float32(s) > floor && top < 224:
				return fmt.Errorf("%s and largest code %g: an ue8m0 writer's 2^ceil(log2(amax/448)) leaves the largest code in [224, 448]", where, top)
			case fmtName == ScaleAmax && float32(s) != floor && top != 448:
				return fmt.Errorf("%s and largest code %g, not 448: the cache was not written with amax scales max(amax, 1e-4)/448 as k_scale_fmt = amax declares (a power-of-two ue8m0 writer?)", where, top)
			}
		}
	}
	return nil
}

// Visible is the tokens query row n (of nextN) of a request of seqLen
// tokens sees: seqLen - nextN + n + 1, clamped to [0, seqLen] (a request
// shorter than its queries sees nothing from its first rows, as vLLM's
// clamp(min=0) and tl.maximum(seq_len, 0) do).
func Visible(seqLen, nextN, n int) int {
	return min(max(seqLen-nextN+n+1, 0), seqLen)
}

// fp8Cache reads vLLM's block-split fp8 indexer cache.
type fp8Cache struct {
	data  []byte
	p, dk int
}

// FP8BlockBytes is the bytes of one block of the fp8 indexer cache.
func FP8BlockBytes(p, dk int) int { return p * (dk + 4) }

// row decodes token (blk, off)'s codes into kv (unscaled) and returns its scale.
func (c *fp8Cache) row(blk, off int, kv []float64) float64 {
	base := blk * FP8BlockBytes(c.p, c.dk)
	for j, b := range c.data[base+off*c.dk : base+(off+1)*c.dk] {
		kv[j] = formats.E4M3FN.Decode(b)
	}
	return float64(math.Float32frombits(binary.LittleEndian.Uint32(c.data[base+c.p*c.dk+4*off:])))
}

// Scores holds the indexer scores of every query row, row-major [B, MaxSeq]
// (B is the rows: requests times next_n).
type Scores struct {
	B, MaxSeq int
	// SeqLens are the tokens each row sees (its request's seq_len when
	// next_n is 1, else Visible); NextN is the rows a request has.
	SeqLens []int
	NextN   int
	// Exact accumulates in float64; Expected is a correct fp32 kernel: each
	// dot product q_h·k_t summed in fp32 in index order (the bf16 products
	// are exact in fp32), relu, times w_h rounded to fp32, summed over heads
	// in fp32. Both are -inf past seq_len.
	Exact, Expected []float64
	// Bound[i] bounds |fp32 evaluation - exact| for any summation order:
	// γ_n · Σ_h |w_h| Σ_d |q_hd k_td| with n = Dk + Hi + 1 roundings on the
	// longest path (Higham, Accuracy and Stability, 3.1), u = 2^-24. 0 past
	// seq_len.
	Bound []float64

	kthK   int
	kthTok []int // per query row, the token of the k-th largest exact score (k = kthK), -1 when seq_len <= k
}

// Compute returns the scores of in over MaxSeq = maxSeq columns (every
// seq_len must fit; 0 means max(seq_lens)). Errors name the tensor. It is
// Prepare, then the plan's Compute.
func Compute(ctx context.Context, in Input, maxSeq int) (*Scores, error) {
	pl, err := Prepare(in, maxSeq)
	if err != nil {
		return nil, err
	}
	return pl.Compute(ctx)
}

// Plan is an indexer invocation whose inputs Prepare checked: what
// Compute needs and nothing it must check again. It is read-only, so one
// plan may be computed any number of times, from several goroutines.
type Plan struct {
	in                Input
	b, hi, dk, maxSeq int
	nextN             int
	vis               []int // the tokens each query row sees
	kc                *kvcache.Cache
	fc                *fp8Cache
}

// Prepare checks in against the indexer's contract (the shapes of q,
// weights and the cache, seq_lens against the rows and maxSeq, the fp8
// cache's scales against their declared convention) and returns the plan
// Compute runs. Errors name the tensor and the index.
func Prepare(in Input, maxSeq int) (*Plan, error) {
	q, w, p := in.Q, in.Weights, in.Pages
	if err := q.Check(); err != nil {
		return nil, fmt.Errorf("tensor q: %v", err)
	}
	if err := w.Check(); err != nil {
		return nil, fmt.Errorf("tensor weights: %v", err)
	}
	if len(q.Shape) != 3 || !q.DType.IsFloat() {
		return nil, fmt.Errorf("tensor q has shape %v and dtype %s; want BF16 or F16 [B·next_n, Hi, Dk]", q.Shape, q.DType)
	}
	b, hi, dk := q.Shape[0], q.Shape[1], q.Shape[2]
	nextN := max(in.NextN, 1)
	if len(w.Shape) != 2 || w.Shape[0] != b || w.Shape[1] != hi || !w.DType.IsFloat() {
		return nil, fmt.Errorf("tensor weights has shape %v and dtype %s; want F32 [%d, %d] (q is [B·next_n, Hi, Dk] = %v)", w.Shape, w.DType, b, hi, q.Shape)
	}
	if p.B()*nextN != b {
		if nextN == 1 {
			return nil, fmt.Errorf("tensor seq_lens has %d entries but q has %d rows (next_n = 1: one query a request; an MTP step declares next_n)", p.B(), b)
		}
		return nil, fmt.Errorf("tensor q has %d rows but seq_lens has %d requests of next_n = %d queries (%d rows)", b, p.B(), nextN, p.B()*nextN)
	}
	var kc *kvcache.Cache
	var fc *fp8Cache
	if in.FP8 {
		t := in.KCache
		if err := t.Check(); err != nil {
			return nil, fmt.Errorf("tensor k_cache: %v", err)
		}
		if t.DType != tensor.U8 || len(t.Shape) != 3 || t.Shape[1] != p.PageSize || t.Shape[2] != dk+4 {
			return nil, fmt.Errorf("tensor k_cache is %s %v; an fp8 indexer cache is U8 [NB, P = %d, Dk + 4 = %d] (each block P·Dk e4m3 codes, then P F32 scales)", t.DType, t.Shape, p.PageSize, dk+4)
		}
		fc = &fp8Cache{data: t.Data, p: p.PageSize, dk: dk}
		if err := fc.checkScales(p, in.ScaleFmt); err != nil {
			return nil, err
		}
	} else {
		// a 16-bit cache: the model's dtype (an fp16 model's is F16)
		kind := kvcache.BF16
		if in.KCache != nil && in.KCache.DType == tensor.F16 {
			kind = kvcache.FP16
		}
		lay := kvcache.Layout{Kind: kind, L: dk, PageSize: p.PageSize, Saturate: true}
		var err error
		if kc, err = kvcache.NewNamed("k_cache", in.KCache, lay, 0); err != nil {
			return nil, err
		}
	}
	longest := 0
	for i, n := range p.SeqLens {
		if n > longest {
			longest = n
		}
		if maxSeq > 0 && n > maxSeq {
			return nil, fmt.Errorf("seq_lens[%d] = %d exceeds the scores tensor's %d columns", i, n, maxSeq)
		}
	}
	if maxSeq <= 0 {
		maxSeq = longest
	}
	vis := make([]int, b)
	if in.RowLens != nil && len(in.RowLens) != b {
		return nil, fmt.Errorf("%d per-row seq_lens for %d query rows", len(in.RowLens), b)
	}
	for r := range vis {
		n := p.SeqLens[r/nextN]
		vis[r] = Visible(n, nextN, r%nextN)
		if in.RowLens != nil {
			if v := in.RowLens[r]; v < 0 || v > n {
				return nil, fmt.Errorf("tensor seq_lens[%d, %d] = %d is outside [0, %d], its request's pages", r/nextN, r%nextN, v, n)
			}
			vis[r] = in.RowLens[r]
		}
	}
	return &Plan{in: in, b: b, hi: hi, dk: dk, maxSeq: maxSeq, nextN: nextN, vis: vis, kc: kc, fc: fc}, nil
}

// Compute returns the plan's scores.
func (pl *Plan) Compute(ctx context.Context) (*Scores, error) {
	in, p, q, w := pl.in, pl.in.Pages, pl.in.Q, pl.in.Weights
	b, hi, dk, maxSeq, kc, fc := pl.b, pl.hi, pl.dk, pl.maxSeq, pl.kc, pl.fc
	s := &Scores{B: b, MaxSeq: maxSeq, SeqLens: append([]int(nil), pl.vis...), NextN: pl.nextN,
		Exact: make([]float64, b*maxSeq), Expected: make([]float64, b*maxSeq), Bound: make([]float64, b*maxSeq)}
	n := float64(dk + hi + 1)
	if in.FP8 {
		n++ // the scale's product
	}
	gamma := n * 0x1p-24 / (1 - n*0x1p-24)
	qv := make([]float64, b*hi*dk)
	wv := make([]float64, b*hi)
	q.RowInto(qv, 0, b*hi*dk)
	w.RowInto(wv, 0, b*hi)
	// Units of (request, run of tokens), shared out to GOMAXPROCS
	// goroutines; each score is computed by one of them, so the result does
	// not depend on how many run.
	const run = 512
	per := (maxSeq + run - 1) / run
	err := parallel.Run(ctx, b*per, 0, func() func(int) {
		kv := make([]float64, dk)
		return func(u int) {
			r, t0 := u/per, (u%per)*run
			for t := t0; t < min(t0+run, maxSeq); t++ {
				s.score(kc, fc, p, r, t, qv[r*hi*dk:(r+1)*hi*dk], wv[r*hi:(r+1)*hi], kv, gamma)
			}
		}
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// score fills the three scores of query row r's token t (q and w are the
// row's, kv scratch for one key).
func (s *Scores) score(kc *kvcache.Cache, fc *fp8Cache, p *kvcache.Pages, r, t int, qv, wv, kv []float64, gamma float64) {
	i := r*s.MaxSeq + t
	if t >= s.SeqLens[r] {
		s.Exact[i], s.Expected[i] = math.Inf(-1), math.Inf(-1)
		return
	}
	dk := len(kv)
	blk, off := p.Locate(r/s.NextN, t)
	scale := 1.0
	if fc != nil {
		scale = fc.row(blk, off, kv)
	} else {
		kc.Row(blk, off, kv, tensor.F64)
	}
	var exact, mag float64
	var acc32 float32
	for h := range wv {
		qh := qv[h*dk : (h+1)*dk]
		var d64, a64 float64
		var d32 float32
		for j, k := range kv {
			d64 += qh[j] * k
			a64 += math.Abs(qh[j] * k)
			d32 = float32(d32 + float32(qh[j]*k)) // conversions forbid FMA fusion
		}
		exact += wv[h] * math.Max(d64, 0)
		mag += math.Abs(wv[h]) * a64
		acc32 = float32(acc32 + float32(float32(wv[h])*max(d32, 0)))
	}
	if fc != nil {
		// e4m3 x e4m3 products and their fp32 sums as above; the scale last
		s.Exact[i], s.Expected[i], s.Bound[i] = exact*scale, float64(float32(acc32*float32(scale))), gamma*mag*math.Abs(scale)
		return
	}
	s.Exact[i], s.Expected[i], s.Bound[i] = exact, float64(acc32), gamma*mag
}

// TopK returns the top k tokens of every query row ([B, k] row-major, -1
// padded) by the exact scores and by the expected ones, and remembers the
// k-th exact score of each row for TopKAccepts (a row is a request when next_n is 1).
func (s *Scores) TopK(k int) (exact, expected []int32) {
	exact = make([]int32, 0, s.B*k)
	expected = make([]int32, 0, s.B*k)
	s.kthK, s.kthTok = k, make([]int, s.B)
	for b := 0; b < s.B; b++ {
		lo, n := b*s.MaxSeq, s.SeqLens[b]
		ex := TopK(s.Exact[lo:lo+n], n, k)
		exact = append(exact, ex...)
		expected = append(expected, TopK(s.Expected[lo:lo+n], n, k)...)
		s.kthTok[b] = -1
		if k > 0 && n > k {
			s.kthTok[b] = int(ex[k-1])
		}
	}
	return exact, expected
}

// TopK returns the indices of the k largest values of row[:seqLen], largest
// first, equal values by lower index, -1 padded to k. NaN scores rank last
// and are never chosen.
func TopK(row []float64, seqLen, k int) []int32 {
	idx := make([]int32, 0, seqLen)
	for t := 0; t < seqLen && t < len(row); t++ {
		if !math.IsNaN(row[t]) {
			idx = append(idx, int32(t))
		}
	}
	sort.SliceStable(idx, func(a, b int) bool { return row[idx[a]] > row[idx[b]] })
	out := make([]int32, k)
	for j := range out {
		out[j] = -1
		if j < len(idx) {
			out[j] = idx[j]
		}
	}
	return out
}

// TopKAccepts reports whether actual is a correct entry of query row b's top-k
// (k entries), in any position: -1 when seq_len < k (there must be padding),
// or a token t < seq_len whose exact score is not below the k-th largest by
// more than the two scores' fp32 error bounds (a tie within the noise is not
// a fault). It cannot see the other entries: a token listed twice passes here
// and must be caught by a set check.
func (s *Scores) TopKAccepts(b, k int, actual int64) bool {
	n := s.SeqLens[b]
	if k > 0 && n > k && (s.kthK != k || s.kthTok == nil) {
		s.TopK(k)
	}
	// kthTok is -1 when fewer than k tokens have a score (NaN scores are
	// never chosen): the top-k is every scored token, then -1 padding.
	short := n < k || k > 0 && n > k && s.kthTok[b] < 0
	if actual == -1 {
		return short
	}
	if actual < 0 || actual >= int64(n) || k <= 0 {
		return false
	}
	if n <= k {
		return true
	}
	lo, kth, a := b*s.MaxSeq, s.kthTok[b], int(actual)
	if kth < 0 {
		return !math.IsNaN(s.Exact[lo+a])
	}
	return s.Exact[lo+a]+s.Bound[lo+a] >= s.Exact[lo+kth]-s.Bound[lo+kth]
}

// AllVisible is in with its next_n causal limit dropped: one row a query,
// each a request of its own with the whole context of the request it
// belongs to, its future tokens included. It is the bug a kernel has when
// it ignores the limit, computed so that a failure can be named after it.
func AllVisible(in Input) (Input, error) {
	n, p := max(in.NextN, 1), in.Pages
	if p == nil {
		return in, fmt.Errorf("no block_table and seq_lens")
	}
	rows := p.B() * n
	table := make([]int64, 0, rows*p.MaxBlocks)
	lens := make([]int64, 0, rows)
	for r := 0; r < rows; r++ {
		b := r / n
		for _, blk := range p.Table[b*p.MaxBlocks : (b+1)*p.MaxBlocks] {
			table = append(table, int64(blk))
		}
		lens = append(lens, int64(p.SeqLens[b]))
	}
	nb := 0
	if in.KCache != nil && len(in.KCache.Shape) > 0 {
		nb = in.KCache.Shape[0]
	}
	pages, err := kvcache.NewPages(tensor.FromInt64s(tensor.I32, []int{rows, p.MaxBlocks}, table),
		tensor.FromInt64s(tensor.I32, []int{rows}, lens), p.PageSize, nb)
	if err != nil {
		return in, err
	}
	in.Pages, in.NextN, in.RowLens = pages, 1, nil
	return in, nil
}

// Slots converts top-k token positions to global cache slots and back:
// slot = block_table[b, t / P]·P + t % P, as vLLM converts the indexer's
// output before the sparse attention (vllm 0.33.0
// vllm/v1/attention/backends/mla/sparse_utils.py:150-194 and :493-637,
// triton_convert_req_index_to_global_index, with BLOCK_STRIDE_ROWS = P),
// -1 kept as -1.
type Slots struct {
	p     *kvcache.Pages
	nextN int
	seen  []int // per query row, the tokens it sees
	// token maps, per request, a slot of its visible tokens to the token
	// (built on first use)
	token []map[int64]int
}

// NewSlots returns the slots of s's rows over the pages p.
func NewSlots(p *kvcache.Pages, s *Scores) *Slots {
	return &Slots{p: p, nextN: max(s.NextN, 1), seen: s.SeqLens}
}

// Map returns idx ([rows, k] token positions, -1 padded) as global slots.
func (c *Slots) Map(idx []int32, k int) []int32 {
	out := make([]int32, len(idx))
	for i, t := range idx {
		out[i] = -1
		b := (i / max(k, 1)) / c.nextN
		if t >= 0 && int(t) < c.p.SeqLens[b] {
			blk, off := c.p.Locate(b, int(t))
			out[i] = int32(blk*c.p.PageSize + off)
		}
	}
	return out
}

// Token returns the token of query row r that slot holds, and false when
// the slot holds none the row sees (another request's, a future one's, or
// an unused one).
func (c *Slots) Token(r int, slot int64) (int, bool) {
	if c.token == nil {
		c.token = make([]map[int64]int, c.p.B())
	}
	b := r / c.nextN
	if c.token[b] == nil {
		m := make(map[int64]int, c.p.SeqLens[b])
		for t := c.p.SeqLens[b] - 1; t >= 0; t-- {
			blk, off := c.p.Locate(b, t)
			m[int64(blk*c.p.PageSize+off)] = t // the first token wins a block listed twice
		}
		c.token[b] = m
	}
	t, ok := c.token[b][slot]
	return t, ok && t < c.seen[r]
}
