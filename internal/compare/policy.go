package compare

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"sync"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/parallel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Policy decides how far an actual output may lie from the exact reference.
// It is the one replaceable piece of the comparison: Compare computes the
// same metrics whatever the policy, and judges them against the Bounds the
// policy returns.
type Policy interface {
	Name() string
	// Bounds returns the tolerance for output o when the kernel under test
	// stored it in actualDType. It sees Exact and Expected but never the
	// actual values, so a bound cannot be tuned to what it judges. Its
	// passes over the output stop between units once ctx is done; what it
	// returns then is of part of the output, and the caller, whose ctx it
	// is, discards it.
	Bounds(ctx context.Context, o kernel.Output, actualDType tensor.DType) Bounds
}

// Bounds is what a Policy allows.
type Bounds struct {
	// Tol returns element i's tolerance on |actual_i - exact_i| (>= 0),
	// given its exact and expected values (the caller has read them; an
	// output's values may be computed on demand, and reading them again
	// would double that). It must be safe to call from several goroutines.
	Tol func(i int, exact, expected float64) float64
	// TolRun, when set, is Tol over the consecutive elements lo,
	// lo+1, ...: dst[k] = Tol(lo+k, exact[k], expected[k]), the same
	// bits, in one call. The judge asks for whole runs, where a call an
	// element, and the row and column found by division an element, cost
	// more than the tolerance's own arithmetic. Also safe to call from
	// several goroutines.
	TolRun func(lo int, exact, expected, dst []float64)
	// Band: an element whose error is in (tol, Band·tol] makes the check
	// inconclusive; beyond Band·tol it fails. Values below 1 count as 1.
	Band float64
	// Aggregate, when set, bounds whole-tensor metrics too, which catches
	// systematic errors that stay under every per-element bound.
	Aggregate *Aggregate
	// Explanation states the bound and why, for the report.
	Explanation string
}

// Aggregate bounds whole-tensor metrics of actual against exact over the
// elements where both are finite. Exceeding either fails the check.
type Aggregate struct {
	RMSE    float64 // bound on sqrt(mean (actual-exact)^2)
	CosDiff float64 // bound on 1 - 2Σxy/Σ(x²+y²)
	// Floor values, reported beside the bounds: the same metrics for expected.
	FloorRMSE, FloorCosDiff float64
}

// DefaultPolicy is the three-way policy with its documented defaults.
func DefaultPolicy() Policy { return ThreeWay{} }

// gammaN is Higham's deterministic bound on the relative error of a sum of
// n terms in arithmetic of unit roundoff u: γ_n = nu/(1-nu) (Accuracy and
// Stability of Numerical Algorithms, 2nd ed., Lemma 3.1). It is +Inf when
// nu >= 1, where the bound says nothing.
func gammaN(n int, u float64) float64 {
	nu := float64(n) * u
	if nu >= 1 {
		return math.Inf(1)
	}
	return nu / (1 - nu)
}

// gammaProb is Higham and Mary's probabilistic counterpart, γ̃_n(λ) =
// exp(λ√n·u + nu²/(1-u)) - 1 ≈ λ√n·u (SIAM J. Sci. Comput. 41(5), 2019,
// Theorem 3.1): with rounding errors modelled as independent and mean
// zero, |ŝ - s| <= γ̃_n(λ)·Σ|x_i| fails with probability at most about
// 2n·exp(-λ²(1-u)²/2).
func gammaProb(n int, u, lambda float64) float64 {
	fn := float64(n)
	return math.Expm1(lambda*math.Sqrt(fn)*u + fn*u*u/(1-u))
}

// UnitRoundoff is the provisional policy of the foundation issue: a bound
// from the output dtype's unit roundoff and the reduction length alone,
//
//	tol_i = C·(u_out·|exact_i| + γ_n(u_acc)·scale_i),
//
// with n = o.Reduction, scale_i = max(|exact_i|, rms(exact)) standing in
// for Σ|terms| (which the output does not carry). It ignores Expected, so it
// knows nothing of roundings the declared precision makes inside the
// computation (bf16 P, dequantized KV) and is too tight for attention.
type UnitRoundoff struct {
	C    float64      // safety factor (default 1)
	Acc  tensor.DType // accumulator dtype (default F32)
	Band float64      // inconclusive band (default 2)
}

