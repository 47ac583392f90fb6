// Package mla is the reference for absorbed multi-head latent attention
// decode over a paged latent cache (reference/CONTRACTS.md §3.6 `mla_decode`, §3.7
// `mla_decode_sparse`), FlashMLA's layout: every query head attends the same
// cache rows k_j = [c_kv (L) | k_pe (R)] (D = L + R), with the latent query
// q = [q_nope·W_UK (L) | q_pe (R)] already absorbed, and the values are the
// first V columns of the same rows (V = L unless Config.ValueDims says
// otherwise: DeepSeek-V4's values are the whole entry, V = D):
//
//	score_j = softmax_scale · q·k_j,  p = softmax(score),  out = Σ_j p_j·k_j[:V],  lse = log Σ_j exp(score_j)
//
// Two answers are computed in one pass over the cache. Exact is float64
// throughout (q and the cache as stored, fp8 entries dequantized exactly,
// e4m3·scale), online softmax over the blocks of step 3 (its exp is expDef,
// within 2 ulp of e^x). Expected is what a
// correct kernel of the declared Precision writes, with FlashMLA's
// (FlashAttention-2's) arithmetic in this fixed order:
//
//  1. each cache row dequantized to Precision.KVDequant (the fp32 product
//     e4m3·scale rounded to bf16); q as stored;
//  2. scores s = q·k accumulated in Precision.Acc over k-blocks of 16 (a
//     tensor-core MMA's k: the 16 products summed in float64, the block sum
//     added to the accumulator with one rounding);
//  3. online softmax over blocks of Precision.SoftmaxBlock tokens (64 as
//     FlashMLA unless declared), in fp32 whatever Acc says
//     (the softmax statistics are not MMA accumulators): running raw max m;
//     p = exp2f(fma(s, scale·log2e, -fp32(m·scale·log2e))); on a new max the
//     running sum and output are rescaled by exp2f(fp32(m_old - m_new)·scale·log2e);
//     the running sum adds the unrounded p;
//  4. P rounded to Precision.P before the PV product;
//  5. PV accumulated in Acc one token at a time, in token order, so that
//     Acc = BF16 is the precision fault it is in a real kernel;
//  6. out = fp32(acc·fp32(1/sum)) rounded to the output dtype;
//     lse = fp32(m·scale + logf(sum)) (base 2: m·scale·log2e + log2f(sum)).
//
// Empty rows (no token visible) have out 0 (NaN when Config.EmptyRowNaN
// declares it) and lse = lse_empty; empty split-K partials have out 0 and
// lse -inf whatever lse_empty says.
//
// Cost and determinism: the cache is read through kvcache.Cache one row at a
// time, each row decoded once per unit of work and used for every head and
// query position of the unit, so memory stays bounded by a few chunks of
// rows however long the context. Units (request × head group, × split for
// partials, × query position for sparse) run in parallel; every output
// element is computed by exactly one unit in a fixed token order, so the
// results are bit-identical whatever GOMAXPROCS or Config.Workers is.
package mla

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"

	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/kvcache"
	"github.com/kcheck-dev/kcheck/reference/parallel"
	"github.com/kcheck-dev/kcheck/reference/splitk"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Block is the default number of tokens of one online-softmax step:
// FlashMLA's KV tile, PAGE_BLOCK_SIZE = 64 in csrc/sm90/decode/dense/
// config.h (deepseek-ai/FlashMLA at 9241ae3e), over which splitkv_mla.cuh
// takes the running max (cur_max, new_max) before exp2f. A kernel with
// another tile declares it (Precision.SoftmaxBlock, metadata
// softmax_block): both answers step by it; it changes Expected's rounding
// (which max each P is rounded against), not its correctness.
const Block = 64

// MaxSoftmaxBlock bounds a declared block: the scratch space of each worker
// grows with it.
const MaxSoftmaxBlock = 4096

// MMAK is the k-depth of one emulated tensor-core MMA in the Expected score
// accumulation.
const MMAK = 16

// Config holds a decode's parameters.
type Config struct {
	// SoftmaxScale multiplies q·k (reference/CONTRACTS.md §3.6: no default).
	SoftmaxScale float64
	// Causal masks bottom-right: query i of s_q sees tokens < seq_len - s_q + 1 + i.
	// (Dense decode only: the sparse indices already say what a query sees.)
	Causal bool
	// LSE is the lse base and the empty-row lse of the final lse.
	LSE splitk.Convention
	// EmptyRowNaN makes out NaN for a row that sees no token (and lse
	// LSE.Empty), as a stage 2 that divides the empty row's zero
	// accumulator by its zero sum with no guard writes it (vLLM's and
	// SGLang's Triton decode); false: out 0, the contract's empty row.
	// The split-K partials of an empty split are 0 either way.
	EmptyRowNaN bool
	// Workers bounds the goroutines (0: GOMAXPROCS). It never changes results.
	Workers int
	// ValueDims is V, the leading columns of each cache row that are its
	// value (0: L, the latent part, as DeepSeek-V3's absorbed MLA, where the
	// rope part is key only). DeepSeek-V4 attends one 512-dim vector that is
	// both key and value, rope dims included: FlashMLA's sparse decode takes
	// d_v = 512 (csrc/api/sparse_decode.h:236) and its reference multiplies
	// by gathered_kv[..., :d_v] (tests/ref.py:90), with d_qk = 512 for the
	// MODEL1 cache, so V = D there (deepseek-ai/FlashMLA@9241ae3).
	ValueDims int
}

// emptyOut is out for a row that sees no token.
func (c *Config) emptyOut() float64 {
	if c.EmptyRowNaN {
		return math.NaN()
	}
	return 0
}

// V is the value width over a cache of latent width l.
func (c *Config) V(l int) int {
	if c.ValueDims == 0 {
		return l
	}
	return c.ValueDims
}

// Precision is the declared precision the Expected answer emulates, and the
// dtypes the outputs are stored in.
type Precision struct {
	Acc, P, KVDequant tensor.DType // F64, F32, BF16 or F16
	// SoftmaxBlock is the tokens of one online-softmax step (0: Block).
	SoftmaxBlock           int
	Out, LSE               tensor.DType // final outputs' dtypes
	PartialOut, PartialLSE tensor.DType // split-K partials' dtypes
}

