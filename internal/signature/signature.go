// Package signature names the pattern in where a check's errors fall.
// Bugs leave structure: errors that line up on page boundaries point to the
// paged lookup, on split boundaries to split-K, on alternate elements to
// nibble order, on 16-element blocks or 128-row tiles to block scales, on
// one head to a head-indexing slip, and errors that grow with the context
// length to accumulation precision. Analyze aggregates the per-element
// excess (error over tolerance) by every coordinate the kernel names for an
// element (kernel.Coords: its axes and derived coordinates) and reports the
// coordinate that explains the failures best, or that none does.
//
// Coordinate kinds (kernel.CoordKind) drive the pattern names; a name is
// never read for what it contains:
//
//	last_page_fill                 partial_last_page
//	page_offset                    page_boundary when the failures sit at offsets 0 and/or P-1
//	split, split_start, split_len  split_boundary
//	splits_used                    split_count (how many of a row's splits hold
//	                               tokens: the combine's weighting or its
//	                               empty-split path, not a split boundary)
//	padding                        padding (the padding of a swizzled layout)
//	nibble, parity                 alternating_nibbles (the parity of the last
//	                               axis is added where the kernel names no nibble)
//	block16                        scale_block (16-element scale blocks; a cache
//	                               "block" is a page and stays generic)
//	tile128, col_tile128,          tile (128-row tiles, head tiles)
//	head_tile
//	head_group                     head_group
//	head                           one_head (a single value) or head_group
//	context_len, visible, token    growth_with_context, when the mean excess
//	                               rises monotonically with the coordinate
//
// With Options.Actual, the values themselves are tested first: failing
// elements that hold their pair neighbour's expected value, or bytes whose
// nibbles are exchanged, are alternating_nibbles; an actual output that is
// the expected one times a constant (an inverted global scale, a k_scale
// applied twice) is constant_factor; failing elements that are all zero
// where something else was expected (an output never written) are zeros.
//
// A concentration on any other coordinate is reported as "concentrated".
// "uniform" means failures exist but no coordinate explains them, "isolated"
// that too few elements fail to show a pattern, "none" that nothing fails.
// With Options.NonFinite, special values come first: a NaN or an infinity
// where the expected output has a number (or the reverse) is no rounding
// error, so the pattern is "non_finite" unless a coordinate explains where
// they fall, and every detail starts by counting them. With
// Options.Overflow, an overflow comes before both: a finite answer the
// output dtype rounded to an infinity is "overflow" whatever else the
// elements show (the coordinate that explains where they fall, if one
// does, is kept).
//
// Concentration is judged for significance, not by eye: for a coordinate
// with K values, the values are ranked by excess density and, for each
// top-k set S, the share q of the excess mass in S is compared with the
// share e of the elements in S. If failures fell on elements at random, the
// chance that m of them put a share q into S is at most exp(-m·KL(q‖e))
// (Chernoff); choosing S among C(K,k) sets multiplies that by C(K,k). The
// score m_eff·KL(q‖e) - ln C(K,k), with m_eff = (Σw)²/Σw² the effective
// number of failing elements, must exceed MinScore, and S must be at most a
// quarter of the values (one value when K < 8) holding most of the mass
// (q >= 0.75) in a small part of the elements (q >= 3e; for a half of
// the elements, such as one parity, q >= 0.9), or else hold every failure
// with at least 16 clean elements outside (all of a layout's padding).
package signature