// Name implements Policy.
func (UnitRoundoff) Name() string { return "unit-roundoff" }

// Bounds implements Policy.
func (p UnitRoundoff) Bounds(ctx context.Context, o kernel.Output, d tensor.DType) Bounds {
	c := orDefault(p.C, 1)
	acc := p.Acc
	if acc == "" {
		acc = tensor.F32
	}
	n := max(o.Reduction, 1)
	g := gammaN(n, acc.UnitRoundoff())
	uOut := d.UnitRoundoff()
	var s2 float64
	var cnt int
	for i, n := 0, o.Exact.Len(); i < n; i++ {
		if i%parallelChunk == 0 && ctx.Err() != nil {
			break // the caller discards what is returned
		}
		if x := o.Exact.At(i); finite(x) {
			s2 += x * x
			cnt++
		}
	}
	rms := 0.0
	if cnt > 0 {
		rms = math.Sqrt(s2 / float64(cnt))
	}
	return Bounds{
		Tol: func(_ int, x, _ float64) float64 {
			ax := math.Abs(x)
			return c * (uOut*ax + g*max(ax, rms))
		},
		Band: orDefault(p.Band, 2),
		Explanation: fmt.Sprintf("unit roundoff: tol_i = %g·(u_%s·|exact_i| + γ_n·max(|exact_i|, rms(exact))) with u_%s = %.3g, "+
			"γ_n = nu/(1-nu) = %.3g for n = %d %s additions (Higham's deterministic bound), rms(exact) = %.3g",
			c, d, d, uOut, g, n, acc, rms),
	}
}

// ThreeWay is the default policy: it judges the actual output against the
// exact one, with the noise floor |expected - exact| that a correct kernel
// of the declared precision shows as the yardstick. For element i,
//
//	tol_i = ulp_i + max(2·f_i, κ·s_i) + γ·mag_i
//
// where
//
//   - f_i = |expected_i - exact_i| is the floor at i. Where the arithmetic
//     is ill-conditioned (cancellation, a value at a rounding tie) every
//     correct kernel errs there by about that much; the factor 2 allows for
//     two independent roundings of that size.
//   - s_i is the typical floor around i: the rms of f over i's row (every
//     axis but the last non-unit one) times the rms over its column, over
//     the global rms, i.e. a separable model err_scale(row, col) =
//     a_row·b_col fitted to f². Rows carry the softmax's peakiness (or a
//     GEMM row's norm), columns the channel scale of V (outlier channels),
//     so both kinds of heterogeneity are followed. A correct kernel's error
//     at i is another draw of that size, independent of f_i, so a small f_i
//     at one element does not make the bound small there. The separable
//     model degenerates to the global rms for a 1-D output.
//   - κ = sqrt(2·ln(2N/α)): the largest of N independent normal errors of
//     rms σ exceeds κσ with probability at most α (default 1e-3), so a
//     correct kernel trips no element of an N-element tensor.
//   - ulp_i is one ulp of the actual's dtype at max(|exact_i|,
//     |expected_i|): two correct kernels whose unrounded results straddle a
//     rounding boundary store neighbouring codes, so a correct output may sit
//     a whole ulp from where Expected sits (|actual-exact| <= f_i + ulp_i).
//   - γ·mag_i covers the accumulation independently of the floor, so that
//     an expected reference whose summation order happened to be lucky
//     cannot make the bound too tight: γ = min(γ_n, γ̃_n(λ)), Higham's
//     deterministic nu/(1-nu) and Higham and Mary's probabilistic λ√n·u
//     (with λ set for a failure probability α/N per element), for n =
//     o.Reduction additions in the accumulator dtype. mag_i stands for
//     Σ|terms|, which an output does not carry: max(|exact_i|, rms of
//     exact over i's row). For a softmax-weighted sum Σ p_j v_j with Σp = 1
//     and zero-mean v, the row rms of the output equals sqrt(Σ p_j² v_j²),
//     exactly the scale of the probabilistic bound on per-term rounding.
//
// Roundings the declared precision makes inside the computation (P to
// bf16, dequantized KV, the output conversion) are not modelled here:
// Expected emulates them, so the floor carries them.
//
// Verdict: an element beyond Band·tol_i (default 2) fails; one in (tol_i,
// Band·tol_i] makes the check inconclusive. Aggregates catch systematic
// errors that stay under every element's bound (bf16 accumulation, a
// biased rounding): the L2 norm of actual-exact must stay within
// E = ρ·‖f‖ + ‖ulp‖ + ‖γ·mag‖ (ρ default 2: a correct kernel rounds in as
// many places as Expected, and may round in some more, such as P both before
// PV and in the row sum), giving rmse <= E/sqrt(N) and cos_diff <=
// E²/(‖exact‖² + (‖exact‖-E)²).
//
// The declared-precision reference written as the actual passes by
// construction: its error at i is f_i <= tol_i/2, and over the elements
// where exact and expected are finite ‖expected-exact‖ = ‖f‖ <= E/ρ, so its
// rmse is at most E/(ρ·sqrt(N)), and since ‖expected‖ >= ‖exact‖ - ‖f‖ >=
// ‖exact‖ - E its cos_diff ‖f‖²/(‖expected‖² + ‖exact‖²) is at most
// E²/(ρ²(‖exact‖² + (‖exact‖-E)²)): both bounds hold with a margin of ρ
// and ρ² (ρ below 1 is taken as 1, which keeps the guarantee). That
// needs the metrics computed as accurately as the bounds, which is why
// Compare sums (x-y)² for cos_diff rather than subtracting 2Σxy from Σ(x²+y²).
type ThreeWay struct {
	Acc   tensor.DType // accumulator dtype (default F32)
	Alpha float64      // false-alarm probability per tensor (default 1e-3)
	Rho   float64      // aggregate margin on the floor's energy (default 2)
	Band  float64      // inconclusive band (default 2)
}