// DefaultPrecision is the engines': fp32 accumulation, bf16 P and dequantized
// KV, bf16 out, fp32 lse and partials.
func DefaultPrecision() Precision {
	return Precision{Acc: tensor.F32, P: tensor.BF16, KVDequant: tensor.BF16,
		Out: tensor.BF16, LSE: tensor.F32, PartialOut: tensor.F32, PartialLSE: tensor.F32}
}

// Query is q [B, SQ, H, D], values as stored.
type Query struct {
	B, SQ, H, D int
	Data        []float64
}

// Dense is a paged decode's input: every query of request b attends tokens
// [0, seq_lens[b]) (causally masked when Config.Causal) through the block table.
type Dense struct {
	Q     Query
	Cache *kvcache.Cache
	Pages *kvcache.Pages
}

// Sparse is a DSA decode's input: query (b, i) attends the cache slots
// Indices[b, i, :] (block*P + offset); -1 or a slot outside the cache is not
// attended. A slot listed twice is attended twice, as a kernel would.
//
// TopKLength, when set, holds per request b how many of the leftmost
// indices count (FlashMLA's topk_length: "only the leftmost topk_length
// indices will be processed", deepseek-ai/FlashMLA@9241ae3
// flash_mla/flash_mla_interface.py:93, tests/ref.py:72-73). AttnSink, when
// set, holds per head h a logit that joins the softmax's denominator but
// has no value: out is scaled by 1/(1 + exp(sink_h - lse)) and lse is left
// as it is (interface.py:90, tests/ref.py:96-98; a sink of +inf gives out
// 0, and a row that sees no token still gives out 0 and the empty lse).
type Sparse struct {
	Q          Query
	Cache      *kvcache.Cache
	TopK       int
	Indices    []int64   // [B, SQ, TopK]
	TopKLength []int64   // [B], or nil
	AttnSink   []float64 // [H] (F32 values), or nil
	// Extra, when set, is FlashMLA's extra KV scope: a second cache whose
	// selected slots each query attends in the same softmax, after its own
	// (flash_mla_interface.py:89, "will attend to these extra tokens in
	// addition to those in k_cache"; tests/ref.py:76-80 concatenates the
	// two gathered sets along topk). DeepSeek-V4's decode passes its
	// sliding-window cache as k_cache and its compressed cache here (vllm
	// 0.33.0 vllm/models/deepseek_v4/nvidia/flashmla.py:248-263).
	Extra *SparseScope
}

// SparseScope is a cache and the slots of it each query attends: Indices
// [B, SQ, TopK], -1 or a slot outside it not attended, TopKLength [B] (or
// nil) how many of the leftmost count.
type SparseScope struct {
	Cache      *kvcache.Cache
	TopK       int
	Indices    []int64
	TopKLength []int64
}

// Outputs are a decode's outputs: Out [B, SQ, H, L] and LSE [B, H, SQ] (the
// lse axes are ordered as FlashMLA stores them).
type Outputs struct {
	Out, LSE []float64
	// LSENoise (exact answer only) is, for each lse, the typical size of
	// the error a correct kernel's own score accumulation puts into it
	// (ScoreNoise): Expected sums its scores in MMA-sized blocks of 16
	// exact products, so its floor misses what another fp32 order does.
	LSENoise []float64
}

// ScoreNoise is the rms error of an fp32 (unit roundoff u) accumulation
// of the D products x_d = q_d·k_d of one score, in an order kcheck does not
// know: to first order the error is Σ_k δ_k·S_k over the partial sums
// S_k, with δ_k independent and uniform on [-u, u] (variance u²/3). For
// the terms in random order E[S_k²] ≤ (k/D)·‖x‖₂² + (k/D)²·s² (s = Σx),
// so Σ_k E[S_k²] ≤ (D/2)·‖x‖₂² + (D/3)·s², and the rms error is at most
// (u/√3)·(√(D/2)·‖x‖₂ + √(D/3)·|s|). x2bound bounds ‖x‖₂: the engine
// passes ‖q‖∞·‖k‖₂, so nothing per product is kept and each cache row's
// norm is one pass over it. An lse moves by
// Σ_j p_j·Δs_j: its noise is the p-weighted mean of its scores' (errors
// taken as fully correlated, the larger case), times the softmax scale.
func ScoreNoise(u float64, d int, x2bound, s float64) float64 {
	c1, c2 := scoreNoiseCoefs(u, d)
	return c1*x2bound + c2*math.Abs(s)
}

// scoreNoiseCoefs are ScoreNoise's two coefficients, u/√3·√(D/2) and
// u/√3·√(D/3).
func scoreNoiseCoefs(u float64, d int) (c1, c2 float64) {
	n := float64(d)
	return u / math.Sqrt(3) * math.Sqrt(n/2), u / math.Sqrt(3) * math.Sqrt(n/3)
}

// Partials are split-K intermediates: Out [B, SQ, H, S, L] (each split
// normalized by its own sum) and LSE [B, SQ, H, S], over the token ranges
// Bounds [B, S+1].
type Partials struct {
	S        int
	Bounds   []int
	Out, LSE []float64
	LSENoise []float64 // as Outputs.LSENoise, for each split's lse
}

// Visible is the number of tokens query i of sq sees in a request of seqLen
// tokens: seqLen, or with the bottom-right causal mask seqLen - sq + 1 + i
// (clamped to [0, seqLen]).
func Visible(seqLen, sq, i int, causal bool) int {
	if !causal {
		return seqLen
	}
	return max(0, min(seqLen, seqLen-sq+1+i))
}

// DefaultBounds is the split of reference/CONTRACTS.md §3.6 when split_bounds is absent:
// ceil(seq_len/S) tokens a split, the last one shorter, trailing splits empty.
// The result is [B, S+1].
func DefaultBounds(seqLens []int, s int) []int {
	out := make([]int, len(seqLens)*(s+1))
	for b, n := range seqLens {
		per := 0
		if s > 0 {
			per = (n + s - 1) / s
		}
		for k := 0; k <= s; k++ {
			out[b*(s+1)+k] = min(k*per, n)
		}
	}
	return out
}