import (
	"context"
	"fmt"
	"iter"
	"math"
	"math/bits"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/parallel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// The patterns.
const (
	None              = "none"
	Uniform           = "uniform"
	Isolated          = "isolated"
	Concentrated      = "concentrated"
	PageBoundary      = "page_boundary"
	SplitBoundary     = "split_boundary"
	PartialLastPage   = "partial_last_page"
	AlternatingNibble = "alternating_nibbles"
	ScaleBlock        = "scale_block"
	Tile              = "tile"
	OneHead           = "one_head"
	HeadGroup         = "head_group"
	GrowthWithContext = "growth_with_context"
	ConstantFactor    = "constant_factor"
	Zeros             = "zeros"
	NonFinite         = "non_finite"
	Overflow          = "overflow"
	Padding           = "padding"
	SplitCount        = "split_count"
	Unwritten         = "unwritten"
	// The suspects of a KV-cache transfer between a prefill and a decode
	// node (kernel.Output.Suspects of kv_cache_transfer).
	BlockTableShift  = "block_table_shift"
	PageSizeMismatch = "page_size_mismatch"
	LayoutMismatch   = "layout_mismatch"
	PartialTransfer  = "partial_transfer"
	// The suspect of a DeepSeek-V4 sparse decode (mla_decode_sparse over
	// fp8_ds_mla_model1): the block-split cache read token by token.
	BlockSplitReadInterleaved = "block_split_read_interleaved"
	// The suspect of a DeepSeek-V4.1 write (kv_cache_write over
	// fp8_ds_mla_v41): FlashMLA's pre-2026.09.30 block-split V4.1 order.
	V41WrittenBlockSplit = "v41_written_block_split"
	// The suspect of a DSA indexer's multi-token (next_n) step: a query
	// row that sees its own future tokens.
	FutureTokensVisible = "future_tokens_visible"
)

// SuspectPatterns are the patterns a kernel's suspects may name.
var SuspectPatterns = []string{BlockTableShift, PageSizeMismatch, LayoutMismatch, PartialTransfer, BlockSplitReadInterleaved, V41WrittenBlockSplit, FutureTokensVisible}

// Signature is the named pattern of a check's errors.
type Signature struct {
	Pattern string `json:"pattern"`
	// Coord is the coordinate that explains the pattern ("" for none,
	// uniform and isolated).
	Coord  string  `json:"coord,omitempty"`
	Detail string  `json:"detail"`
	Groups []Group `json:"groups,omitempty"`
}

// Group is one value of the explaining coordinate.
type Group struct {
	Value int `json:"value"`
	// Share is the group's share of the excess mass; Elements its share of
	// the elements; Failing how many of its elements fail.
	Share    float64 `json:"share"`
	Elements float64 `json:"elements"`
	Failing  int     `json:"failing"`
	// MeanExcess is the mean err/tol over the group's elements.
	MeanExcess float64 `json:"mean_excess"`
}

// Options tune Analyze.
type Options struct {
	// Threshold: an element fails when its excess is above it (default 1).
	Threshold float64
	// Systematic: the check failed on whole-tensor metrics while no
	// element exceeds Threshold; the pattern is then sought in the excess
	// above its 90th percentile rather than in failing elements.
	Systematic bool
	// MinScore is the significance a concentration needs (default 10, a
	// chance probability of about e^-10 after the choice of set); the
	// number of coordinates tried is added to it as ln(count).
	MinScore float64
	// MaxGroups bounds the groups reported (default 8).
	MaxGroups int
	// Actual, when set, returns element i of the actual output. With
	// o.Expected it lets Analyze test whether the failures are swaps:
	// adjacent elements exchanged in pairs, or the two nibbles of a byte
	// exchanged (FP4 nibble order), which no aggregate of the excess shows
	// since both elements of a pair fail alike. It is called from several
	// goroutines at once (the hypotheses count on every core), so it must
	// keep no state of its own (a tensor's Float64At keeps none).
	Actual func(i int) float64
	// NonFinite is how many elements hold NaN or an infinity where the
	// expected output does not, or the reverse.
	NonFinite int
	// Overflow is how many elements are an infinity of OverflowDType (the
	// output's) where the exact answer is finite (compare.Metrics.Overflow).
	Overflow      int
	OverflowDType tensor.DType
	// MaxElements: a tensor with more elements is sampled (every element
	// with excess mass, and a random share of the rest), so that a
	// many-million-element capture is analysed in bounded time (default
	// 1<<21).
	MaxElements int
	// Profile asks AnalyzeProfile for the profile even where the
	// signature needs none (a swap or a constant factor is read from the
	// values alone), with the heat map a report draws.
	Profile bool
	// Judged, when set, is what the comparison's own pass over every
	// element already found, so that the signature reads the failing
	// elements and a sample only, not every element again (issue 17: the
	// signature's passes were two thirds of a failing cache check). It is
	// used only with the default Threshold of 1, the one it was made for.
	Judged *Judged
	// Context, when set, stops the passes over the failing elements
	// between words of the bitmap once it is done: they read the suspects'
	// and the expected values, which an output the size of a KV cache
	// computes on demand. What is returned then is of part of the output,
	// and the caller, whose context it is, discards it.
	Context context.Context
}

// Judged is what one pass over every element's excess found: the elements
// whose excess is above 1 (a bit an element, element i at word i/64, bit
// i%64) and the largest finite excess, NaN left out (0 when none).
type Judged struct {
	Failing   []uint64
	MaxFinite float64
}

// stopWords is how many words of the failing bitmap (64 elements each) a
// pass reads between looks at its context.
const stopWords = 64

type coordStats struct {
	name  string
	kind  kernel.CoordKind
	added bool  // the parity signature adds, not a coordinate of the kernel's
	vals  []int // distinct values, ascending
	// The values' statistics: value v at dense[v] while values stay small
	// and dense enough for an array (most coordinates: heads, pages,
	// offsets, rows), the others in sparse. A map a statistic was most of
	// a failing cache check's signature (issue 17).
	dense    []valueStats
	sparse   map[int]*valueStats
	distinct int
}

// valueStats are one coordinate value's statistics.
type valueStats struct {
	count  float64 // elements (estimated when sampled)
	mass   float64
	excess float64 // sum of (capped) excess over all elements
	max    float64 // the largest excess, +Inf included
	finite float64 // sum of the finite excess (estimated when sampled)
	fail   int
	// seen: the value has statistics; maxSet: max holds one's excess
	seen, maxSet bool
}

// denseValues bounds a coordinate's dense array. A value goes there when
// it is below four times the number of distinct values seen (or below
// 1<<16), so that a few large values never make a large array.
const denseValues = 1 << 22

// cell returns value v's statistics, made on first use.
func (st *coordStats) cell(v int) *valueStats {
	if v >= 0 && v < len(st.dense) {
		c := &st.dense[v]
		if !c.seen {
			c.seen = true
			st.distinct++
		}
		return c
	}
	if c, ok := st.sparse[v]; ok {
		return c
	}
	st.distinct++
	if v >= 0 && v < denseValues && v < max(1<<16, 4*st.distinct) {
		grown := make([]valueStats, min(max(2*len(st.dense), v+1, 64), denseValues))
		copy(grown, st.dense)
		st.dense = grown
		st.dense[v].seen = true
		return &st.dense[v]
	}
	if st.sparse == nil {
		st.sparse = map[int]*valueStats{}
	}
	c := &valueStats{seen: true}
	st.sparse[v] = c
	return c
}

// c returns the statistics of v, one of st.vals.
func (st *coordStats) c(v int) *valueStats {
	if v >= 0 && v < len(st.dense) {
		return &st.dense[v]
	}
	return st.sparse[v]
}

// sortValues lists the values that have statistics, ascending.
func (st *coordStats) sortValues() {
	st.vals = st.vals[:0]
	for v := range st.dense {
		if st.dense[v].seen {
			st.vals = append(st.vals, v)
		}
	}
	for v := range st.sparse {
		st.vals = append(st.vals, v)
	}
	sort.Ints(st.vals)
}

// Analyze finds the pattern in excess (err_i/tol_i for every element of o,
// +Inf allowed for special-value mismatches and errors against a zero
// tolerance). It never returns nil.
//
// Analyze reads excess in sequential passes (o.Expected, o.Before, the
// suspects and Options.Actual at the failing elements on every core, each
// goroutine through forks of its own) and keeps one bit per element
// (which ones fail), so that an output
// of hundreds of millions of elements (a whole KV cache), whose excess is
// computed on demand, is analysed in memory that grows with the number of
// coordinate values, not with 8 bytes an element. The quantiles it needs
// are selected exactly (kthSmallest), not by sorting a copy.
func Analyze(o kernel.Output, excess kernel.Values, opt Options) *Signature {
	sig, _ := AnalyzeProfile(o, excess, opt)
	return sig
}

// AnalyzeProfile is Analyze that also returns the profile the signature
// was read from, when Options.Profile asks for it or the signature needed
// one (nil otherwise): one pass over the elements feeds both the signature
// and the report's plots.
func AnalyzeProfile(o kernel.Output, excess kernel.Values, opt Options) (*Signature, *Profile) {
	sig, prof := analyze(o, excess, opt)
	if !opt.Profile {
		prof = nil
	}
	if opt.Overflow > 0 {
		lead := fmt.Sprintf("%d of %d elements overflow: %s rounds their finite exact answer to an infinity", opt.Overflow, excess.Len(), opt.OverflowDType)
		if opt.NonFinite > 0 {
			lead += fmt.Sprintf("; %d more hold NaN or an infinity where the expected output does not, or the reverse", opt.NonFinite)
		}
		out := &Signature{Pattern: Overflow, Detail: lead}
		switch sig.Pattern {
		case None, Uniform, Isolated:
		default:
			out.Coord, out.Groups = sig.Coord, sig.Groups
			out.Detail += "; " + sig.Detail
		}
		return out, prof
	}
	if opt.NonFinite == 0 {
		return sig, prof
	}
	lead := fmt.Sprintf("%d of %d elements hold NaN or an infinity where the expected output does not, or the reverse", opt.NonFinite, excess.Len())
	switch sig.Pattern {
	case None, Uniform, Isolated:
		return &Signature{Pattern: NonFinite, Detail: lead}, prof
	}
	sig.Detail = lead + "; " + sig.Detail
	return sig, prof
}

func analyze(o kernel.Output, excess kernel.Values, opt Options) (*Signature, *Profile) {
	thr := opt.Threshold
	if thr <= 0 {
		thr = 1
	}
	minScore := opt.MinScore
	if minScore <= 0 {
		minScore = 10
	}
	maxGroups := opt.MaxGroups
	if maxGroups <= 0 {
		maxGroups = 8
	}
	N := excess.Len()
	shape := o.Shape
	if tensor.NumElements(shape) != N || len(shape) == 0 {
		shape = []int{N}
	}

	judged := opt.Judged
	if judged != nil && (thr != 1 || len(judged.Failing) != (N+63)/64) {
		judged = nil // made for another threshold or another output
	}
	var capped func(float64) float64
	if judged != nil {
		capped = capperAt(judged.MaxFinite, thr)
	} else {
		capped = excessCapper(excess, N, thr)
	}
	// ex is the capped excess of element i.
	ex := func(i int) float64 { return capped(excess.At(i)) }
	// weight is an element's share of the excess mass, from its capped excess.
	var weight func(e float64) float64
	if opt.Systematic {
		// The top decile of the excess: where a systematic error that
		// stays under every bound is largest.
		q90 := quantile(N, seqSource(func(yield func(float64) bool) {
			for i := 0; i < N && yield(ex(i)); i++ {
			}
		}), 0.9)
		weight = func(e float64) float64 { return max(e-q90, 0) }
	} else {
		// A failing element weighs 1 + ln(excess/threshold): a gross
		// failure counts more than a marginal one, but an element whose
		// tolerance is nearly zero (an exact output at 0, where one ulp
		// is a subnormal) cannot outweigh thousands of others.
		weight = func(e float64) float64 {
			if e > thr {
				return 1 + math.Log(e/thr)
			}
			return 0
		}
	}
	// The failing elements are marked in a bitmap (one bit an element, a
	// 64th of the float64 excess it replaces), so that the passes that look
	// at them alone need not judge every element again.
	var sw, sw2 float64
	failing := 0
	var failSet []uint64
	if judged != nil && !opt.Systematic {
		// Off the failing elements every weight is 0, and adding 0 leaves
		// a sum's bits as they were: the failing elements alone, in
		// order, give the same sums as every element.
		failSet = judged.Failing
		readAhead(func(yield func(visit) bool) {
			for w, word := range failSet {
				for ; word != 0; word &= word - 1 {
					if !yield(visit{e: ex(w<<6 + bits.TrailingZeros64(word))}) {
						return
					}
				}
			}
		}, func(x visit) {
			v := weight(x.e)
			sw += v
			sw2 += v * v
			failing++
		})
	} else {
		failSet = make([]uint64, (N+63)/64)
		for i := 0; i < N; i++ {
			e := ex(i)
			v := weight(e)
			sw += v
			sw2 += v * v
			if e > thr {
				failing++
				failSet[i>>6] |= 1 << (i & 63)
			}
		}
	}
	// failingSeq yields the failing elements in order, none once
	// opt.Context is done.
	ctx := opt.Context
	if ctx == nil {
		ctx = context.Background()
	}
	failingSeq := func(yield func(int) bool) {
		for w, word := range failSet {
			if w%stopWords == 0 && ctx.Err() != nil {
				return
			}
			for ; word != 0; word &= word - 1 {
				if !yield(w<<6 + bits.TrailingZeros64(word)) {
					return
				}
			}
		}
	}
	// onFailing visits the failing elements on every core (failingBlocks).
	onFailing := func(readers []kernel.Values, newVisitor func(readers []kernel.Values) func(i int)) {
		visitFailing(ctx, failSet, readers, newVisitor)
	}
	maxElems := opt.MaxElements
	if maxElems <= 0 {
		maxElems = DefaultMaxElements
	}
	// Off the failing elements every weight is 0 (but for a systematic
	// error's), so the bitmap tells collect which elements it may leave out
	// of its sample without judging them.
	var weighted []uint64
	if !opt.Systematic {
		weighted = failSet
	}
	// profile is built once, when the signature needs it or the caller asks.
	var prof *Profile
	profile := func() *Profile {
		if prof == nil {
			prof = collect(o, shape, N, excess.At, capped, weight, thr, maxElems, weighted, opt.Profile)
		}
		return prof
	}
	early := func(sig *Signature) (*Signature, *Profile) {
		if opt.Profile && N > 0 {
			profile()
		}
		return sig, prof
	}
	// A suspect the kernel computed is a value no rounding error hits, so
	// one failing element that holds it is evidence (an MTP step's one
	// future token a request); the generic hypotheses need a few.
	if failing >= 1 && opt.Actual != nil && !opt.Systematic {
		if sig := suspectHypothesis(o, N, onFailing, failing, opt.Actual); sig != nil {
			return early(sig)
		}
	}
	if failing >= 4 && opt.Actual != nil && !opt.Systematic {
		if sig := valueHypotheses(o, shape, N, onFailing, failing, opt.Actual); sig != nil {
			return early(sig)
		}
	}
	if sw == 0 {
		if opt.Systematic {
			return early(&Signature{Pattern: Uniform, Detail: "the whole-tensor error exceeds its bound but is spread evenly over the elements"})
		}
		return early(&Signature{Pattern: None, Detail: "no element exceeds its tolerance"})
	}
	mEff := sw * sw / sw2

	stats := profile().stats
	nameTry := math.Log(float64(max(len(stats), 1)))

	type cand struct {
		st    *coordStats
		set   []int
		q, e  float64
		score float64
	}
	// best is the most significant concentration; named, the most
	// significant one whose coordinate names a pattern (a page offset, a
	// split, a scale block...).
	var best, named *cand
	// consider scores the set of values set of st, holding a share q of
	// the excess mass in a share e of the elements, chosen among choices
	// sets of its kind.
	consider := func(st *coordStats, set []int, q, e, choices float64) {
		all := q >= 1-1e-9 && float64(N)*(1-e) >= 16
		if e > 0.5 && !all {
			return
		}
		if !all && (q < 0.75 || q < min(3*e, 0.9)) {
			return
		}
		s := mEff*kl(min(q, 1), e) - choices - nameTry
		if s < minScore {
			return
		}
		// set is a prefix or suffix of a slice that stays as it is (the
		// coordinate's values, or their order by excess density): kept,
		// not copied, since a copy per candidate made this quadratic in
		// the values (71 GB allocated on a failing gather of a 1.2 GB
		// cache, issue 17); sig copies the winner's before sorting it.
		c := cand{st, set, q, e, s}
		if best == nil || c.score > best.score ||
			(c.score == best.score && specificity(c.st) > specificity(best.st)) {
			b := c
			best = &b
		}
		if patternFor(st, c.set) != Concentrated && (named == nil || c.score > named.score) {
			n := c
			named = &n
		}
	}
	for _, st := range stats {
		K := len(st.vals)
		if K < 2 {
			continue
		}
		if countKinds[st.kind] {
			// A count selects a code path by a cut, not by a few values:
			// the rows with fewer than c non-empty splits (an empty
			// split), or with c or more (several splits weighed). One of
			// 2(K-1) cuts; a cut at 1 would only set apart the rows that
			// attend nothing, which no mechanism needs.
			var qBelow, eBelow float64
			for j := 0; j < K-1; j++ {
				v := st.vals[j]
				qBelow += st.c(v).mass / sw
				eBelow += st.c(v).count / float64(N)
				choices := math.Log(float64(2 * (K - 1)))
				consider(st, st.vals[:j+1], qBelow, eBelow, choices)
				if st.vals[j+1] >= 2 {
					consider(st, st.vals[j+1:], 1-qBelow, 1-eBelow, choices)
				}
			}
		}
		order := append([]int(nil), st.vals...)
		sort.SliceStable(order, func(a, b int) bool {
			da := st.c(order[a]).mass / st.c(order[a]).count
			db := st.c(order[b]).mass / st.c(order[b]).count
			return da > db
		})
		var q, e float64
		// A pattern is a few values holding the failures: at most a quarter
		// of the values (one of two or three for a parity or a split), in
		// at most half the elements, unless the set holds every failure and
		// leaves at least 16 clean elements outside (errors in all of the
		// padding, however much of the tensor it is).
		kmax := max(1, K/4)
		for k := 1; k <= kmax; k++ {
			v := order[k-1]
			q += st.c(v).mass / sw
			e += st.c(v).count / float64(N)
			if e > 0.5 && !(q >= 1-1e-9 && float64(N)*(1-e) >= 16) {
				break
			}
			consider(st, order[:k], q, e, lnChoose(K, k))
		}
	}

	sig := func(c *cand) *Signature {
		pat := patternFor(c.st, c.set)
		set := append([]int(nil), c.set...)
		sort.Ints(set)
		return &Signature{
			Pattern: pat,
			Coord:   c.st.name,
			Detail: fmt.Sprintf("errors concentrate on %s %s%s: %.0f%% of the excess in %.1f%% of the elements (%d failing)",
				c.st.name, listValues(set), gloss(pat), 100*c.q, 100*c.e, failing),
			Groups: topGroups(c.st, sw, N, maxGroups),
		}
	}
	// The best concentration wins, unless it is on a request or context
	// coordinate and the excess grows with the context: then the growth is
	// the better explanation (the longest requests fail most).
	if best != nil && !positionKinds[best.st.kind] {
		return sig(best), prof
	}
	// A concentration on requests, tokens, pages or contexts names positions, not
	// a mechanism: tokens 16 and 32 failing are the offset-0 tokens of
	// pages 1 and 2, and listing the tokens fits more tightly than "page
	// offset 0" only because page 0's first token cannot slip. A named
	// pattern that is significant itself explains them better, unless it
	// selects the very same share of the elements and of the excess (two
	// requests, each with its own context and split lengths): then the
	// data cannot tell the two apart, and the position stays.
	if best != nil && named != nil && (math.Abs(named.e-best.e) > 1e-9 || math.Abs(named.q-best.q) > 1e-9) {
		return sig(named), prof
	}
	if t := trend(stats, N, maxGroups); t != nil {
		return t, prof
	}
	if best != nil {
		return sig(best), prof
	}
	// Too few failures to be significant on any coordinate: even if they
	// filled one coordinate value on their own (a share failing/N of the
	// elements holding all of the excess), the score could not reach
	// minScore. Such a set (a minority of the elements) is isolated, not
	// spread over every coordinate.
	tooFew := !opt.Systematic && 2*failing <= N && mEff*math.Log(float64(N)/float64(failing))-nameTry < minScore
	if mEff < 5 || tooFew {
		return &Signature{Pattern: Isolated, Detail: isolatedDetail(o, shape, failingSeq, failing)}, prof
	}
	what := fmt.Sprintf("%d failing elements", failing)
	if opt.Systematic {
		what = "the top decile of the excess"
	}
	return &Signature{Pattern: Uniform, Detail: what + " spread over every coordinate: no coordinate value holds a disproportionate share"}, prof
}

// failingOn visits the failing elements for a hypothesis: readers are the
// on-demand values the visits read, and newVisitor is called once for each
// goroutine with readers of its own (kernel.Fork), returning the function
// that goroutine visits its elements with.
type failingOn func(readers []kernel.Values, newVisitor func(readers []kernel.Values) func(i int))

// failingBlockWords is how many words of the failing bitmap (64 elements
// each) one goroutine visits at a time: few enough that a stopped context
// ends the visits soon, where each reads a cache entry computed on demand.
const failingBlockWords = 1 << 10

// visitFailing visits every failing element (a bit of set) once, a block
// of words at a time, on every core where every reader forks (on one
// goroutine where one does not). The hypotheses count, and a count is a
// sum of integers, the same in any order: a failing gather of 151 M
// elements spent a tenth of its check counting on one goroutine (issue
// 17). Once ctx is done no block starts.
func visitFailing(ctx context.Context, set []uint64, readers []kernel.Values, newVisitor func([]kernel.Values) func(int)) {
	workers := 0
	for _, r := range readers {
		if r != nil && !kernel.Forkable(r) {
			workers = 1
		}
	}
	blocks := (len(set) + failingBlockWords - 1) / failingBlockWords
	var mu sync.Mutex
	first := true
	_ = parallel.Run(ctx, blocks, workers, func() func(int) {
		// The first goroutine reads through the readers it was given, the
		// others through forks of them.
		mine := readers
		mu.Lock()
		if !first {
			mine = make([]kernel.Values, len(readers))
			for k, r := range readers {
				if r != nil {
					mine[k], _ = kernel.Fork(r)
				}
			}
		}
		first = false
		mu.Unlock()
		visit := newVisitor(mine)
		return func(b int) {
			for w := b * failingBlockWords; w < min((b+1)*failingBlockWords, len(set)); w++ {
				for word := set[w]; word != 0; word &= word - 1 {
					visit(w<<6 + bits.TrailingZeros64(word))
				}
			}
		}
	})
}

// perGoroutine hands each goroutine of a parallel pass a value of its own
// (own, called once by each), so that counting takes no lock and shares no
// cache line; all lists them once the pass is over.
type perGoroutine[T any] struct {
	mu  sync.Mutex
	all []*T
}

func (p *perGoroutine[T]) own() *T {
	v := new(T)
	p.mu.Lock()
	p.all = append(p.all, v)
	p.mu.Unlock()
	return v
}

// suspectHypothesis names the failure after the first of the kernel's
// suspects whose values at least 90% of the failing elements hold. It
// comes before any generic hypothesis: it says more (a partial transfer's
// unsent page also still holds what was there before).
func suspectHypothesis(o kernel.Output, N int, onFailing failingOn, failing int, actual func(int) float64) *Signature {
	same := func(a, b float64) bool { return a == b || (math.IsNaN(a) && math.IsNaN(b)) }
	for _, sus := range o.Suspects {
		if sus.Values == nil || sus.Values.Len() != N {
			continue
		}
		within := sus.Within
		if within != nil && within.Len() != N {
			within = nil
		}
		var each perGoroutine[int]
		onFailing([]kernel.Values{sus.Values, within}, func(r []kernel.Values) func(int) {
			values, within, n := r[0], r[1], each.own()
			return func(i int) {
				a, v := actual(i), values.At(i)
				if same(a, v) || within != nil && math.Abs(a-v) <= within.At(i) {
					*n++
				}
			}
		})
		hits := 0
		for _, n := range each.all {
			hits += *n
		}
		if float64(hits) >= 0.9*float64(failing) {
			return &Signature{Pattern: sus.Pattern,
				Detail: fmt.Sprintf("%d of %d failing elements hold what %s leaves", hits, failing, sus.Detail)}
		}
	}
	return nil
}

// valueHypotheses tests explanations of the failing elements' values: at
// least 90% of them must hold exactly the value a swap predicts, or lie
// within 1% of the expected value times their median ratio to it (a factor
// at least 5% away from 1).
func valueHypotheses(o kernel.Output, shape []int, N int, onFailing failingOn, failing int, actual func(int) float64) *Signature {
	if o.Expected == nil || o.Expected.Len() != N {
		return nil
	}
	same := func(a, b float64) bool { return a == b || (math.IsNaN(a) && math.IsNaN(b)) }
	last := len(shape) - 1
	pairs := shape[last]%2 == 0
	bytes := o.DType == tensor.U8
	// ratio is a failing element's actual over its expected value x, when
	// the actual one is finite and x nonzero and not infinite (NaN where x
	// is NaN).
	ratio := func(i int, x float64) (float64, bool) {
		a := actual(i)
		if x != 0 && !math.IsInf(x, 0) && !math.IsNaN(a) && !math.IsInf(a, 0) {
			return a / x, true
		}
		return 0, false
	}
	ratios := func(newSink func() func(float64)) {
		onFailing([]kernel.Values{o.Expected}, func(r []kernel.Values) func(int) {
			expected, sink := r[0], newSink()
			return func(i int) {
				if v, ok := ratio(i, expected.At(i)); ok {
					sink(v)
				}
			}
		})
	}
	before := o.Before
	if before != nil && before.Len() != N {
		before = nil
	}
	var each perGoroutine[struct{ pair, nibble, zeros, kept, ratios int }]
	onFailing([]kernel.Values{o.Expected, before}, func(r []kernel.Values) func(int) {
		expected, before, h := r[0], r[1], each.own()
		return func(i int) {
			a, x := actual(i), expected.At(i)
			if a == 0 {
				h.zeros++
			}
			if before != nil && same(a, before.At(i)) {
				h.kept++
			}
			if _, ok := ratio(i, x); ok {
				h.ratios++
			}
			if pairs && same(a, expected.At(i^1)) {
				h.pair++
			}
			if bytes && x >= 0 && x <= 255 && x == math.Trunc(x) {
				b := uint8(x)
				if same(a, float64(b<<4|b>>4)) {
					h.nibble++
				}
			}
		}
	})
	var pairHits, nibbleHits, zeros, kept, nRatios int
	for _, h := range each.all {
		pairHits += h.pair
		nibbleHits += h.nibble
		zeros += h.zeros
		kept += h.kept
		nRatios += h.ratios
	}
	axis := "dim" + fmt.Sprint(last)
	if last < len(o.Coords.Axes) {
		axis = string(o.Coords.Axes[last])
	}
	switch {
	case float64(kept) >= 0.9*float64(failing):
		return &Signature{Pattern: Unwritten,
			Detail: fmt.Sprintf("%d of %d failing elements still hold what the buffer held before the kernel ran: they were never written (a skipped write, or a stale page taken as already written)", kept, failing)}
	case float64(zeros) >= 0.9*float64(failing):
		return &Signature{Pattern: Zeros,
			Detail: fmt.Sprintf("%d of %d failing elements are 0 where the reference is not: the output was not written there (or an empty-row path was taken)", zeros, failing)}
	case float64(nibbleHits) >= 0.9*float64(failing):
		return &Signature{Pattern: AlternatingNibble, Coord: axis,
			Detail: fmt.Sprintf("%d of %d failing bytes hold the expected byte with its two nibbles exchanged (FP4 nibble order)", nibbleHits, failing)}
	case float64(pairHits) >= 0.9*float64(failing):
		return &Signature{Pattern: AlternatingNibble, Coord: axis,
			Detail: fmt.Sprintf("%d of %d failing elements hold their pair neighbour's expected value (%s 2i and 2i+1 exchanged: FP4 nibble order)", pairHits, failing, axis)}
	}
	if float64(nRatios) >= 0.9*float64(failing) {
		c := quantile(nRatios, ratios, 0.5)
		var each perGoroutine[int]
		ratios(func() func(float64) {
			n := each.own()
			return func(r float64) {
				if math.Abs(r/c-1) <= 0.01 {
					*n++
				}
			}
		})
		near := 0
		for _, n := range each.all {
			near += *n
		}
		if math.Abs(c-1) > 0.05 && c != 0 && float64(near) >= 0.9*float64(failing) {
			return &Signature{Pattern: ConstantFactor,
				Detail: fmt.Sprintf("%d of %d failing elements are the expected value times %.6g (1/%.6g): a scale applied wrongly (inverted, squared or missing)", near, failing, c, 1/c)}
		}
	}
	return nil
}

// collect aggregates the excess by every coordinate value, into a
// Profile: raw(i) is element i's excess, capped(e) its capped value and
// weight(capped) its excess mass. weighted, when not nil, marks (a bit an
// element) every element of nonzero weight: the others need not be judged
// unless they fall in the sample. withGrid also records the heat map.
func collect(o kernel.Output, shape []int, N int, raw func(int) float64, capped, weight func(float64) float64, thr float64, maxElems int, weighted []uint64, withGrid bool) *Profile {
	p := &Profile{N: N, Rate: 1}
	byName := map[string]*coordStats{}
	get := func(name string, kind kernel.CoordKind) *coordStats {
		if st, ok := byName[name]; ok {
			return st
		}
		st := &coordStats{name: name, kind: kind}
		byName[name] = st
		p.stats = append(p.stats, st)
		return st
	}
	add := func(st *coordStats, v int, r, e, w, count float64) {
		c := st.cell(v)
		c.count += count
		c.mass += w
		c.excess += count * e
		if m := c.max; !c.maxSet || r > m || math.IsNaN(m) {
			c.max, c.maxSet = r, true
		}
		if !math.IsInf(r, 0) && !math.IsNaN(r) {
			c.finite += count * r
		}
		if e > thr {
			c.fail++
		}
	}
	// A big tensor is sampled: every element that carries mass is kept,
	// and a pseudo-random share r of the others stands for all of them
	// with weight 1/r (a hash, not a stride, so that no period of the
	// tensor's layout aliases with the sample).
	rate := SampleRate(N, maxElems)
	p.Rate = rate
	// The parity of the last axis, unless the kernel names one itself.
	last := len(shape) - 1
	parityName := ""
	if shape[last] >= 4 && shape[last]%2 == 0 {
		probe := o.Coords.Name(make([]int, len(shape)))
		parityName = probe[last].Name() + "%2"
		for _, c := range probe {
			if c.Kind == kernel.KindNibble || c.Kind == kernel.KindParity {
				parityName = ""
			}
		}
	}
	var parity *coordStats
	var byPos []*coordStats
	gridMade := !withGrid
	gx, gy := -1, -1 // the heat map's coordinates, by position among an element's
	idx, coords := make([]int, len(shape)), []kernel.Coord(nil)
	// The elements to visit: every one, or, where the weighted ones are
	// known and the rest sampled, the weighted ones and the sample,
	// whose bits (InSample's choice) are made on every core a block at a
	// time. The same elements in the same order either way, without a
	// hash an element on this goroutine (a failing gather of 151 M
	// elements spent a quarter of its collect there, issue 17).
	//
	// The visited elements' excess and weight are read ahead of the
	// additions to the coordinates' statistics, which keep their order
	// (readAhead).
	readAhead(func(yield func(visit) bool) {
		for i, sampled := range visits(N, weighted, rate) {
			r := raw(i)
			e := capped(r)
			w := weight(e)
			count := 1.0
			if w == 0 && rate < 1 {
				if !sampled {
					continue
				}
				count = 1 / rate
			}
			if !yield(visit{i, r, e, w, count}) {
				return
			}
		}
	}, func(v visit) {
		i, r, e, w, count := v.i, v.r, v.e, v.w, v.count
		tensor.UnravelInto(idx, i, shape)
		coords = o.Coords.NameInto(coords, idx)
		if !gridMade {
			gridMade = true
			if y, x := gridAxes(coords, shape); y >= 0 {
				gy, gx = y, x
				p.grid = &gridCells{y: coords[y].Name(), x: coords[x].Name(), max: map[[2]int]float64{}}
			}
		}
		for k, c := range coords {
			// The stats of the coordinate at position k, looked up by
			// name once and not per element while the names stay.
			if k >= len(byPos) {
				byPos = append(byPos, nil)
			}
			if st := byPos[k]; st == nil || st.name != c.Name() {
				byPos[k] = get(c.Name(), c.Kind)
			}
			add(byPos[k], c.Value, r, e, w, count)
		}
		if parityName != "" {
			if parity == nil {
				parity = get(parityName, kernel.KindParity)
				parity.added = true
			}
			add(parity, idx[last]%2, r, e, w, count)
		}
		if p.grid != nil && gy < len(coords) && gx < len(coords) {
			k := [2]int{coords[gy].Value, coords[gx].Value}
			if m, ok := p.grid.max[k]; !ok || r > m {
				p.grid.max[k] = r
			}
		}
	})
	for _, st := range p.stats {
		st.sortValues()
	}
	return p
}

// trend looks for excess growing with a context-like coordinate: Spearman
// rank correlation of at least 0.8 between the value and the mean excess
// over at least 4 values, and the mean over the top quarter of values at
// least twice that over the bottom quarter.
func trend(stats []*coordStats, N, maxGroups int) *Signature {
	var best *Signature
	bestRho := 0.0
	for _, st := range stats {
		if !trendKinds[st.kind] || len(st.vals) < 4 {
			continue
		}
		K := len(st.vals)
		means := make([]float64, K)
		for j, v := range st.vals {
			means[j] = st.c(v).excess / st.c(v).count
		}
		rho := spearman(means)
		q := max(K/4, 1)
		var lo, hi float64
		for j := 0; j < q; j++ {
			lo += means[j]
			hi += means[K-1-j]
		}
		if rho < 0.8 || hi < 2*lo || rho <= bestRho {
			continue
		}
		bestRho = rho
		var groups []Group
		step := max(1, (K+maxGroups-1)/maxGroups)
		for j := 0; j < K; j += step {
			v := st.vals[j]
			groups = append(groups, Group{Value: v, Elements: st.c(v).count / float64(N), Failing: st.c(v).fail, MeanExcess: means[j]})
		}
		best = &Signature{
			Pattern: GrowthWithContext,
			Coord:   st.name,
			Detail: fmt.Sprintf("the error grows with %s: mean err/tol %.3g at %s %d rising to %.3g at %d (rank correlation %.2f): an error per token that builds up over the context (accumulation precision, or how the scores are weighted)",
				st.name, means[0], st.name, st.vals[0], means[K-1], st.vals[K-1], rho),
			Groups: groups,
		}
	}
	return best
}

// patternFor names the pattern of a concentration of st's excess on the
// values in set, from st's kind alone: what the coordinate is, never what
// its name happens to contain.
func patternFor(st *coordStats, set []int) string {
	switch st.kind {
	case kernel.KindLastPageFill:
		return PartialLastPage
	case kernel.KindPageOffset:
		top := st.vals[len(st.vals)-1]
		for _, v := range set {
			if v != 0 && v != top {
				return Concentrated
			}
		}
		return PageBoundary
	case kernel.KindSplit, kernel.KindSplitStart, kernel.KindSplitLen:
		return SplitBoundary
	case kernel.KindSplitsUsed:
		return SplitCount
	case kernel.KindPadding:
		return Padding
	case kernel.KindNibble, kernel.KindParity:
		return AlternatingNibble
	case kernel.KindScaleBlock:
		return ScaleBlock // a cache block (KindBlock) is a page, not a scale block
	case kernel.KindTile128, kernel.KindColTile128, kernel.KindHeadTile:
		return Tile
	case kernel.KindHeadGroup:
		return HeadGroup
	case kernel.KindHead:
		if len(set) == 1 {
			return OneHead
		}
		return HeadGroup
	}
	return Concentrated
}

// specificity breaks score ties between coordinates that partition the
// elements the same way: a named pattern beats a generic one.
func specificity(st *coordStats) int {
	if patternFor(&coordStats{kind: st.kind, vals: []int{0}}, []int{0}) == Concentrated {
		return 0
	}
	return 1
}

func gloss(pat string) string {
	switch pat {
	case PageBoundary:
		return " (page boundaries)"
	case SplitBoundary:
		return " (split-K splits)"
	case PartialLastPage:
		return " (the partially filled last page)"
	case Padding:
		return " (layout padding: written where it should be zero, or left unwritten)"
	case AlternatingNibble:
		return " (alternate elements: nibble order)"
	case ScaleBlock:
		return " (scale blocks)"
	case Tile:
		return " (tiles)"
	case OneHead:
		return " (one head)"
	case HeadGroup:
		return " (a group of heads)"
	case SplitCount:
		return " (the number of non-empty splits a row combines: its weighting or its empty-split path)"
	}
	return ""
}

// trendKinds are the coordinates an error can grow with: how many tokens
// a row attends, or where a token sits.
var trendKinds = map[kernel.CoordKind]bool{kernel.KindContextLen: true, kernel.KindVisible: true, kernel.KindToken: true}

// countKinds are counts whose values select a code path by a cut (fewer
// than c, or c or more), not by a few values.
var countKinds = map[kernel.CoordKind]bool{kernel.KindSplitsUsed: true}

// positionKinds are the coordinates that say where in the requests an
// element is (which request, token, page of its tokens, how long its
// context): a concentration on them may be the longest contexts failing
// most, which a growth with the context explains better, or the positions
// a mechanism picks (the first token of every page), which a named
// pattern explains better.
var positionKinds = map[kernel.CoordKind]bool{kernel.KindContextLen: true, kernel.KindVisible: true, kernel.KindToken: true,
	kernel.KindRequest: true, kernel.KindPage: true}

func topGroups(st *coordStats, sw float64, N, maxGroups int) []Group {
	vals := append([]int(nil), st.vals...)
	sort.SliceStable(vals, func(a, b int) bool { return st.c(vals[a]).mass > st.c(vals[b]).mass })
	if len(vals) > maxGroups {
		vals = vals[:maxGroups]
	}
	g := make([]Group, len(vals))
	for j, v := range vals {
		g[j] = Group{Value: v, Share: st.c(v).mass / sw, Elements: st.c(v).count / float64(N),
			Failing: st.c(v).fail, MeanExcess: st.c(v).excess / st.c(v).count}
	}
	return g
}

func isolatedDetail(o kernel.Output, shape []int, failingSeq iter.Seq[int], failing int) string {
	var where []string
	for i := range failingSeq {
		if len(where) == 3 {
			break
		}
		var parts []string
		for _, c := range o.Coords.Name(tensor.Unravel(i, shape)) {
			parts = append(parts, fmt.Sprintf("%s %d", c.Name(), c.Value))
		}
		where = append(where, strings.Join(parts, ", "))
	}
	return fmt.Sprintf("%d element(s) fail, too few to show a pattern: %s", failing, strings.Join(where, "; "))
}

func listValues(set []int) string {
	if len(set) > 6 {
		return fmt.Sprintf("%d values (%d..%d)", len(set), set[0], set[len(set)-1])
	}
	s := make([]string, len(set))
	for i, v := range set {
		s[i] = fmt.Sprint(v)
	}
	if len(s) == 1 {
		return s[0]
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

// DefaultMaxElements is Options.MaxElements' default: the most elements
// a profile reads before it samples.
const DefaultMaxElements = 1 << 21

// SampleRate is the share of an N-element output's clean elements a
// profile reads with at most maxElems elements (1: every one).
func SampleRate(N, maxElems int) float64 {
	if N > maxElems {
		return float64(maxElems) / float64(N)
	}
	return 1
}

// visit is one element a pass over the excess reads: its index, raw
// excess r, capped excess e, mass w, and how many elements it stands for.
type visit struct {
	i              int
	r, e, w, count float64
}

// readBlock is how many visits readAhead hands over at a time.
const readBlock = 4096

// readAhead calls use with every visit read yields, in read's order, on
// another goroutine, a block of visits behind: read runs on the caller's
// goroutine (the excess is read in index order through the comparison's
// record or its window, which keep a cursor: one reader), use on one
// other, so that its sums are the ones one goroutine doing both made.
// The reading and what is made of each visit (a logarithm, additions to
// every coordinate's statistics) were a failing check's serial tail
// (issue 17). It returns once use has had every visit; a panic in use
// stops read and is raised again here.
func readAhead(read iter.Seq[visit], use func(visit)) {
	blocks, free := make(chan []visit, 2), make(chan []visit, 3)
	for range cap(free) {
		free <- make([]visit, 0, readBlock)
	}
	quit := make(chan struct{}) // closed once the using goroutine ends
	var using parallel.Group
	using.Go(func() {
		defer close(quit)
		for blk := range blocks {
			for _, v := range blk {
				use(v)
			}
			free <- blk[:0]
		}
	})
	func() {
		defer close(blocks)
		blk := <-free
		for v := range read {
			blk = append(blk, v)
			if len(blk) < readBlock {
				continue
			}
			select {
			case blocks <- blk:
			case <-quit:
				return
			}
			select {
			case blk = <-free:
			case <-quit:
				return
			}
		}
		if len(blk) > 0 {
			select {
			case blocks <- blk:
			case <-quit:
			}
		}
	}()
	using.Wait()
}

// visits yields the elements collect looks at, in index order, each with
// whether InSample(i, rate) chooses it: every element, or, where weighted
// is known and rate < 1, those it marks and the sample. The sample's bits
// are made on every core, a block of sampleBlock words at a time (so
// that they take a fixed 512 KB, not a bit an element).
func visits(N int, weighted []uint64, rate float64) iter.Seq2[int, bool] {
	return func(yield func(int, bool) bool) {
		if weighted == nil || rate >= 1 {
			sample := NewSample(rate)
			for i := 0; i < N; i++ {
				if !yield(i, sample.Has(i)) {
					return
				}
			}
			return
		}
		words := (N + 63) / 64
		block := make([]uint64, min(sampleBlock, words))
		for lo := 0; lo < words; lo += sampleBlock {
			hi := min(lo+sampleBlock, words)
			sampleWords(block[:hi-lo], lo, N, rate)
			for w := lo; w < hi; w++ {
				s := block[w-lo]
				for word := weighted[w] | s; word != 0; word &= word - 1 {
					b := bits.TrailingZeros64(word)
					if i := w<<6 + b; i >= N || !yield(i, s>>b&1 != 0) {
						return
					}
				}
			}
		}
	}
}

// sampleBlock is how many words of sample bits visits makes at once. A
// variable only so that a test can cross its edges with a small output.
var sampleBlock = 1 << 16

// sampleWords sets dst[k] to the sample bits (InSample(·, rate)) of
// elements (w0+k)·64 .. (w0+k)·64+63 below N, on every core, each word
// by one goroutine.
func sampleWords(dst []uint64, w0, N int, rate float64) {
	const perUnit = 1 << 10
	sample := NewSample(rate)
	_ = parallel.Each(context.Background(), (len(dst)+perUnit-1)/perUnit, func(u int) {
		for k := u * perUnit; k < min((u+1)*perUnit, len(dst)); k++ {
			var word uint64
			for b, i := 0, (w0+k)<<6; b < 64 && i < N; b, i = b+1, i+1 {
				if sample.Has(i) {
					word |= 1 << b
				}
			}
			dst[k] = word
		}
	})
}

// InSample reports whether element i is among the clean elements a
// profile sampled at rate reads: a hash of i, not a stride, so that no
// period of the tensor's layout aliases with the sample. A comparison
// that records these elements' excess as it judges them spares the
// profile from judging them again (compare).
func InSample(i int, rate float64) bool { return NewSample(rate).Has(i) }

// Sample is InSample's choice at one rate, made once for the many
// elements a pass asks about.
type Sample struct {
	all   bool
	below uint64
}

// NewSample is the sample at rate: element i is in it when unitHash(i) <
// rate, that is when the hash's 53 bits m, of value m·2^-53 (exact), are
// below rate·2^53 (exact: a power of two's scaling), which for an
// integer m is m < ceil(rate·2^53). One integer comparison an element,
// not a conversion and a floating-point one.
func NewSample(rate float64) Sample {
	switch {
	case rate >= 1:
		return Sample{all: true}
	case !(rate > 0): // NaN too: unitHash(i) < NaN holds for none
		return Sample{}
	}
	return Sample{below: uint64(math.Ceil(math.Ldexp(rate, 53)))}
}

// Has reports whether element i is in the sample.
func (s Sample) Has(i int) bool { return s.all || hashBits(uint64(i)) < s.below }

// hashBits is splitmix64's finalizer of i, its top 53 bits: unitHash(i)
// times 2^53.
func hashBits(i uint64) uint64 {
	z := i + 0x9E3779B97F4A7C15
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	z ^= z >> 31
	return z >> 11
}

// unitHash maps i to [0, 1) with splitmix64's finalizer.
func unitHash(i uint64) float64 { return float64(hashBits(i)) / (1 << 53) }

// kl is the Kullback-Leibler divergence of Bernoulli(q) from Bernoulli(e).
func kl(q, e float64) float64 {
	if e <= 0 || e >= 1 {
		return 0
	}
	return xlogy(q, q/e) + xlogy(1-q, (1-q)/(1-e))
}

func xlogy(x, y float64) float64 {
	if x == 0 {
		return 0
	}
	return x * math.Log(y)
}

func lnChoose(n, k int) float64 {
	a, _ := math.Lgamma(float64(n + 1))
	b, _ := math.Lgamma(float64(k + 1))
	c, _ := math.Lgamma(float64(n - k + 1))
	return a - b - c
}

// quantile returns the p-quantile of the n values src gives: the value at
// rank ⌊p·n⌋ once sorted as sort.Float64s sorts (NaN first), 0 when there
// are none.
func quantile(n int, src valueSource, p float64) float64 {
	if n == 0 {
		return 0
	}
	return kthSmallest(src, min(int(p*float64(n)), n-1))
}

// A valueSource gives a multiset of values, on one goroutine or on
// several at once: it calls newSink once for each goroutine it gives
// values on, and hands that goroutine's values to the sink newSink
// returned. A selection's counts are sums of integers, the same in any
// order, so a source may split its values however it likes.
type valueSource func(newSink func() func(v float64))

// seqSource gives seq's values on the caller's goroutine.
func seqSource(seq iter.Seq[float64]) valueSource {
	return func(newSink func() func(float64)) {
		sink := newSink()
		for v := range seq {
			sink(v)
		}
	}
}

// kthSmallest returns the k-th smallest (from 0) of the values src gives,
// which must number more than k. It is exact and holds no copy of the
// values: a radix selection on their bit patterns, ordered as the values are
// (orderKey), fixing 16 bits a pass over src, the count of each 16-bit digit
// among the values that share the bits fixed so far telling which digit the
// k-th one has. Once few enough values share the fixed bits (selectDirect),
// one more pass copies just those and sorts them. Usually two passes, at
// most four, where a sort would copy all the values. Each goroutine src
// gives values on counts (or copies) its own, added up after the pass.
func kthSmallest(src valueSource, k int) float64 {
	var prefix uint64
	for shift := 48; shift >= 0; shift -= 16 {
		high := ^uint64(0) << (shift + 16) // the bits fixed so far (none at first: a shift by 64 is 0)
		var each perGoroutine[[1 << 16]int]
		src(func() func(float64) {
			c := each.own()
			return func(v float64) {
				if key := orderKey(v); key&high == prefix {
					c[key>>shift&0xFFFF]++
				}
			}
		})
		if len(each.all) == 0 {
			return 0 // no values at all
		}
		counts := each.all[0][:]
		if len(each.all) > 1 {
			counts = make([]int, 1<<16)
			for _, c := range each.all {
				for d, n := range c {
					counts[d] += n
				}
			}
		}
		d := 0
		for ; d < len(counts) && k >= counts[d]; d++ {
			k -= counts[d]
		}
		if d == len(counts) {
			return 0 // fewer values than k+1: a pass the context stopped
		}
		prefix |= uint64(d) << shift
		if n := counts[d]; n <= selectDirect && shift > 0 {
			high = ^uint64(0) << shift
			var each perGoroutine[[]uint64]
			src(func() func(float64) {
				mine := each.own()
				return func(v float64) {
					if key := orderKey(v); key&high == prefix {
						*mine = append(*mine, key)
					}
				}
			})
			keys := make([]uint64, 0, n)
			for _, mine := range each.all {
				keys = append(keys, *mine...)
			}
			if k >= len(keys) {
				return 0 // a pass the context stopped
			}
			slices.Sort(keys)
			return fromOrderKey(keys[k])
		}
	}
	return fromOrderKey(prefix)
}

// selectDirect is how many values kthSmallest copies and sorts rather than
// make another counting pass (8 MiB of keys). A variable so that a test can
// make every pass count.
var selectDirect = 1 << 20

// orderKey maps a float64 to a uint64 in the same order (NaN first, as
// sort.Float64s puts it, then -Inf, and -0 before +0): the sign bit set on
// positives, every bit flipped on negatives.
func orderKey(v float64) uint64 {
	if math.IsNaN(v) {
		return 0 // no number maps there: -Inf maps to 0x000FFFFFFFFFFFFF
	}
	b := math.Float64bits(v)
	if b>>63 == 1 {
		return ^b
	}
	return b | 1<<63
}

func fromOrderKey(k uint64) float64 {
	if k == 0 {
		return math.NaN()
	}
	if k>>63 == 1 {
		return math.Float64frombits(k &^ (1 << 63))
	}
	return math.Float64frombits(^k)
}

// spearman is the rank correlation of y with its index (ties get their
// mean rank).
func spearman(y []float64) float64 {
	n := len(y)
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return y[order[a]] < y[order[b]] })
	rank := make([]float64, n)
	for i := 0; i < n; {
		j := i
		for j+1 < n && y[order[j+1]] == y[order[i]] {
			j++
		}
		for k := i; k <= j; k++ {
			rank[order[k]] = float64(i+j) / 2
		}
		i = j + 1
	}
	mean := float64(n-1) / 2
	var sxy, sxx, syy float64
	for i := 0; i < n; i++ {
		dx, dy := float64(i)-mean, rank[i]-mean
		sxy += dx * dy
		sxx += dx * dx
		syy += dy * dy
	}
	if sxx == 0 || syy == 0 {
		return 0
	}
	return sxy / math.Sqrt(sxx*syy)
}

// excessCapper returns the excess of one element as the sums take it: NaN
// and negative as 0, and +Inf capped so that sums stay finite, weighing ten
// times the largest finite excess of the N elements (and at least
// 10·thr). The signature and the profile cap alike.
func excessCapper(excess kernel.Values, N int, thr float64) func(float64) float64 {
	maxFinite := 0.0
	for i := 0; i < N; i++ {
		if e := excess.At(i); !math.IsInf(e, 0) && !math.IsNaN(e) {
			maxFinite = max(maxFinite, e)
		}
	}
	return capperAt(maxFinite, thr)
}

// capperAt is excessCapper's cap for a known largest finite excess.
func capperAt(maxFinite, thr float64) func(float64) float64 {
	capv := 10 * max(maxFinite, thr)
	return func(e float64) float64 {
		switch {
		case math.IsNaN(e) || e < 0:
			return 0
		case math.IsInf(e, 1):
			return capv
		}
		return e
	}
}