// Name implements Policy.
func (ThreeWay) Name() string { return "three-way" }

// Bounds implements Policy.
func (p ThreeWay) Bounds(ctx context.Context, o kernel.Output, d tensor.DType) Bounds {
	acc := p.Acc
	if acc == "" {
		acc = tensor.F32
	}
	alpha := orDefault(p.Alpha, 1e-3)
	rho := max(orDefault(p.Rho, 2), 1)
	band := orDefault(p.Band, 2)
	N := o.Exact.Len()
	if o.Expected.Len() != N {
		panic(fmt.Sprintf("compare: output %s has %d exact and %d expected values", o.Name, N, o.Expected.Len()))
	}
	n := max(o.Reduction, 1)

	kappa := math.Sqrt(2 * math.Log(2*float64(max(N, 1))/alpha))
	u := acc.UnitRoundoff()
	lambda := math.Sqrt(2 * math.Log(2*float64(n)*float64(max(N, 1))/alpha))
	gDet, gPr := gammaN(n, u), gammaProb(n, u, lambda)
	g := min(gDet, gPr)

	// Rows and columns of the separable floor model.
	C := N
	sep := false
	if dims := nonUnit(o.Shape); len(dims) >= 2 && tensor.NumElements(o.Shape) == N {
		C, sep = dims[len(dims)-1], true
	}
	C = max(C, 1)
	R := max(N/C, 1)
	rowF, rowX, rowCnt := make([]float64, R), make([]float64, R), make([]int, R)
	var colF []float64
	var colCnt []int
	if sep {
		colF, colCnt = make([]float64, C), make([]int, C)
	}
	// Both passes share the output out in units of whole rows (or, for a
	// 1-D output, of elements) fixed by the shape alone, and add the units'
	// partial sums in unit order: the same additions in the same order,
	// whichever goroutine took a unit and whatever GOMAXPROCS is. A row's
	// own sums are its unit's, in index order, as a serial pass makes
	// them; the column and global sums are sums of the units' sums.
	units := newBoundsUnits(o, R, C, sep)
	parts := make([]boundsPart, units.n)
	units.run(ctx, func(lo int, xb, eb []float64, part *boundsPart) {
		if sep && part.colF == nil {
			part.colF, part.colCnt = make([]float64, C), make([]int32, C)
		}
		// the sums go on in locals, which the compiler keeps in registers,
		// the row's too: added in memory, each of its additions waited
		// for the last one's store
		f2, x2, e2, cnt := part.f2, part.x2, part.e2, part.cnt
		colF, colCnt := part.colF, part.colCnt
		r, c := lo/C, lo%C
		rows := boundsRows{f: rowF, x: rowX, cnt: rowCnt}
		rf, rx, rc := rows.resume(sep, r, c)
		for k, x := range xb {
			if e := eb[k]; finite(x) && finite(e) {
				f := math.Abs(e - x)
				if sep {
					rf += f * f
					rx += x * x
					rc++
					colF[c] += f * f
					colCnt[c]++
				}
				f2 += f * f
				x2 += x * x
				e2 += e * e
				cnt++
			}
			if c++; c == C {
				rows.store(sep, r, rf, rx, rc)
				r, c = r+1, 0
				rf, rx, rc = 0, 0, 0
			}
		}
		if c != 0 {
			rows.store(sep, r, rf, rx, rc)
		}
		part.f2, part.x2, part.e2, part.cnt = f2, x2, e2, cnt
	}, func(lo int, d tensor.DType, b []byte, part *boundsPart) {
		// expected is exact here: every floor f is 0, and adding 0 to a
		// sum of squares leaves its bits, so only the squares are added.
		if sep && part.colF == nil {
			part.colF, part.colCnt = make([]float64, C), make([]int32, C)
		}
		x2, e2, cnt := part.x2, part.e2, part.cnt
		colCnt := part.colCnt
		vals, sz := codeValues(d), d.Size()
		r, c := lo/C, lo%C
		rows := boundsRows{f: rowF, x: rowX, cnt: rowCnt}
		rf, rx, rc := rows.resume(sep, r, c)
		for k, n := 0, len(b)/sz; k < n; {
			m := min(n-k, C-c) // the run's elements in row r
			if seg := b[k*sz : (k+m)*sz]; d == tensor.BF16 && finite16(seg, bf16Exponent) {
				rx, x2, e2 = bf16Squares(seg, sep, rx, x2, e2)
				if sep {
					rc += m
					for q := range colCnt[c : c+m] {
						colCnt[c+q]++
					}
				}
				cnt += m
			} else {
				for q := 0; q < m; q++ {
					if x := vals[codeAt(seg, sz, q)]; finite(x) {
						if sep {
							rx += x * x
							rc++
							colCnt[c+q]++
						}
						x2 += x * x
						e2 += x * x
						cnt++
					}
				}
			}
			k, c = k+m, c+m
			if c == C {
				rows.store(sep, r, rf, rx, rc)
				r, c = r+1, 0
				rf, rx, rc = 0, 0, 0
			}
		}
		if c != 0 {
			rows.store(sep, r, rf, rx, rc)
		}
		part.x2, part.e2, part.cnt = x2, e2, cnt
	}, parts)
	var gF, normX2, normE2 float64
	var cnt int
	for _, part := range parts {
		gF += part.f2
		normX2 += part.x2
		normE2 += part.e2
		cnt += part.cnt
		for c, f := range part.colF {
			colF[c] += f
			colCnt[c] += int(part.colCnt[c])
		}
	}
	if !sep {
		// the one row is the whole output
		rowF[0], rowX[0], rowCnt[0] = gF, normX2, cnt
	}
	for r := range rowF {
		if rowCnt[r] > 0 {
			rowF[r] /= float64(rowCnt[r])
			rowX[r] = math.Sqrt(rowX[r] / float64(rowCnt[r]))
		}
	}
	for c := range colF {
		if colCnt[c] > 0 {
			colF[c] /= float64(colCnt[c])
		}
	}
	if cnt > 0 {
		gF /= float64(cnt)
	}
	// A correct kernel's noise that Expected does not share (Output.Noise)
	// is one more independent draw beside the floor's.
	var noise2 float64
	if o.Noise != nil {
		if o.Noise.Len() != N {
			panic(fmt.Sprintf("compare: output %s has %d values and %d noise values", o.Name, N, o.Noise.Len()))
		}
		for i := range N {
			if x, e := o.Exact.At(i), o.Expected.At(i); finite(x) && finite(e) {
				noise2 += sq(o.Noise.At(i))
			}
		}
	}
	// Tol is computed on demand, not stored: a capture's output can have
	// tens of millions of elements.
	tm := &tolModel{ulps: newSpacingTable(spacingOf(d)), rowF: rowF, rowX: rowX, colF: colF,
		gF: gF, kappa: kappa, g: g, sep: sep, noise: o.Noise}
	ulps := &tm.ulps
	for u := range parts {
		parts[u] = boundsPart{}
	}
	units.run(ctx, func(lo int, xb, eb []float64, part *boundsPart) {
		ulp2, acc2 := part.f2, part.x2
		r, c := lo/C, lo%C
		for k, x := range xb {
			// tolAt's ulp and γ·mag terms; an element it gives 0 for adds 0
			if e := eb[k]; finite(x) && finite(e) {
				ulp := ulps.at(max(math.Abs(x), math.Abs(e)))
				am := g * max(math.Abs(x), rowX[r])
				ulp2 += ulp * ulp
				acc2 += am * am
			}
			if c++; c == C {
				r, c = r+1, 0
			}
		}
		part.f2, part.x2 = ulp2, acc2
	}, func(lo int, d tensor.DType, b []byte, part *boundsPart) {
		ulp2, acc2 := part.f2, part.x2
		vals, sz := codeValues(d), d.Size()
		r, c := lo/C, lo%C
		for k, n := 0, len(b)/sz; k < n; {
			m := min(n-k, C-c) // the run's elements in row r
			if seg := b[k*sz : (k+m)*sz]; d == tensor.BF16 && finite16(seg, bf16Exponent) {
				ulp2, acc2 = bf16TolSquares(seg, ulps, g, rowX[r], ulp2, acc2)
			} else {
				for q := 0; q < m; q++ {
					if x := vals[codeAt(seg, sz, q)]; finite(x) {
						ulp := ulps.at(x)
						am := g * max(math.Abs(x), rowX[r])
						ulp2 += ulp * ulp
						acc2 += am * am
					}
				}
			}
			k, c = k+m, c+m
			if c == C {
				r, c = r+1, 0
			}
		}
		part.f2, part.x2 = ulp2, acc2
	}, parts)
	var ulp2, acc2 float64
	for _, part := range parts {
		ulp2 += part.f2
		acc2 += part.x2
	}
	E := rho*math.Sqrt(gF*float64(cnt)+noise2) + math.Sqrt(ulp2) + math.Sqrt(acc2)
	noiseText := ""
	if o.Noise != nil {
		noiseText = fmt.Sprintf("; s_i taken with the kernel's own noise in quadrature, hypot(s_i, n_i), n_i = %s (rms %.3g), and the aggregates' floor with it", o.NoiseWhat, math.Sqrt(noise2/float64(max(cnt, 1))))
	}
	agg := &Aggregate{}
	if cnt > 0 {
		agg.RMSE = E / math.Sqrt(float64(cnt))
		agg.FloorRMSE = math.Sqrt(gF)
	}
	nx := math.Sqrt(normX2)
	if den := normX2 + sq(max(nx-E, 0)); den > 0 {
		agg.CosDiff = E * E / den
	} else if E > 0 {
		agg.CosDiff = math.Inf(1)
	}
	if den := normX2 + normE2; den > 0 {
		agg.FloorCosDiff = gF * float64(cnt) / den
	}
	model := "global rms of the floor (1-D output)"
	if sep {
		model = fmt.Sprintf("floor rms on the element's row × column / global rms (%d rows × %d columns)", R, C)
	}
	return Bounds{
		Tol: func(i int, x, e float64) float64 { return tm.at(i, i/C, i%C, x, e) },
		TolRun: func(lo int, xs, es, dst []float64) {
			r, c := lo/C, lo%C
			for k := 0; k < len(xs); r, c = r+1, 0 {
				m := min(len(xs)-k, C-c) // the run's elements in row r
				tm.row(dst[k:k+m], xs[k:k+m], es[k:k+m], lo+k, r, c)
				k += m
			}
		},
		Band:      band,
		Aggregate: agg,
		Explanation: fmt.Sprintf("three-way: tol_i = ulp_%s(x_i) + max(2·f_i, κ·s_i) + γ·mag_i, f_i = |expected_i-exact_i| (floor rms %.3g), "+
			"s_i = %s, κ = %.2f so that %d correct errors stay under κσ but with probability %g; "+
			"γ = %.3g = min(Higham γ_n = nu/(1-nu) = %.3g, Higham-Mary λ√n·u = %.3g) for n = %d %s additions, "+
			"mag_i = max(|exact_i|, row rms of exact). Fail beyond %g·tol_i; aggregates: rmse ≤ %.3g (%g×floor + 1 ulp + γ), "+
			"cos_diff ≤ %.3g (floor %.3g)",
			d, math.Sqrt(gF), model, kappa, N, alpha, g, gDet, gPr, n, acc, band, agg.RMSE, rho, agg.CosDiff, agg.FloorCosDiff) + noiseText,
	}
}