// CheckBounds reports split bounds [B, S+1] that are not monotone or do not
// cover [0, seq_len], naming split_bounds and the index.
func CheckBounds(bounds, seqLens []int, s int) error {
	if s < 1 {
		return fmt.Errorf("split count S = %d: want at least 1", s)
	}
	if len(bounds) != len(seqLens)*(s+1) {
		return fmt.Errorf("tensor split_bounds has %d entries; [B=%d, S+1=%d] needs %d", len(bounds), len(seqLens), s+1, len(seqLens)*(s+1))
	}
	for b, n := range seqLens {
		row := bounds[b*(s+1) : (b+1)*(s+1)]
		if row[0] != 0 {
			return fmt.Errorf("split_bounds[%d,0] = %d: the first split must start at token 0", b, row[0])
		}
		for k := 1; k <= s; k++ {
			if row[k] < row[k-1] {
				return fmt.Errorf("split_bounds[%d,%d] = %d is below split_bounds[%d,%d] = %d: bounds must not decrease", b, k, row[k], b, k-1, row[k-1])
			}
		}
		if row[s] != n {
			return fmt.Errorf("split_bounds[%d,%d] = %d but seq_lens[%d] = %d: the splits must cover [0, seq_len]", b, s, row[s], b, n)
		}
	}
	return nil
}

// rmode is a rounding of the Expected arithmetic.
type rmode uint8

const (
	r64 rmode = iota
	r32
	rBF16
	rF16
)

func modeOf(what string, d tensor.DType) (rmode, error) {
	switch d {
	case tensor.F64:
		return r64, nil
	case tensor.F32:
		return r32, nil
	case tensor.BF16:
		return rBF16, nil
	case tensor.F16:
		return rF16, nil
	}
	return 0, fmt.Errorf("%s = %q: want F64, F32, BF16 or F16", what, d)
}

func (m rmode) round(x float64) float64 {
	switch m {
	case r32:
		return float64(float32(x))
	case rBF16:
		return formats.RoundBF16(x)
	case rF16:
		return formats.RoundFP16(x)
	}
	return x
}

// exp2f is the correctly rounded fp32 2^x (kernels' ex2.approx is within 2
// ulp of it; reference/CONTRACTS.md §1.1 calls that difference noise).
func exp2f(x float64) float64 { return float64(splitk.Exp2F32(float32(x))) }

// check validates what every decode shares.
func (q *Query) check(c *kvcache.Cache, cfg *Config, prec *Precision) error {
	if c == nil {
		return fmt.Errorf("mla: no cache")
	}
	if q.B < 0 || q.SQ < 0 || q.H < 0 {
		return fmt.Errorf("tensor q has shape [%d, %d, %d, %d]: negative dimension", q.B, q.SQ, q.H, q.D)
	}
	if q.D != c.D() {
		return fmt.Errorf("tensor q has D = %d but the cache rows hold D = L + R = %d + %d = %d", q.D, c.Layout.L, c.Layout.R, c.D())
	}
	if len(q.Data) != q.B*q.SQ*q.H*q.D {
		return fmt.Errorf("tensor q has %d values; [%d, %d, %d, %d] needs %d", len(q.Data), q.B, q.SQ, q.H, q.D, q.B*q.SQ*q.H*q.D)
	}
	if math.IsNaN(cfg.SoftmaxScale) || math.IsInf(cfg.SoftmaxScale, 0) {
		return fmt.Errorf("parameter softmax_scale = %v: want a finite number", cfg.SoftmaxScale)
	}
	if c.Layout.L < 1 {
		return fmt.Errorf("latent dim L = %d: the output needs at least one latent column", c.Layout.L)
	}
	if cfg.ValueDims < 0 || cfg.ValueDims > c.D() {
		return fmt.Errorf("head_dim_v = %d: the value is a prefix of the cache row, want 1 to D = %d (0 for L = %d)", cfg.ValueDims, c.D(), c.Layout.L)
	}
	if prec.SoftmaxBlock < 0 || prec.SoftmaxBlock > MaxSoftmaxBlock {
		return fmt.Errorf("softmax_block = %d: want 1 to %d tokens (0 for FlashMLA's %d)", prec.SoftmaxBlock, MaxSoftmaxBlock, Block)
	}
	for _, f := range []struct {
		name string
		d    tensor.DType
	}{{"acc_dtype", prec.Acc}, {"p_dtype", prec.P}, {"kv_dequant_dtype", prec.KVDequant}} {
		if _, err := modeOf(f.name, f.d); err != nil {
			return err
		}
	}
	return nil
}

// checkPages re-checks the used block table entries against this cache (the
// Pages may have been validated against another NB).
func checkPages(p *kvcache.Pages, c *kvcache.Cache, b int) error {
	if p == nil {
		return fmt.Errorf("mla: no block table")
	}
	if p.B() != b {
		return fmt.Errorf("tensor block_table has %d rows but q has B = %d requests", p.B(), b)
	}
	if p.PageSize != c.Layout.PageSize {
		return fmt.Errorf("block table pages of %d tokens but cache pages of %d", p.PageSize, c.Layout.PageSize)
	}
	for r, n := range p.SeqLens {
		if n < 0 || n > p.MaxBlocks*p.PageSize {
			return fmt.Errorf("seq_lens[%d] = %d exceeds the block table's capacity %d*%d = %d", r, n, p.MaxBlocks, p.PageSize, p.MaxBlocks*p.PageSize)
		}
		for j := 0; j*p.PageSize < n; j++ {
			if blk := p.Table[r*p.MaxBlocks+j]; blk < 0 || int(blk) >= c.NB {
				return fmt.Errorf("block_table[%d,%d] = %d is outside the cache (NB = %d)", r, j, blk, c.NB)
			}
		}
	}
	return nil
}

