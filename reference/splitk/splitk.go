// Package splitk is the reference for the flash-decoding split-K reduction
// (reference/CONTRACTS.md §3.8, `splitk_combine`): attention over one row's tokens is computed
// in S independent splits, each giving a partial output o_s (already
// normalized by its own softmax sum) and its log-sum-exp lse_s; the combine
// turns them into the row's output and lse:
//
//	m = max_s lse_s,  w_s = exp(lse_s - m),  out = Σ w_s·o_s / Σ w_s,  lse = m + log Σ w_s
//
// (exp2/log2 when the lse is in base 2, as FlashInfer stores it). An empty
// split carries lse = -inf and weighs exactly 0; a row whose splits are all
// empty saw no token: its out is 0 and its lse is the file's lse_empty.
//
// Two answers are given, as everywhere in kcheck: the exact one (float64)
// and the expected one, what a correct fp32 combine kernel writes (FlashMLA's
// and vLLM's combine: exponentials as exp2 of log2e-scaled fp32 values, the
// weights normalized by the global lse before the weighted sum, fp32
// accumulation, output rounded to its dtype).
package splitk

import (
	"context"
	"fmt"
	"math"

	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/parallel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Base is the base of a log-sum-exp.
type Base int

const (
	// BaseE is the natural log (FlashMLA, vLLM): lse = log Σ exp(score).
	BaseE Base = iota
	// Base2 is log2 (FlashInfer): lse2 = log2 Σ 2^(score·log2 e) = lse·log2 e.
	Base2
)

// String is the metadata spelling of b (`e` or `2`).
func (b Base) String() string {
	if b == Base2 {
		return "2"
	}
	return "e"
}

// ParseBase reads the `lse_base` parameter ("" means the default, e).
func ParseBase(s string) (Base, error) {
	switch s {
	case "", "e":
		return BaseE, nil
	case "2":
		return Base2, nil
	}
	return BaseE, fmt.Errorf("parameter lse_base = %q: want e or 2", s)
}

// ParseEmpty reads the `lse_empty` parameter ("" means the default, -inf):
// the lse of a row that sees no token.
func ParseEmpty(s string) (float64, error) {
	switch s {
	case "", "-inf":
		return math.Inf(-1), nil
	case "+inf", "inf":
		return math.Inf(1), nil
	}
	return 0, fmt.Errorf("parameter lse_empty = %q: want -inf or +inf", s)
}

// Convention is how a file writes its lse values.
type Convention struct {
	Base Base
	// Empty is the lse of a row with no token: -inf (default) or +inf (FlashMLA).
	Empty float64
}

// DefaultConvention is base e with -inf for empty rows.
func DefaultConvention() Convention { return Convention{Base: BaseE, Empty: math.Inf(-1)} }

// log2e as fp32, the constant kernels multiply by before exp2f.
const log2eF32 = float32(math.Log2E)

// LSEError reports a partial lse the combine cannot weigh: NaN, or +inf (a
// split's lse is finite, or -inf when the split is empty; +inf is the
// lse_empty convention of a final lse leaking into a partial).
type LSEError struct {
	Split int
	Value float64
}

func (e *LSEError) Error() string {
	return fmt.Sprintf("split %d has lse %v (a partial lse must be finite, or -inf for an empty split)", e.Split, e.Value)
}

func checkLSE(lse []float64) (m float64, err error) {
	m = math.Inf(-1)
	for s, v := range lse {
		if math.IsNaN(v) || math.IsInf(v, 1) {
			return 0, &LSEError{Split: s, Value: v}
		}
		if v > m {
			m = v
		}
	}
	return m, nil
}

// CombineRowExact combines one row in float64: o holds the S partial outputs
// of length l one after another, lse their S lse values. It writes the row's
// output into out[:l] and returns its lse. Empty splits (lse -inf) are
// skipped, so whatever their o holds (0 by contract, garbage in a faulty
// kernel) cannot reach the result.
func CombineRowExact(o, lse []float64, l int, c Convention, out []float64) (float64, error) {
	if len(o) != len(lse)*l {
		return 0, fmt.Errorf("splitk: %d partial values for %d splits of %d", len(o), len(lse), l)
	}
	m, err := checkLSE(lse)
	if err != nil {
		return 0, err
	}
	out = out[:l]
	for i := range out {
		out[i] = 0
	}
	if math.IsInf(m, -1) {
		return c.Empty, nil
	}
	exp, log := math.Exp, math.Log
	if c.Base == Base2 {
		exp, log = math.Exp2, math.Log2
	}
	sum := 0.0
	for s, v := range lse {
		if math.IsInf(v, -1) {
			continue
		}
		w := exp(v - m)
		sum += w
		os := o[s*l : (s+1)*l]
		for i, x := range os {
			out[i] += w * x
		}
	}
	for i := range out {
		out[i] /= sum
	}
	return m + log(sum), nil
}

// CombineRowExpected combines one row as a correct fp32 combine kernel does
// (FlashMLA's combine, vLLM's merge_attn_states), in this fixed order:
//
//	m      = max_s lse_s                          (exact in fp32)
//	w_s    = exp2f(fp32((lse_s - m)·log2e))        (base 2: exp2f(lse_s - m))
//	sum    = Σ_s w_s                               (fp32, s ascending)
//	g      = m + logf(sum)                         (base 2: log2f)
//	c_s    = exp2f(fp32((lse_s - g)·log2e))        (base 2: exp2f(lse_s - g))
//	out[i] = Σ_s c_s·o_s[i]                        (fp32 fused multiply-add, s ascending)
//
// then out is rounded to outDType and the lse to lseDType. The inputs are
// taken as fp32 values (the partials are F32 tensors).
func CombineRowExpected(o, lse []float64, l int, c Convention, outDType, lseDType tensor.DType, out []float64) (float64, error) {
	if len(o) != len(lse)*l {
		return 0, fmt.Errorf("splitk: %d partial values for %d splits of %d", len(o), len(lse), l)
	}
	m, err := checkLSE(lse)
	if err != nil {
		return 0, err
	}
	out = out[:l]
	for i := range out {
		out[i] = 0
	}
	if math.IsInf(m, -1) {
		return RoundTo(lseDType, c.Empty), nil
	}
	cw := make([]float64, len(lse))
	g := expectedWeights(lse, m, c, cw)
	for s, v := range lse {
		if math.IsInf(v, -1) {
			continue
		}
		cs := cw[s]
		os := o[s*l : (s+1)*l]
		for i, x := range os {
			// cs·x is exact in float64 (two 24-bit significands), so
			// one rounding to float32 is the fp32 fused multiply-add.
			out[i] = float64(float32(out[i] + cs*float64(float32(x))))
		}
	}
	for i := range out {
		out[i] = RoundTo(outDType, out[i])
	}
	return RoundTo(lseDType, float64(g)), nil
}

// Exp2F32 is exp2f on an fp32 argument: float32(math.Exp2(x)), the fp32
// value of 2^x rounded once (math.Exp2 is within an ulp of float64, so this
// is the correctly rounded value unless 2^x lies within 2^-52 of an fp32
// rounding boundary). Kernels use ex2.approx (within 2 ulp of it); the
// three-way verdict treats that difference as noise (reference/CONTRACTS.md §1.1).
//
// It runs once per score in an attention reference, and math.Exp2 is slow,
// so the value is first computed as 2^(k/64)·p(r) (x = k/64 + r, |r| <=
// 1/128, 2^(j/64) from a table, p a degree-5 Taylor polynomial of 2^r),
// within 2^-50 of 2^x: when that value and its neighbours at a relative
// 2^-48 round to the same float32, that float32 is the correct rounding of
// 2^x and so also math.Exp2's (whose own error is below 2^-52); otherwise,
// about once in 2^23 arguments, math.Exp2 decides. TestExp2F32 checks the
// shortcut against the definition.
func Exp2F32(x float32) float32 {
	xf := float64(x)
	if !(xf >= -149 && xf <= 127) { // NaN, and 2^x at or past fp32's range ends
		return float32(math.Exp2(xf))
	}
	const magic = 0x1.8p52 // adding it rounds to an integer, ties to even
	k := (xf*64 + magic) - magic
	u := float64((xf - k/64) * math.Ln2) // xf - k/64 is exact: |u| <= ln2/128
	p := float64(u*(1.0/120)) + 1.0/24
	p = float64(p*u) + 1.0/6
	p = float64(p*u) + 1.0/2
	p = float64(p*u) + 1
	p = float64(p*u) + 1
	ki := int64(k)
	y := exp2Sixtyfourths[ki&63] * p * math.Float64frombits(uint64(ki>>6+1023)<<52) // the last factor is 2^floor(k/64), exact
	r := float32(y)
	if float32(y*(1+0x1p-48)) != r || float32(y*(1-0x1p-48)) != r {
		return float32(math.Exp2(xf))
	}
	return r
}

// exp2Sixtyfourths[j] is 2^(j/64), each within an ulp.
var exp2Sixtyfourths = func() (t [64]float64) {
	for j := range t {
		t[j] = math.Exp2(float64(j) / 64)
	}
	return t
}()

// RoundTo rounds v to dtype d the way a kernel storing an fp32 value does
// (F32: to float32; BF16/F16: through float32, nearest even; F64 and any
// other dtype: unchanged).
func RoundTo(d tensor.DType, v float64) float64 {
	switch d {
	case tensor.F32:
		return float64(float32(v))
	case tensor.BF16:
		return formats.RoundBF16(v)
	case tensor.F16:
		return formats.RoundFP16(v)
	}
	return v
}

// Result is a combine's output: Out [N, L] and LSE [N].
type Result struct {
	Out, LSE []float64
}

// Combine combines every row of partialOut [N, S, L] and partialLSE [N, S]
// (flat, row-major), giving the exact and the expected results. The
// partials may be fp32 (a capture's, read in place) or float64; fp32 values
// give the same results either way. An invalid
// lse is reported with its contract name, partial_lse[n,s] (the first in
// row-major order).
//
// Each row's two answers are exactly CombineRowExact's and
// CombineRowExpected's, computed in one pass over the row's partials (the
// weights of both first, then both weighted sums, element by element in
// split order), with the rows shared out to GOMAXPROCS goroutines: every
// row is computed by one goroutine, so the result does not depend on how
// many run.
func Combine[T float32 | float64](ctx context.Context, partialOut []T, partialLSE []float64, n, s, l int, c Convention, outDType, lseDType tensor.DType) (exact, expected Result, err error) {
	if len(partialLSE) != n*s {
		return exact, expected, fmt.Errorf("partial_lse has %d values; [N=%d, S=%d] needs %d", len(partialLSE), n, s, n*s)
	}
	if len(partialOut) != n*s*l {
		return exact, expected, fmt.Errorf("partial_out has %d values; [N=%d, S=%d, L=%d] needs %d", len(partialOut), n, s, l, n*s*l)
	}
	for r := 0; r < n; r++ {
		if _, err := checkLSE(partialLSE[r*s : (r+1)*s]); err != nil {
			return exact, expected, rowError(r, err)
		}
	}
	exact = Result{Out: make([]float64, n*l), LSE: make([]float64, n)}
	expected = Result{Out: make([]float64, n*l), LSE: make([]float64, n)}
	// Units of rows: enough of them to balance, each long enough to amortize.
	per := max(1, min(n, (1<<16)/max(1, s*l)))
	units := (n + per - 1) / per
	err = parallel.Run(ctx, units, 0, func() func(int) {
		ws, idx := make([]float64, 2*s), make([]int, s)
		return func(u int) {
			for r := u * per; r < min((u+1)*per, n); r++ {
				exact.LSE[r], expected.LSE[r] = combineRowBoth(partialOut[r*s*l:(r+1)*s*l], partialLSE[r*s:(r+1)*s], l, c,
					outDType, lseDType, exact.Out[r*l:(r+1)*l], expected.Out[r*l:(r+1)*l], ws, idx)
			}
		}
	})
	if err != nil {
		return Result{}, Result{}, err
	}
	return exact, expected, nil
}

// combineRowBoth is CombineRowExact and CombineRowExpected of one valid row
// (checkLSE passed) in one pass: the same operations on every element, in
// the same order, so the same bits. ws is scratch for 2·S weights, idx for
// S split indices.
func combineRowBoth[T float32 | float64](o []T, lse []float64, l int, c Convention, outDType, lseDType tensor.DType, ex, xp, ws []float64, idx []int) (float64, float64) {
	m := math.Inf(-1)
	for _, v := range lse {
		if v > m {
			m = v
		}
	}
	clear(ex)
	clear(xp)
	if math.IsInf(m, -1) {
		return c.Empty, RoundTo(lseDType, c.Empty)
	}
	// exact weights (CombineRowExact)
	exp, log := math.Exp, math.Log
	if c.Base == Base2 {
		exp, log = math.Exp2, math.Log2
	}
	w := ws[:len(lse)]
	sum := 0.0
	for s, v := range lse {
		if math.IsInf(v, -1) {
			continue
		}
		w[s] = exp(v - m)
		sum += w[s]
	}
	cw := ws[len(lse) : 2*len(lse)]
	g := expectedWeights(lse, m, c, cw)
	// the non-empty splits in order, their weights moved down beside them
	k := 0
	for s, v := range lse {
		if !math.IsInf(v, -1) {
			idx[k], w[k], cw[k] = s, w[s], cw[s]
			k++
		}
	}
	weightedSum(ex, xp, o, l, idx[:k], w[:k], cw[:k])
	for i := range ex {
		ex[i] /= sum
		xp[i] = RoundTo(outDType, xp[i])
	}
	return m + log(sum), RoundTo(lseDType, float64(g))
}

// expectedWeights computes a correct fp32 combine's weights, in the order
// CombineRowExpected documents: the fp32 sum of exp2f((lse_s - m)·log2e)
// over the non-empty splits, g = m + logf(sum), then c_s =
// exp2f((lse_s - g)·log2e) into cw (empty splits left as they are). It
// returns g, the row's fp32 lse. m is the row's maximum, finite.
func expectedWeights(lse []float64, m float64, c Convention, cw []float64) float32 {
	weight := func(v, ref float32) float32 {
		d := v - ref
		if c.Base == BaseE {
			d *= log2eF32
		}
		return Exp2F32(d)
	}
	m32 := float32(m)
	var sum float32
	for _, v := range lse {
		if !math.IsInf(v, -1) {
			sum += weight(float32(v), m32)
		}
	}
	var g float32
	if c.Base == BaseE {
		g = m32 + float32(math.Log(float64(sum)))
	} else {
		g = m32 + float32(math.Log2(float64(sum)))
	}
	for s, v := range lse {
		if !math.IsInf(v, -1) {
			cw[s] = float64(weight(float32(v), g))
		}
	}
	return g
}

// weightedSumGeneric adds the listed splits' partial outputs to both sums,
// split by split in order (splits[k] with weights w[k], cw[k]); split s's
// partial is o[s*l:][:len(ex)]:
//
//	for i := range ex { ex[i] += w·x;  xp[i] = fp32(xp[i] + cs·fp32(x)) }   (x = o[s*l+i])
//
// cs·fp32(x) is exact in float64 (two 24-bit significands), so rounding the
// sum once to float32 is the fp32 fused multiply-add. The partials may be
// fp32, the form kernels write them in (read in place from a capture):
// fp32(x) is then x, and the results are those of the widened values.
func weightedSumGeneric[T float32 | float64](ex, xp []float64, o []T, l int, splits []int, w, cw []float64) {
	xp = xp[:len(ex)]
	for k, s := range splits {
		ws, cs := w[k], cw[k]
		x := o[s*l : s*l+len(ex)]
		for i, t := range x {
			v := float64(t)
			ex[i] += float64(ws * v)
			xp[i] = float64(float32(xp[i] + cs*float64(float32(v))))
		}
	}
}

func rowError(r int, err error) error {
	if e, ok := err.(*LSEError); ok {
		return fmt.Errorf("partial_lse[%d,%d] = %v: a partial lse must be finite, or -inf for an empty split", r, e.Split, e.Value)
	}
	return fmt.Errorf("row %d: %w", r, err)
}