// tolModel is the three-way tolerance of an element at row r and column c
// (see Bounds' explanation): ulp + max(2·f, κ·s) + γ·mag, with s the
// floor's scale at (r, c).
type tolModel struct {
	ulps             spacingTable
	rowF, rowX, colF []float64
	gF, kappa, g     float64
	sep              bool
	noise            kernel.Values // nil: none
}

// at is element i's tolerance, in row r and column c (the caller knows
// them: a division an element is dear), x its exact and e its expected
// value.
func (t *tolModel) at(i, r, c int, x, e float64) float64 {
	if !finite(x) || !finite(e) {
		return 0
	}
	ulp := t.ulps.at(max(math.Abs(x), math.Abs(e)))
	var s float64 // the floor's scale at (r, c)
	if t.gF != 0 {
		if t.sep {
			s = math.Sqrt(t.rowF[r] * t.colF[c] / t.gF)
		} else {
			s = math.Sqrt(t.gF)
		}
	}
	if t.noise != nil {
		s = math.Hypot(s, t.noise.At(i))
	}
	am := t.g * max(math.Abs(x), t.rowX[r])
	return ulp + max(2*math.Abs(e-x), t.kappa*s) + am
}

// row is at over elements i0, i0+1, ... of row r from column c0 on, into
// dst: the same arithmetic in the same order, with what is the row's
// read once rather than an element (the tolerances of a run of numbers
// were a fifth of an fp8_ds_mla gather's check, a call an element).
func (t *tolModel) row(dst, xs, es []float64, i0, r, c0 int) {
	if t.noise != nil {
		for k, x := range xs {
			dst[k] = t.at(i0+k, r, c0+k, x, es[k])
		}
		return
	}
	dst, es = dst[:len(xs)], es[:len(xs)]
	ulps, kappa, g, gF, rx := &t.ulps, t.kappa, t.g, t.gF, t.rowX[r]
	// κ·s: the same for the whole row but where the floor is separable
	// (perColumn), whose s is the row's and the column's
	perColumn := t.sep && gF != 0
	var ks, rf float64
	var colF []float64
	switch {
	case perColumn:
		rf, colF = t.rowF[r], t.colF[c0:c0+len(xs)]
	case gF != 0:
		ks = kappa * math.Sqrt(gF)
	}
	for k, x := range xs {
		e := es[k]
		if !finite(x) || !finite(e) {
			dst[k] = 0
			continue
		}
		ulp := ulps.at(max(math.Abs(x), math.Abs(e)))
		if perColumn {
			ks = kappa * math.Sqrt(rf*colF[k]/gF)
		}
		am := g * max(math.Abs(x), rx)
		dst[k] = ulp + max(2*math.Abs(e-x), ks) + am
	}
}