// Decode runs dense paged decode and returns the exact and expected outputs.
func Decode(ctx context.Context, p *Dense, cfg Config, prec Precision) (exact, expected *Outputs, err error) {
	q := &p.Q
	if err := q.check(p.Cache, &cfg, &prec); err != nil {
		return nil, nil, err
	}
	if err := checkPages(p.Pages, p.Cache, q.B); err != nil {
		return nil, nil, err
	}
	e := newEngine(ctx, p.Cache, q, cfg, prec, cfg.LSE.Empty, cfg.emptyOut(), prec.Out, prec.LSE, q.B*q.SQ*q.H)
	L := e.v
	g := headGroup(q.H, p.Pages.SeqLens[:q.B], q.SQ, e.workers)
	for b := 0; b < q.B; b++ {
		n := p.Pages.SeqLens[b]
		tok := func(t int) (int, int) { return p.Pages.Locate(b, t) }
		for h0 := 0; h0 < q.H; h0 += g {
			u := unit{token: tok}
			for i := 0; i < q.SQ; i++ {
				for h := h0; h < min(h0+g, q.H); h++ {
					r := (b*q.SQ+i)*q.H + h
					u.rows = append(u.rows, rowSpec{q: r * q.D, limit: Visible(n, q.SQ, i, cfg.Causal),
						out: r * L, lse: (b*q.H+h)*q.SQ + i})
				}
			}
			e.units = append(e.units, u)
		}
	}
	if err := e.run(); err != nil {
		return nil, nil, err
	}
	return &Outputs{Out: e.ex.out, LSE: e.ex.lse, LSENoise: e.lseNoise}, &Outputs{Out: e.xp.out, LSE: e.xp.lse}, nil
}

// DecodePartials computes the split-K partials of a dense decode over S
// splits; bounds [B, S+1] gives each split's token range (nil: DefaultBounds).
// Query i sees the part of split k below its causal limit; a split it sees
// nothing of is empty (out 0, lse -inf).
func DecodePartials(ctx context.Context, p *Dense, cfg Config, prec Precision, s int, bounds []int) (exact, expected *Partials, err error) {
	q := &p.Q
	if err := q.check(p.Cache, &cfg, &prec); err != nil {
		return nil, nil, err
	}
	if err := checkPages(p.Pages, p.Cache, q.B); err != nil {
		return nil, nil, err
	}
	if s < 1 {
		return nil, nil, fmt.Errorf("split count S = %d: want at least 1", s)
	}
	if bounds == nil {
		bounds = DefaultBounds(p.Pages.SeqLens, s)
	}
	if err := CheckBounds(bounds, p.Pages.SeqLens, s); err != nil {
		return nil, nil, err
	}
	e := newEngine(ctx, p.Cache, q, cfg, prec, math.Inf(-1), 0, prec.PartialOut, prec.PartialLSE, q.B*q.SQ*q.H*s)
	L := e.v
	lens := make([]int, 0, q.B*s)
	for b := 0; b < q.B; b++ {
		for k := 0; k < s; k++ {
			lens = append(lens, bounds[b*(s+1)+k+1]-bounds[b*(s+1)+k])
		}
	}
	g := headGroup(q.H, lens, q.SQ, e.workers)
	for b := 0; b < q.B; b++ {
		n := p.Pages.SeqLens[b]
		for k := 0; k < s; k++ {
			b, lo, hi := b, bounds[b*(s+1)+k], bounds[b*(s+1)+k+1]
			tok := func(t int) (int, int) { return p.Pages.Locate(b, lo+t) }
			for h0 := 0; h0 < q.H; h0 += g {
				u := unit{token: tok}
				for i := 0; i < q.SQ; i++ {
					lim := max(0, min(hi, Visible(n, q.SQ, i, cfg.Causal))-lo)
					for h := h0; h < min(h0+g, q.H); h++ {
						r := (b*q.SQ+i)*q.H + h
						u.rows = append(u.rows, rowSpec{q: r * q.D, limit: lim, out: (r*s + k) * L, lse: r*s + k})
					}
				}
				e.units = append(e.units, u)
			}
		}
	}
	if err := e.run(); err != nil {
		return nil, nil, err
	}
	bc := append([]int(nil), bounds...)
	return &Partials{S: s, Bounds: bc, Out: e.ex.out, LSE: e.ex.lse, LSENoise: e.lseNoise},
		&Partials{S: s, Bounds: bc, Out: e.xp.out, LSE: e.xp.lse}, nil
}

// ValidSlots returns the slots query (b, i) of a sparse decode attends, in
// index order: the entries of Indices[b, i, :] that are >= 0 and < NB*P.
func (p *Sparse) ValidSlots(b, i int) []int {
	return validSlots(p.Cache, p.Q.SQ, p.TopK, p.Indices, p.TopKLength, b, i)
}

// ExtraSlots is ValidSlots of the extra scope (nil without one).
func (p *Sparse) ExtraSlots(b, i int) []int {
	if p.Extra == nil {
		return nil
	}
	x := p.Extra
	return validSlots(x.Cache, p.Q.SQ, x.TopK, x.Indices, x.TopKLength, b, i)
}

func validSlots(c *kvcache.Cache, sq, topk int, indices, topkLength []int64, b, i int) []int {
	n := int64(c.Slots())
	row := indices[(b*sq+i)*topk : (b*sq+i+1)*topk]
	if topkLength != nil {
		row = row[:max(0, min(int64(len(row)), topkLength[b]))]
	}
	var out []int
	for _, v := range row {
		if v >= 0 && v < n {
			out = append(out, int(v))
		}
	}
	return out
}