// boundsRows is the per-row sums of Bounds' first pass, which a pass
// keeps in locals while it is in a row: resume and store move one
// row's sums, and do nothing for an output without rows (sep false) or
// past the last row.
type boundsRows struct {
	f, x []float64
	cnt  []int
}

// resume gives row r's sums so far for a call that starts at column c:
// none at a row's start, which is all a call reads of a row it did not
// begin, so no call reads a row another unit's goroutine is writing.
func (b boundsRows) resume(sep bool, r, c int) (f, x float64, cnt int) {
	if !sep || c == 0 || r >= len(b.f) {
		return 0, 0, 0
	}
	return b.f[r], b.x[r], b.cnt[r]
}

func (b boundsRows) store(sep bool, r int, f, x float64, cnt int) {
	if sep && r < len(b.f) {
		b.f[r], b.x[r], b.cnt[r] = f, x, cnt
	}
}

// boundsPart is one unit's partial sums in ThreeWay.Bounds' passes: the
// floor's, exact's and expected's squares and their count, and the
// floor's squares by column (the first pass), or the ulp's and γ·mag's
// squares in f2 and x2 (the second).
type boundsPart struct {
	f2, x2, e2 float64
	cnt        int
	colF       []float64
	colCnt     []int32
}

// boundsUnitRows is the fewest rows in a unit of Bounds' passes: a unit's
// column sums are added to the whole serially, C additions against the
// unit's rows·C, and each unit holds its own until then (12 bytes a
// column: under 1/20 of a byte an element of the output).
const boundsUnitRows = 256