// DecodeSparse runs the DSA sparse decode (reference/CONTRACTS.md §3.7).
func DecodeSparse(ctx context.Context, p *Sparse, cfg Config, prec Precision) (exact, expected *Outputs, err error) {
	q := &p.Q
	if err := q.check(p.Cache, &cfg, &prec); err != nil {
		return nil, nil, err
	}
	if p.TopK < 0 || len(p.Indices) != q.B*q.SQ*p.TopK {
		return nil, nil, fmt.Errorf("tensor indices has %d entries; [B=%d, s_q=%d, topk=%d] needs %d", len(p.Indices), q.B, q.SQ, p.TopK, q.B*q.SQ*p.TopK)
	}
	if p.TopKLength != nil && len(p.TopKLength) != q.B {
		return nil, nil, fmt.Errorf("tensor topk_length has %d entries; B = %d requests need one each", len(p.TopKLength), q.B)
	}
	if p.AttnSink != nil && len(p.AttnSink) != q.H {
		return nil, nil, fmt.Errorf("tensor attn_sink has %d entries; H = %d heads need one each", len(p.AttnSink), q.H)
	}
	if x := p.Extra; x != nil {
		if x.Cache == nil || x.Cache.D() != p.Cache.D() || x.Cache.Layout.L != p.Cache.Layout.L {
			return nil, nil, fmt.Errorf("extra_k_cache must hold rows of the cache's D = %d (L = %d)", p.Cache.D(), p.Cache.Layout.L)
		}
		if x.TopK < 0 || len(x.Indices) != q.B*q.SQ*x.TopK {
			return nil, nil, fmt.Errorf("tensor extra_indices_in_kvcache has %d entries; [B=%d, s_q=%d, topk=%d] needs %d", len(x.Indices), q.B, q.SQ, x.TopK, q.B*q.SQ*x.TopK)
		}
		if x.TopKLength != nil && len(x.TopKLength) != q.B {
			return nil, nil, fmt.Errorf("tensor extra_topk_length has %d entries; B = %d requests need one each", len(x.TopKLength), q.B)
		}
	}
	e := newEngine(ctx, p.Cache, q, cfg, prec, cfg.LSE.Empty, cfg.emptyOut(), prec.Out, prec.LSE, q.B*q.SQ*q.H)
	if p.Extra != nil {
		e.noteCache(p.Extra.Cache)
	}
	L, P := e.v, p.Cache.Layout.PageSize
	// Each query's slots, the extra scope's after the cache's own, in one
	// softmax (tests/ref.py:80, torch.cat along topk); own counts the
	// cache's. Read once: their counts choose the head group.
	querySlots, own := make([][]int, q.B*q.SQ), make([]int, q.B*q.SQ)
	lens := make([]int, q.B*q.SQ)
	for b := 0; b < q.B; b++ {
		for i := 0; i < q.SQ; i++ {
			k := b*q.SQ + i
			querySlots[k] = p.ValidSlots(b, i)
			own[k] = len(querySlots[k])
			if extra := p.ExtraSlots(b, i); len(extra) > 0 {
				querySlots[k] = append(querySlots[k][:own[k]:own[k]], extra...)
			}
			lens[k] = len(querySlots[k])
		}
	}
	g := headGroup(q.H, lens, 1, e.workers)
	for b := 0; b < q.B; b++ {
		for i := 0; i < q.SQ; i++ {
			slots, n := querySlots[b*q.SQ+i], own[b*q.SQ+i]
			tok := func(t int) (int, int) { return slots[t] / P, slots[t] % P }
			var src func(t int) (*kvcache.Cache, int, int)
			if len(slots) > n {
				xc, xp := p.Extra.Cache, p.Extra.Cache.Layout.PageSize
				src = func(t int) (*kvcache.Cache, int, int) {
					if t < n {
						return p.Cache, slots[t] / P, slots[t] % P
					}
					return xc, slots[t] / xp, slots[t] % xp
				}
			}
			for h0 := 0; h0 < q.H; h0 += g {
				u := unit{token: tok, src: src}
				for h := h0; h < min(h0+g, q.H); h++ {
					r := (b*q.SQ+i)*q.H + h
					rs := rowSpec{q: r * q.D, limit: len(slots), out: r * L, lse: (b*q.H+h)*q.SQ + i}
					if p.AttnSink != nil {
						rs.sink, rs.hasSink = p.AttnSink[h], true
					}
					u.rows = append(u.rows, rs)
				}
				e.units = append(e.units, u)
			}
		}
	}
	if err := e.run(); err != nil {
		return nil, nil, err
	}
	return &Outputs{Out: e.ex.out, LSE: e.ex.lse, LSENoise: e.lseNoise}, &Outputs{Out: e.xp.out, LSE: e.xp.lse}, nil
}

// headGroup chooses how many heads one unit handles. A unit decodes its
// tokens' cache rows once for all its heads, so fewer, larger groups
// repeat less decoding; more, smaller ones keep more workers busy. Each
// entry of tokens is one list of tokens (a request, a split of one, a
// sparse query) that h heads of rowsPerHead query rows attend: its units
// are made in that order, each list cut into groups of heads, and the
// workers take them in turn (parallel.Run). It returns the group whose
// units would finish first on workers, by list scheduling with a unit's
// cost n·(decodeCost + g·rowsPerHead) for n tokens and g heads, the
// fewer groups on a tie. Results do not depend on it.
func headGroup(h int, tokens []int, rowsPerHead, workers int) int {
	if h == 0 || len(tokens) == 0 {
		return 1
	}
	workers = max(workers, 1)
	// At least four units a worker are never needed for balance.
	most := min(h, (4*workers+len(tokens)-1)/len(tokens))
	best, bestSpan := h, math.Inf(1)
	finish := make([]float64, workers)
	for groups := 1; groups <= most; groups++ {
		g := (h + groups - 1) / groups
		clear(finish)
		for _, n := range tokens {
			for h0 := 0; h0 < h; h0 += g {
				heads := min(g, h-h0)
				w := 0
				for i := range finish {
					if finish[i] < finish[w] {
						w = i
					}
				}
				finish[w] += float64(n) * (decodeCost + float64(heads*rowsPerHead))
			}
		}
		if span := slices.Max(finish); span < bestSpan {
			best, bestSpan = g, span
		}
	}
	return best
}

// decodeCost is what decoding a cache row costs, in units of one query
// row's work on it (scores, softmax and PV, both answers): about half,
// measured on DeepSeek-V3's bf16 rows (D = 576) at 128K tokens, where
// eight groups of two heads spent a fifth of the check decoding every row
// eight times (2026-12-07).
const decodeCost = 0.5

// rowSpec is one output row: a (query, head) pair of one unit.
type rowSpec struct {
	q     int // offset of its query vector in Query.Data
	limit int // it attends tokens [0, limit) of its unit's token list
	out   int // offset of its output vector
	lse   int // index of its lse
	// its attention sink's logit (natural log), when it has one
	sink    float64
	hasSink bool
}

// unit is a piece of work: one token list (decoded once) and the rows that
// attend a prefix of it.
type unit struct {
	token func(t int) (block, offset int)
	// src, when set, is token for tokens of more than one cache (a sparse
	// decode's extra scope): the cache each is read from, and where.
	src  func(t int) (c *kvcache.Cache, block, offset int)
	rows []rowSpec
}

type sink struct{ out, lse []float64 }