// boundsUnits is how Bounds shares out an output: n units of whole rows
// (rows rows each, the last shorter) of a separable output, or of
// 1<<16 elements of a 1-D one.
type boundsUnits struct {
	o       kernel.Output
	n, size int // units, elements per unit
	total   int
}

func newBoundsUnits(o kernel.Output, R, C int, sep bool) boundsUnits {
	N := o.Exact.Len()
	size := 1 << 16
	if sep {
		size = max(boundsUnitRows, (1<<14+C-1)/C) * C
	}
	return boundsUnits{o: o, n: (N + size - 1) / size, size: size, total: N}
}

// run calls pass on every unit's elements a block at a time (read by
// readPair, the same bits as At), with the unit's part to add to, on
// GOMAXPROCS goroutines that each read forks of the values
// (kernel.Fork), or on this one where they cannot be forked. Where
// settled is set, a run of elements whose exact and expected values are
// the same bytes of a dtype the byte passes decode (settledRun) goes to
// it instead, as those bytes: a pass there makes the additions pass makes,
// in the same order, from the codes. Once ctx is done no unit starts
// (reference/parallel), and the sums are partial.
func (us boundsUnits) run(ctx context.Context, pass func(lo int, xb, eb []float64, part *boundsPart), settled func(lo int, d tensor.DType, b []byte, part *boundsPart), parts []boundsPart) {
	workers := 0
	if _, ok1 := kernel.Fork(us.o.Exact); !ok1 {
		workers = 1
	} else if _, ok2 := kernel.Fork(us.o.Expected); !ok2 {
		workers = 1
	}
	block := min(us.size, parallelChunk)
	_ = parallel.Run(ctx, us.n, workers, func() func(int) {
		exact, expected := us.o.Exact, us.o.Expected
		if workers != 1 {
			exact, _ = kernel.Fork(exact)
			expected, _ = kernel.Fork(expected)
		}
		xs, es := make([]float64, min(block, us.total)), make([]float64, min(block, us.total))
		return func(u int) {
			end := min((u+1)*us.size, us.total)
			for lo := u * us.size; lo < end; lo += block {
				n := min(block, end-lo)
				if settled == nil {
					readPair(exact, expected, lo, xs[:n], es[:n])
					pass(lo, xs[:n], es[:n], &parts[u])
					continue
				}
				for p := lo; p < lo+n; {
					d, b, m := settledRun(exact, expected, p, lo+n-p)
					if b != nil {
						settled(p, d, b, &parts[u])
					} else {
						readPair(exact, expected, p, xs[:m], es[:m])
						pass(p, xs[:m], es[:m], &parts[u])
					}
					p += m
				}
			}
		}
	})
}