type engine struct {
	ctx     context.Context // checked between units and between blocks of tokens
	cache   *kvcache.Cache
	q       *Query
	cfg     Config
	prec    Precision
	acc, pm rmode
	deqSame bool // the dequantized row equals the exact one
	// pv32: fp32 accumulation of bf16 or fp16 P times bf16 or fp16
	// values, whose products are exact in fp32 (at most 11 + 11 = 22
	// significant bits of 24) unless they underflow: the Expected PV
	// update can then run in float32 (see pvExpected32).
	pv32 bool
	// exactProducts: every q value is a float32 (24 significant bits), and
	// every cache value kvcache decodes has at most 28 (bf16; e4m3 times an
	// fp32 scale; values rounded to KVDequant), so each product q·k is
	// exact in float64 (at most 52 bits, exponents far from the ends) and
	// may be fused with its addition without changing a bit.
	exactProducts  bool
	empty          float64 // the lse of a row that sees no token
	emptyOut       float64 // and its out
	outDT, lseDT   tensor.DType
	ex, xp         sink
	lseNoise       []float64 // Outputs.LSENoise, one a row
	noise1, noise2 float64   // ScoreNoise's coefficients for Precision.Acc and D
	units          []unit
	v              int // the value columns of a row (Config.V)
	workers        int
	block          int // tokens of one online-softmax step
	// fp32 constants of the Expected softmax
	scale32, scaleLog2 float64
}

func newEngine(ctx context.Context, c *kvcache.Cache, q *Query, cfg Config, prec Precision, empty, emptyOut float64, outDT, lseDT tensor.DType, rows int) *engine {
	acc, _ := modeOf("", prec.Acc)
	pm, _ := modeOf("", prec.P)
	L := cfg.V(c.Layout.L)
	block := prec.SoftmaxBlock
	if block == 0 {
		block = Block
	}
	w := cfg.Workers
	if w <= 0 {
		w = runtime.GOMAXPROCS(0)
	}
	e := &engine{
		ctx: ctx, cache: c, q: q, cfg: cfg, prec: prec, acc: acc, pm: pm,
		deqSame:       c.Layout.Kind.IsFloat() || prec.KVDequant == tensor.F64,
		pv32:          acc == r32 && narrowP(pm) && (c.Layout.Kind.IsFloat() || prec.KVDequant == tensor.BF16 || prec.KVDequant == tensor.F16),
		exactProducts: allFloat32(q.Data),
		empty:         empty, emptyOut: emptyOut, outDT: outDT, lseDT: lseDT,
		ex:       sink{make([]float64, rows*L), make([]float64, rows)},
		xp:       sink{make([]float64, rows*L), make([]float64, rows)},
		lseNoise: make([]float64, rows),
		v:        L,
		workers:  w,
		block:    block,
		scale32:  float64(float32(cfg.SoftmaxScale)),
		// host-side double product, cast once (FlashMLA's scale_softmax_log2)
		scaleLog2: float64(float32(cfg.SoftmaxScale * math.Log2E)),
	}
	e.noise1, e.noise2 = scoreNoiseCoefs(prec.Acc.UnitRoundoff(), q.D)
	return e
}

// noteCache makes the engine fit a second cache it reads rows of (a sparse
// decode's extra scope) of a quantized layout: the Expected rows are then
// dequantized, and the float32 PV shortcut holds only for dequantized rows
// of at most 11 significant bits, as for the first cache.
func (e *engine) noteCache(c *kvcache.Cache) {
	e.deqSame = e.deqSame && (c.Layout.Kind.IsFloat() || e.prec.KVDequant == tensor.F64)
	e.pv32 = e.pv32 && (c.Layout.Kind.IsFloat() || e.prec.KVDequant == tensor.BF16 || e.prec.KVDequant == tensor.F16)
}

// narrowP reports whether P is rounded to a format of at most 11
// significant bits (bf16's 8, fp16's 11): its product with a value of as
// many is exact in float32's 24 (pv32).
func narrowP(m rmode) bool { return m == rBF16 || m == rF16 }

// allFloat32 reports whether every value of x is a float32 (NaN and the
// infinities included).
func allFloat32(x []float64) bool {
	for _, v := range x {
		if float64(float32(v)) != v && v == v {
			return false
		}
	}
	return true
}

// run computes every unit; it stops when e.ctx is done and returns its
// error. A worker's panic (a fault reading a capture that shrank) is raised
// again here (reference/parallel).
func (e *engine) run() error {
	return parallel.Run(e.ctx, len(e.units), e.workers, func() func(int) {
		wk := &worker{e: e}
		return func(u int) { wk.do(&e.units[u]) }
	})
}

// state is one row's online softmax: running max m (of scaled scores for
// Exact, raw fp32 scores for Expected), running sum and output accumulator.
type state struct {
	m, sum float64
	acc    []float64
	// noise is Σ_j exp(s_j - m)·ScoreNoise_j, rescaled with sum (exact
	// state only): noise/sum is the p-weighted score noise of the lse.
	noise float64
}

// A worker holds one goroutine's scratch space, reused from unit to unit.
// Per block of tokens it decodes the cache rows once, computes the scores of
// every row of the unit against them in one blocked pass (scores, both
// answers), runs each row's online-softmax step on its column of scores,
// and adds the probability-weighted values, all rows that attend the same
// tokens together (pvExact, pvExpected32). Every output element sees the
// same operations in the same order as the one-row-at-a-time loops of the
// package doc.
type worker struct {
	e      *engine
	kx, kr []float64 // a block of cache rows [Block][D]: exact, and as the Expected kernel holds them
	q      qpack     // the unit's query rows
	sx, sr []float64 // raw scores [Block][q.stride]: exact dots, expected dots
	px, pr []float64 // probabilities [rows][Block]: exact, and as Expected rounds them
	sc     []float64 // one row's scaled exact scores
	nj     []int     // tokens of the current block each row attends
	ex, xp []state
	acc    []float64
	v32    []float32 // the block's values [Block][L] in float32, when e.pv32
	a32    []float32 // the Expected accumulators of a run of rows, in float32
	p32    []float32 // their probabilities [rows][Block] in float32
	junk   []float64 // the dropped half of a score pass (when !e.deqSame)
	// for ScoreNoise: the rows' ‖q‖∞, the block's exact rows' ‖k‖₂
	qInf, k2 []float64
}