// settledRun returns the run of values from lo on (at most n) that exact
// and expected settle alike (kernel.Settler), and, when both vouch there
// for the same bytes of a dtype codeValues decodes, those bytes (nil
// otherwise: the run is read as values).
func settledRun(exact, expected kernel.Values, lo, n int) (tensor.DType, []byte, int) {
	sx, ok1 := exact.(kernel.Settler)
	se, ok2 := expected.(kernel.Settler)
	if !ok1 || !ok2 {
		return "", nil, n
	}
	dx, bx, mx := sx.Settled(lo, n)
	de, be, me := se.Settled(lo, n)
	m := max(min(mx, me, n), 1)
	sz := dx.Size()
	if bx == nil || be == nil || dx != de || !bulkDType(dx) || len(bx) < m*sz || len(be) < m*sz ||
		(&bx[0] != &be[0] && !bytes.Equal(bx[:m*sz], be[:m*sz])) {
		return "", nil, m
	}
	return dx, bx[:m*sz], m
}

// codeValues is every code's value of dtype d (one of bulkDType's), as
// tensor.Float64At decodes it, indexed by the code.
func codeValues(d tensor.DType) []float64 {
	if d == tensor.BF16 {
		bf16Once.Do(func() {
			bf16Values = make([]float64, 1<<16)
			for c := range bf16Values {
				bf16Values[c] = float64(math.Float32frombits(uint32(c) << 16))
			}
		})
		return bf16Values
	}
	return decodeTable(d)
}