func (w *worker) do(u *unit) {
	e := w.e
	D, L := e.q.D, e.v
	n := len(u.rows)
	if w.kx == nil {
		w.kx = make([]float64, w.e.block*D)
		if !e.deqSame {
			w.kr = make([]float64, w.e.block*D)
		}
		w.sc = make([]float64, w.e.block)
	}
	if e.deqSame {
		w.kr = w.kx
	}
	w.q.pack(e.q.Data, u.rows, D)
	if cap(w.ex) < n {
		w.ex, w.xp = make([]state, n), make([]state, n)
		w.acc = make([]float64, 2*n*L)
		w.px, w.pr = make([]float64, n*w.e.block), make([]float64, n*w.e.block)
		w.nj = make([]int, n)
		w.qInf = make([]float64, n)
	}
	if w.k2 == nil {
		w.k2 = make([]float64, w.e.block)
	}
	if len(w.sx) < w.e.block*w.q.stride {
		w.sx, w.sr = make([]float64, w.e.block*w.q.stride), make([]float64, w.e.block*w.q.stride)
		if !e.deqSame {
			w.junk = make([]float64, w.e.block*w.q.stride)
		}
	}
	w.ex, w.xp, w.nj = w.ex[:n], w.xp[:n], w.nj[:n]
	for r := range n {
		w.qInf[r] = normInf(w.q.rows[r*D : (r+1)*D])
	}
	maxLim := 0
	for r := range u.rows {
		a := w.acc[2*r*L : (2*r+2)*L]
		clear(a)
		w.ex[r] = state{m: math.Inf(-1), acc: a[:L]}
		w.xp[r] = state{m: math.Inf(-1), acc: a[L:]}
		maxLim = max(maxLim, u.rows[r].limit)
	}
	for c0 := 0; c0 < maxLim; c0 += w.e.block {
		if w.e.ctx.Err() != nil {
			return // one unit can be a whole context: stop between its blocks (run reports why)
		}
		c1 := min(c0+w.e.block, maxLim)
		nj := c1 - c0
		for t := c0; t < c1; t++ {
			c := e.cache
			var blk, off int
			if u.src != nil {
				c, blk, off = u.src(t)
			} else {
				blk, off = u.token(t)
			}
			c.Row(blk, off, w.kx[(t-c0)*D:(t-c0+1)*D], tensor.F64)
			if !e.deqSame {
				c.Row(blk, off, w.kr[(t-c0)*D:(t-c0+1)*D], e.prec.KVDequant)
			}
		}
		for t := range nj {
			w.k2[t] = norm2(w.kx[t*D : (t+1)*D])
		}
		minV := 0.0
		if e.pv32 {
			minV = w.values32(nj)
		}
		if e.deqSame {
			scores(&w.q, w.kx, D, nj, w.sx, w.sr, e.acc, e.exactProducts)
		} else { // each answer from its own rows; the other result is dropped
			scores(&w.q, w.kx, D, nj, w.sx, w.junk, e.acc, e.exactProducts)
			scores(&w.q, w.kr, D, nj, w.junk, w.sr, e.acc, e.exactProducts)
		}
		for r, rs := range u.rows {
			w.nj[r] = max(0, min(c1, rs.limit)-c0)
			if w.nj[r] > 0 {
				w.softmaxExact(r, w.nj[r])
				w.softmaxExpected(r, w.nj[r])
			}
		}
		// Rows attending the same number of tokens go through the PV
		// product together, so each value loaded serves all of them.
		for r := 0; r < n; {
			m := w.nj[r]
			g := 1
			for r+g < n && w.nj[r+g] == m {
				g++
			}
			if m > 0 {
				pvExact(w.acc[2*r*L:], 2*L, w.px[r*w.e.block:], w.e.block, w.kx, D, m, L, g)
				if !e.pv32 || !w.pvExpected32(r, m, L, g, minV) {
					for i := r; i < r+g; i++ {
						pvExpected1(w.xp[i].acc, w.pr[i*w.e.block:i*w.e.block+m], w.kr, D, e.acc)
					}
				}
			}
			r += g
		}
	}
	for r, rs := range u.rows {
		w.finish(rs, &w.ex[r], &w.xp[r])
	}
}

// values32 copies the block's value columns to v32 as float32 (exact: they
// are bf16 or fp16 values) and returns the smallest nonzero finite magnitude among
// them (+Inf when there is none).
func (w *worker) values32(nj int) float64 {
	D, L := w.e.q.D, w.e.v
	if len(w.v32) < w.e.block*L {
		w.v32 = make([]float32, w.e.block*L)
	}
	lo := math.Inf(1)
	for j := 0; j < nj; j++ {
		lo = narrow(w.v32[j*L:(j+1)*L], w.kr[j*D:j*D+L], lo)
	}
	return lo
}

// pvExpected32 is pvExpected1 of rows r..r+rows-1 over nj tokens, for
// fp32 accumulation of bf16 or fp16 P and bf16 or fp16 values, when every
// product is at least 2^-126: each product pr·x is then exactly a normal
// float32 (at most 22 significant bits), so float32(acc + pr·x), computed in float64 as
// pvExpected1 does, is the correctly rounded fp32 sum of two float32
// values, which is what float32 arithmetic (or an fp32 fused multiply-add)
// gives too. minV is the smallest nonzero value magnitude of the block
// (values32); the smallest nonzero P comes from narrowing P to float32. When
// their product is below 2^-126 it leaves the accumulators alone and
// returns false: the caller takes pvExpected1. The accumulators and P hold
// float32 values already, so the conversions both ways are exact.
func (w *worker) pvExpected32(r, nj, l, rows int, minV float64) bool {
	if len(w.a32) < rows*l {
		w.a32 = make([]float32, rows*l)
		w.p32 = make([]float32, rows*w.e.block)
	}
	lo := math.Inf(1)
	for i := 0; i < rows; i++ {
		lo = narrow(w.p32[i*w.e.block:i*w.e.block+nj], w.pr[(r+i)*w.e.block:(r+i)*w.e.block+nj], lo)
	}
	if lo*minV < 0x1p-126 {
		return false
	}
	for i := 0; i < rows; i++ {
		narrow(w.a32[i*l:(i+1)*l], w.xp[r+i].acc, 0)
	}
	pvExpected32(w.a32, l, w.p32, w.e.block, w.v32, nj, l, rows)
	for i := 0; i < rows; i++ {
		widenF32(w.xp[r+i].acc, w.a32[i*l:(i+1)*l])
	}
	return true
}

// softmaxExact is the Exact online-softmax step of row r over nj tokens:
// scale the raw dots, rescale the running state on a new maximum, and write
// the probabilities exp(s_j - m) to px (exp is expDef).
func (w *worker) softmaxExact(r, nj int) {
	e, st := w.e, &w.ex[r]
	stride := w.q.stride
	s := w.sc[:nj]
	bm := math.Inf(-1)
	for j := range s {
		s[j] = e.cfg.SoftmaxScale * w.sx[j*stride+r]
		if s[j] > bm {
			bm = s[j]
		}
	}
	if bm > st.m {
		if st.sum != 0 {
			a := expDef(st.m - bm)
			st.sum *= a
			st.noise *= a
			for l := range st.acc {
				st.acc[l] *= a
			}
		}
		st.m = bm
	}
	for j := range s {
		s[j] -= st.m
	}
	p := w.px[r*w.e.block : r*w.e.block+nj]
	expVec(p, s)
	for _, x := range p {
		st.sum += x
	}
	c1, c2 := e.noise1*w.qInf[r], e.noise2
	for j, x := range p {
		st.noise += x * (c1*w.k2[j] + c2*math.Abs(w.sx[j*stride+r]))
	}
}

// norm2 is ‖v‖₂, four partial sums at a time (it runs over every cache
// row a unit decodes).
func norm2(v []float64) float64 {
	var a, b, c, d float64
	i := 0
	for ; i+4 <= len(v); i += 4 {
		a += v[i] * v[i]
		b += v[i+1] * v[i+1]
		c += v[i+2] * v[i+2]
		d += v[i+3] * v[i+3]
	}
	for ; i < len(v); i++ {
		a += v[i] * v[i]
	}
	return math.Sqrt(a + b + c + d)
}

// normInf is ‖v‖∞.
func normInf(v []float64) float64 {
	var m float64
	for _, x := range v {
		if a := math.Abs(x); a > m {
			m = a
		}
	}
	return m
}

// softmaxExpected is the Expected step (package doc, steps 3 and 4): the
// fp32 online softmax on the raw accumulated scores, P rounded to
// Precision.P into pr.
func (w *worker) softmaxExpected(r, nj int) {
	e, st := w.e, &w.xp[r]
	m := e.acc
	stride := w.q.stride
	bm := st.m
	for j := 0; j < nj; j++ {
		if s := w.sr[j*stride+r]; s > bm {
			bm = s
		}
	}
	if bm > st.m {
		if !math.IsInf(st.m, -1) {
			a := exp2f(float64(float32(st.m-bm)) * e.scaleLog2)
			st.sum = float64(float32(st.sum * a))
			for l := range st.acc {
				st.acc[l] = m.round(st.acc[l] * a)
			}
		}
		st.m = bm
	}
	maxScaled := float64(float32(st.m * e.scaleLog2))
	// s·scaleLog2 is exact in float64 (two 24-bit significands): one
	// rounding to fp32 of the difference is the fp32 fma.
	a := w.sc[:nj]
	for j := range a {
		a[j] = w.sr[j*stride+r]*e.scaleLog2 - maxScaled
	}
	p := w.pr[r*w.e.block : r*w.e.block+nj]
	exp2fVec(p, a)
	for j, v := range p {
		st.sum = float64(float32(st.sum + v))
		p[j] = e.pm.round(v)
	}
}

// finish normalizes a row and stores both answers.
func (w *worker) finish(rs rowSpec, ex, xp *state) {
	e := w.e
	L := e.v
	exOut, xpOut := e.ex.out[rs.out:rs.out+L], e.xp.out[rs.out:rs.out+L]
	if rs.limit <= 0 {
		for l := range exOut {
			exOut[l], xpOut[l] = e.emptyOut, e.emptyOut
		}
		e.ex.lse[rs.lse] = e.empty
		e.xp.lse[rs.lse] = splitk.RoundTo(e.lseDT, e.empty)
		return
	}
	// The sink scales out by 1/(1 + exp(sink - lse)) (natural-log lse, as
	// FlashMLA's tests/ref.py:96-98), computed once a row: exactly here, in
	// fp32 from the fp32 lse for the expected answer (a kernel's epilogue).
	exSink, xpSink := 1.0, 1.0
	if rs.hasSink {
		exSink = 1 / (1 + math.Exp(rs.sink-(ex.m+math.Log(ex.sum))))
		xlse := float32(xp.m*e.scale32 + float64(float32(math.Log(xp.sum))))
		xpSink = float64(1 / (1 + float32(math.Exp(float64(float32(rs.sink)-xlse)))))
	}
	for l, a := range ex.acc {
		exOut[l] = a / ex.sum * exSink
	}
	lse := ex.m + math.Log(ex.sum)
	noise := math.Abs(e.cfg.SoftmaxScale) * ex.noise / ex.sum
	if e.cfg.LSE.Base == splitk.Base2 {
		lse *= math.Log2E
		noise *= math.Log2E
	}
	e.ex.lse[rs.lse] = lse
	e.lseNoise[rs.lse] = noise

	inv := float64(float32(1 / xp.sum))
	for l, a := range xp.acc {
		o := float64(float32(a * inv))
		if xpSink != 1 {
			o = float64(float32(o * xpSink))
		}
		xpOut[l] = splitk.RoundTo(e.outDT, o)
	}
	// max·scale is exact in float64; adding the fp32 log and rounding once
	// is the fp32 fma.
	var xl float64
	if e.cfg.LSE.Base == splitk.Base2 {
		xl = float64(float32(xp.m*e.scaleLog2 + float64(float32(math.Log2(xp.sum)))))
	} else {
		xl = float64(float32(xp.m*e.scale32 + float64(float32(math.Log(xp.sum)))))
	}
	e.xp.lse[rs.lse] = splitk.RoundTo(e.lseDT, xl)
}