var (
	bf16Once   sync.Once
	bf16Values []float64
)

// codeAt is code k of b, a run of codes of size sz (1 or 2 bytes).
func codeAt(b []byte, sz, k int) int {
	if sz == 1 {
		return int(b[k])
	}
	return int(b[2*k]) | int(b[2*k+1])<<8
}

// readPair fills xb and eb with the exact and expected values from lo on,
// as kernel.ReadBlock does: where both vouch for the same bytes
// (kernel.Settler), those are decoded once for both.
func readPair(exact, expected kernel.Values, lo int, xb, eb []float64) {
	sx, ok1 := exact.(kernel.Settler)
	se, ok2 := expected.(kernel.Settler)
	if !ok1 || !ok2 {
		kernel.ReadBlock(exact, lo, xb)
		kernel.ReadBlock(expected, lo, eb)
		return
	}
	for p, n := 0, len(xb); p < n; {
		dx, bx, mx := sx.Settled(lo+p, n-p)
		de, be, me := se.Settled(lo+p, n-p)
		m := max(min(mx, me, n-p), 1)
		if sz := dx.Size(); bx != nil && be != nil && dx == de && sz > 0 && len(bx) >= m*sz && len(be) >= m*sz &&
			(&bx[0] == &be[0] || bytes.Equal(bx[:m*sz], be[:m*sz])) {
			(&tensor.Tensor{DType: dx, Shape: []int{m}, Data: bx[:m*sz]}).RowInto(xb[p:p+m], 0, m)
			copy(eb[p:p+m], xb[p:p+m])
		} else {
			kernel.ReadBlock(exact, lo+p, xb[p:p+m])
			kernel.ReadBlock(expected, lo+p, eb[p:p+m])
		}
		p += m
	}
}

func nonUnit(shape []int) []int {
	var d []int
	for _, s := range shape {
		if s != 1 {
			d = append(d, s)
		}
	}
	return d
}

func orDefault(v, def float64) float64 {
	if v == 0 || math.IsNaN(v) {
		return def
	}
	return v
}

// finite reports whether x is neither NaN nor an infinity: an exponent
// that is not all ones, one test where IsNaN and IsInf make three (the
// passes over a whole output ask it twice an element).
func finite(x float64) bool { return math.Float64bits(x)&(0x7FF<<52) != 0x7FF<<52 }

func sq(x float64) float64 { return x * x }
