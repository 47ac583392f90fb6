// Package compare turns one output tensor of a kernel under test into
// metrics, a verdict and the worst elements named in the kernel's own
// coordinates, judging it three ways: against the EXACT reference (float64
// accumulation), with the EXPECTED reference (what a correct kernel of the
// declared precision produces) giving the noise floor |expected - exact|
// that separates rounding from bugs.
//
// The metrics are computed the same way whatever the tolerance; the
// tolerance comes from a Policy, the one replaceable piece (ThreeWay is the
// default, UnitRoundoff the provisional one of the foundation issue).
// Special values are judged first and exactly, as FlashMLA's compare.py
// does: a NaN or an infinity where the expected output has none (or the
// reverse) fails the check whatever the numbers say.
//
// The error of a Numeric output is measured against Exact (the truth), its
// ULP distance against Expected (both are values of the output dtype, so
// "off by one ulp" means one code apart). A Bitwise output is measured
// against Expected only, with tolerance zero.
package compare

import (
	"container/heap"
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"unsafe"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/signature"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Verdict is the outcome of a check (reference/CONTRACTS.md §7.2's vocabulary).
type Verdict string

// The verdicts. Error is for a file whose inputs cannot be judged; Compare
// itself never returns it in a Check.
const (
	Pass         Verdict = "pass"
	Fail         Verdict = "fail"
	Inconclusive Verdict = "inconclusive"
	Error        Verdict = "error"
)

// Check is the judgement of one output tensor, as it appears in
// `kcheck check --json` under checks[].
type Check struct {
	Tensor  string       `json:"tensor"`
	DType   tensor.DType `json:"dtype"`
	Shape   []int        `json:"shape"`
	Mode    string       `json:"mode"` // "numeric" or "bitwise"
	Verdict Verdict      `json:"verdict"`
	// Reason says in one sentence what decided the verdict.
	Reason    string    `json:"reason"`
	Metrics   Metrics   `json:"metrics"`
	Worst     []Element `json:"worst"`
	Policy    string    `json:"policy"`
	Tolerance string    `json:"tolerance"`
	// Signature names the pattern of the errors when the check does not pass.
	Signature *signature.Signature `json:"signature,omitempty"`
	// Profile is the excess by every coordinate value the signature was
	// read from, for a report's plots: set when Options.Profile asks for
	// it (a passing check's too). The JSON result does not carry it.
	Profile *signature.Profile `json:"-"`
	// bulk is how many elements were accounted for in bulk, their bytes
	// compared (kernel.Settler): the tests' proof that the fast path ran.
	bulk int
}

// Metrics are whole-tensor numbers. err_i is |actual_i - exact_i| for a
// Numeric output and |actual_i - expected_i| for a Bitwise one, or, where
// the actual and the expected disagree on a special value (a NaN or an
// infinity on one side only, or infinities of opposite signs),
// |actual_i - expected_i|, which is NaN or +Inf. The sums run over every
// element but those where both hold the same special value (a NaN where
// NaN is expected is correct) or where the exact value is not finite; a
// disagreement on a special value thus makes max abs, rmse, cos diff and
// sqnr NaN or infinite, as numpy's would be, and no metric can read as
// perfect. The floor metrics compare expected with exact wherever both are
// finite, whatever the actual holds. N counts every element. Non-finite
// values encode as "NaN", "+Inf", "-Inf".
type Metrics struct {
	N        int   `json:"n"`
	MaxAbs   Float `json:"max_abs"`
	MaxRel   Float `json:"max_rel"` // err_i/|ref_i|; +Inf where ref_i = 0 and err_i > 0
	MaxULP   Float `json:"max_ulp"` // codes between actual and expected in the actual's dtype
	CosDiff  Float `json:"cos_diff"`
	RMSE     Float `json:"rmse"`
	SQNRdB   Float `json:"sqnr_db"` // 10·log10(Σref²/Σerr²); +Inf when err is 0
	OverTol  int   `json:"over_tol"`
	OverFrac Float `json:"over_tol_frac"`
	// MaxExcess is the largest err_i/tol_i (+Inf for a special-value
	// mismatch or any error against a zero tolerance).
	MaxExcess   Float `json:"max_excess"`
	NaNMismatch int   `json:"nan_mismatch"`
	InfMismatch int   `json:"inf_mismatch"`
	// Overflow counts the elements whose exact answer is finite but that
	// the output's dtype rounds to an infinity (F16 from 65520 up): the
	// actual or the expected holds the infinity of the exact answer's sign
	// (reference/CONTRACTS.md §1.1). Always a fault, even where the actual
	// equals the expected inf: a correct kernel's answer that the output
	// dtype cannot hold is lost all the same. FirstOverflow is the first.
	Overflow      int      `json:"overflow,omitempty"`
	FirstOverflow *Element `json:"first_overflow,omitempty"`
	// Specials counts each special value the actual or the expected output
	// holds and locates the first element where they disagree on it: what
	// is judged first, before any number (FlashMLA's compare.py counts them
	// the same way).
	Specials []Special `json:"specials,omitempty"`
	// Excused counts differing elements that Output.Equivalent accepts.
	Excused int `json:"excused"`
	// The floor: expected against exact.
	FloorMaxAbs  Float `json:"floor_max_abs"`
	FloorRMSE    Float `json:"floor_rmse"`
	FloorCosDiff Float `json:"floor_cos_diff"`
	// Aggregate bounds (0 when the policy sets none) and actual/bound.
	RMSEBound    Float `json:"rmse_bound"`
	CosDiffBound Float `json:"cos_diff_bound"`
	RMSERatio    Float `json:"rmse_ratio"`
	CosDiffRatio Float `json:"cos_diff_ratio"`
}

// Special is one special value ("NaN", "+Inf" or "-Inf"): how many
// elements of the actual and of the expected output hold it, at how many
// positions exactly one of them does, and the first of those.
type Special struct {
	Value    string   `json:"value"`
	Actual   int      `json:"actual"`
	Expected int      `json:"expected"`
	Mismatch int      `json:"mismatch"`
	First    *Element `json:"first,omitempty"`
}

// String says it in one line, for the reports.
func (s Special) String() string {
	line := fmt.Sprintf("%s in %d elements of the actual output, %d of the expected", s.Value, s.Actual, s.Expected)
	if s.Mismatch > 0 && s.First != nil {
		line += fmt.Sprintf(": they differ at %d positions, the first at %s (actual %.6g, expected %.6g)",
			s.Mismatch, s.First.Where(), float64(s.First.Actual), float64(s.First.Expected))
	}
	return line
}

// specialValues are the values Special counts, in the order it lists them.
var specialValues = [...]string{"NaN", "+Inf", "-Inf"}

// specialOf is v's index in specialValues, or -1 for a number.
func specialOf(v float64) int {
	switch {
	case math.IsNaN(v):
		return 0
	case math.IsInf(v, 1):
		return 1
	case math.IsInf(v, -1):
		return 2
	}
	return -1
}

// Element is one of the worst elements.
type Element struct {
	Flat     int     `json:"index"`
	Index    []int   `json:"idx"`
	Coords   []Coord `json:"coords"`
	Actual   Float   `json:"actual"`
	Expected Float   `json:"expected"`
	Exact    Float   `json:"exact"`
	Err      Float   `json:"err"`
	Tol      Float   `json:"tol"`
	Excess   Float   `json:"excess"` // err/tol
}

// at names the element by its axes alone ("request 0, head 3, latent 17"),
// for a sentence.
func (e Element) at() string {
	return Element{Coords: e.Coords[:min(len(e.Index), len(e.Coords))]}.Where()
}

// Coord is a named coordinate of an element (kernel.Coord with JSON names).
type Coord struct {
	Name  string `json:"name"`
	Value int    `json:"value"`
}

// Where renders the coordinates as "request 0, head 3, latent 17".
func (e Element) Where() string {
	parts := make([]string, len(e.Coords))
	for i, c := range e.Coords {
		parts[i] = fmt.Sprintf("%s %d", c.Name, c.Value)
	}
	return strings.Join(parts, ", ")
}

// Options tune a comparison.
type Options struct {
	// WorstK is how many worst elements to report (default 5; negative: none).
	WorstK int
	// Context, when set, stops the comparison between chunks of elements
	// once it is done (a check past its deadline), and Compare returns its
	// error: an output computed on demand (a whole KV cache) is where a
	// check spends its time.
	Context context.Context
	// Profile asks for Check.Profile: the elements' excess by coordinate
	// value, from the same judgement as the metrics (a report plots it).
	Profile bool
	// ElementPath judges every element on the general path, its values
	// read one at a time: the fast path (elements whose actual, expected
	// and exact values are the same bits accounted for in bulk, runs of
	// them whose bytes the references vouch for (kernel.Settler) compared
	// as bytes, and values read a block at a time) must give the same
	// check, bit for bit, which the tests check with it. Both sum in the
	// same fixed order of chunks (tally). On the element path the
	// signature and the profile also read every element's excess again
	// rather than this pass's record of which fail (signature.Judged).
	ElementPath bool
}

// Compare judges actual against the reference side o with policy pol (the
// default policy when nil). The error return is for inputs that cannot be
// compared at all (a missing tensor, a shape or length that disagrees, a
// non-numeric dtype); every difference in values is a result in the Check.
func Compare(o kernel.Output, actual *tensor.Tensor, pol Policy, opts Options) (Check, error) {
	if actual == nil {
		return Check{}, fmt.Errorf("output %s is missing from the file under test", o.Name)
	}
	if err := actual.Check(); err != nil {
		return Check{}, fmt.Errorf("output %s: %v", o.Name, err)
	}
	if !actual.DType.IsFloat() && !actual.DType.IsInt() {
		return Check{}, fmt.Errorf("output %s has dtype %q, which holds no numbers", o.Name, actual.DType)
	}
	N := actual.Len()
	if o.Exact == nil || o.Expected == nil {
		return Check{}, fmt.Errorf("output %s: the reference lacks its exact or its expected values", o.Name)
	}
	if o.Exact.Len() != o.Expected.Len() {
		return Check{}, fmt.Errorf("output %s: the reference has %d exact and %d expected values", o.Name, o.Exact.Len(), o.Expected.Len())
	}
	if o.Shape != nil && !slices.Equal(o.Shape, actual.Shape) {
		return Check{}, fmt.Errorf("output %s has shape %v; the reference has %v", o.Name, actual.Shape, o.Shape)
	}
	if o.Expected.Len() != N {
		return Check{}, fmt.Errorf("output %s has %d elements; the reference has %d", o.Name, N, o.Expected.Len())
	}
	if pol == nil {
		pol = DefaultPolicy()
	}
	shape := actual.Shape
	c := Check{Tensor: o.Name, DType: actual.DType, Shape: append([]int(nil), shape...), Mode: "numeric"}

	ctx := opts.Context
	if ctx == nil {
		ctx = context.Background()
	}
	var b Bounds
	if o.Mode == kernel.Bitwise {
		c.Mode = "bitwise"
		c.Policy = "bitwise"
		b = Bounds{Tol: func(int, float64, float64) float64 { return 0 }, Band: 1,
			Explanation: "bitwise: every element must equal the expected value (NaN equals NaN)"}
		if o.Equivalent != nil {
			b.Explanation += " unless the kernel's equivalence rule accepts it (rounding ties, reordered ties, padding)"
		}
	} else {
		c.Policy = pol.Name()
		b = pol.Bounds(ctx, o, actual.DType)
		if err := ctx.Err(); err != nil { // bounds of part of the output
			return Check{}, err
		}
	}
	band := max(b.Band, 1)
	c.Tolerance = b.Explanation

	k := opts.WorstK
	if k == 0 {
		k = 5
	}
	j := newJudge(&o, actual, b)
	j.elementPath = opts.ElementPath
	j.worstK, j.band = k, band
	j.sample = signature.NewSample(signature.SampleRate(N, signature.DefaultMaxElements))
	if !opts.ElementPath {
		j.record, j.recordAll, j.failSeen = true, opts.Profile, new(atomic.Bool)
	}
	j.ctx = ctx
	var t tally
	if err := j.tallyAll(N, &t); err != nil {
		return Check{}, err
	}
	m := &c.Metrics
	m.N = N
	m.NaNMismatch, m.InfMismatch, m.Overflow, m.Excused = t.nanMis, t.infMis, t.ovf, t.excused
	c.bulk = t.bulk
	sumErr2, sumFloor2 := t.sumErr2, t.sumFloor2
	sumRef2, sumA2, sumE2, sumX2 := t.sumRef2, t.sumA2, t.sumE2, t.sumX2
	nJudged, overElems, beyondBand := t.nJudged, t.overElems, t.beyondBand
	maxAbs, maxRel, maxULP, floorMax, maxExc := t.maxAbs, t.maxRel, t.maxULP, t.floorMax, t.maxExc
	specials, firstSpecial, firstOverflow := t.specials, t.firstSpecial, t.firstOverflow
	worst := &t.worst
	nonFinite := m.NaNMismatch + m.InfMismatch
	if m.Overflow > 0 {
		first := named(firstOverflow, shape, o.Coords)
		m.FirstOverflow = &first
	}
	var differ []string
	for v := range specials {
		if sp := &specials[v]; sp.Actual+sp.Expected > 0 {
			sp.Value = specialValues[v]
			if sp.Mismatch > 0 {
				first := named(firstSpecial[v], shape, o.Coords)
				sp.First = &first
				differ = append(differ, fmt.Sprintf("%s at %d positions, the first at %s", sp.Value, sp.Mismatch, first.at()))
			}
			m.Specials = append(m.Specials, *sp)
		}
	}
	m.MaxAbs, m.MaxRel, m.MaxULP, m.MaxExcess = Float(maxAbs), Float(maxRel), Float(maxULP), Float(maxExc)
	m.FloorMaxAbs = Float(floorMax)
	m.OverTol = overElems
	if N > 0 {
		m.OverFrac = Float(float64(overElems) / float64(N))
	}
	m.CosDiff = Float(cosDiff(sumErr2, sumA2+sumRef2))
	m.FloorCosDiff = Float(cosDiff(sumFloor2, sumE2+sumX2))
	if nJudged > 0 {
		m.RMSE = Float(math.Sqrt(sumErr2 / float64(nJudged)))
		m.FloorRMSE = Float(math.Sqrt(sumFloor2 / float64(nJudged)))
	}
	switch {
	case sumErr2 == 0:
		m.SQNRdB = Float(math.Inf(1))
	default:
		m.SQNRdB = Float(10 * math.Log10(sumRef2/sumErr2))
	}

	aggFail := ""
	if a := b.Aggregate; a != nil && o.Mode != kernel.Bitwise {
		m.RMSEBound, m.CosDiffBound = Float(a.RMSE), Float(a.CosDiff)
		m.RMSERatio = Float(ratio(float64(m.RMSE), a.RMSE))
		m.CosDiffRatio = Float(ratio(float64(m.CosDiff), a.CosDiff))
		switch {
		case m.RMSERatio > 1:
			aggFail = fmt.Sprintf("rmse %.3g is %.1f× its bound %.3g (floor rmse %.3g): a systematic error", float64(m.RMSE), float64(m.RMSERatio), a.RMSE, a.FloorRMSE)
		case m.CosDiffRatio > 1:
			aggFail = fmt.Sprintf("cos_diff %.3g is %.1f× its bound %.3g (floor %.3g): a systematic error", float64(m.CosDiff), float64(m.CosDiffRatio), a.CosDiff, a.FloorCosDiff)
		}
	}

	switch {
	case m.Overflow > 0:
		c.Verdict = Fail
		f := m.FirstOverflow
		c.Reason = fmt.Sprintf("overflow: %d of %d elements are an infinity in %s where the exact answer is finite, the first at %s (exact %.6g, expected %.6g, actual %.6g)",
			m.Overflow, N, actual.DType, f.at(), float64(f.Exact), float64(f.Expected), float64(f.Actual))
		if nonFinite > 0 {
			c.Reason += fmt.Sprintf("; special values also disagree with the expected output at %d elements: %s", nonFinite, strings.Join(differ, "; "))
		}
	case nonFinite > 0:
		c.Verdict = Fail
		c.Reason = fmt.Sprintf("special values disagree with the expected output at %d of %d elements: %s", nonFinite, N, strings.Join(differ, "; "))
	case o.Mode == kernel.Bitwise && overElems > 0:
		c.Verdict = Fail
		c.Reason = fmt.Sprintf("%d of %d elements differ from the expected bits", overElems, N)
	case beyondBand > 0:
		c.Verdict = Fail
		c.Reason = fmt.Sprintf("%d of %d elements exceed %g× their tolerance (worst %.3g×)", beyondBand, N, band, maxExc)
	case aggFail != "":
		c.Verdict = Fail
		c.Reason = aggFail
	case overElems > 0:
		c.Verdict = Inconclusive
		c.Reason = fmt.Sprintf("%d of %d elements exceed their tolerance by at most %.3g× (within the %g× band)", overElems, N, maxExc, band)
	default:
		c.Verdict = Pass
		c.Reason = fmt.Sprintf("every element within tolerance (worst %.3g× of it)", maxExc)
		if m.Excused > 0 {
			c.Reason += fmt.Sprintf("; %d differing elements accepted as equivalent", m.Excused)
		}
	}

	c.Worst = worst.sorted(shape, o.Coords)
	if c.Verdict != Pass || opts.Profile {
		// The signature reads the failing elements' excess and a sample of
		// the rest (all of them, in an output under
		// signature.DefaultMaxElements): from the record this pass kept,
		// up to its cap, and judged again on each read past it, since an
		// output may be a whole KV cache; which elements fail, and the
		// largest finite excess, this pass has found already.
		var judged *signature.Judged
		if !opts.ElementPath {
			judged = &signature.Judged{Failing: t.failSet, MaxFinite: t.maxFinite}
			if judged.Failing == nil {
				judged.Failing = make([]uint64, (N+63)/64)
			}
		}
		if c.Verdict != Pass {
			c.Signature, c.Profile = signature.AnalyzeProfile(o, newExcessValues(N, j, &t), signature.Options{Systematic: overElems == 0 && aggFail != "", Actual: actual.Float64At,
				NonFinite: nonFinite, Overflow: m.Overflow, OverflowDType: actual.DType, Profile: opts.Profile, Judged: judged, Context: ctx})
		} else {
			c.Profile = signature.NewProfile(o, newExcessValues(N, j, &t), signature.Options{Judged: judged, Context: ctx})
		}
	}
	if err := j.ctx.Err(); err != nil { // the excess read as 0 from then on: no signature, no profile
		return Check{}, err
	}
	return c, nil
}

// special says how an element's special values (NaN, Inf) decide it.
type special uint8

const (
	numbers     special = iota // finite on both sides: judged by the error
	nanMatch                   // NaN where NaN is expected: correct
	nanMismatch                // NaN on one side only: fails
	infMatch                   // the same infinity: correct
	infMismatch                // an infinity on one side, or of the other sign: fails
	overflow                   // an infinity the output dtype made of a finite exact answer: fails
	// same: actual, expected and exact are the same finite float64 bits,
	// which always pass with no error: the bulk of a correct output,
	// accounted for without the tolerance, the ULP distance or the
	// equivalence rule.
	same
)

// judge is the judgement of one element, the one definition Compare's
// metrics and the excess the signature reads both come from.
type judge struct {
	o      *kernel.Output
	actual *tensor.Tensor
	b      Bounds
	ulp    func(a, b float64) (uint64, bool)
	// win: the window the parallel passes share (see window)
	win     *window
	winMade bool
	// av, ev, xv, tol: rawRun's blocks of actual, expected and exact
	// values and of tolerances
	av, ev, xv, tol []float64
	// elementPath: no bulk accounting, values read one at a time (Options)
	elementPath bool
	ctx         context.Context // checked between chunks of elements
	// sx, se: the references' Settlers (nil: no bulk runs)
	sx, se kernel.Settler
	// worstK and band: Compare's, for the tallies
	worstK int
	band   float64
	// record: the tallies record the excess a profile reads, the failing
	// elements' and those in its sample (tally.rec: every element's,
	// where the sample is all); not on the element path, whose profile
	// judges every element again. recordAll: from the first element on
	// (the profile is asked for), not from the first failing chunk.
	record, recordAll bool
	sample            signature.Sample
	// failSeen: a chunk has failed; shared by the judge's forks
	failSeen *atomic.Bool
}

func newJudge(o *kernel.Output, actual *tensor.Tensor, b Bounds) *judge {
	j := &judge{o: o, actual: actual, b: b, ulp: ulpDistanceOf(actual.DType), ctx: context.Background()}
	j.sx, j.se = settlers(o, actual.DType)
	return j
}

// element is one element judged: its actual, expected and exact values,
// and, for numbers, the reference the error is taken against, the error,
// the tolerance and the excess err/tol (+Inf for an error against a zero
// tolerance, or a bitwise difference; 0 where the equivalence rule excused
// it), and the ULP distance of actual from expected in the output's dtype.
type element struct {
	av, ev, xv         float64
	ref, err, tol, exc float64
	ulp                uint64
	// the small fields together: 72 bytes an element rather than 88, a
	// chunk's buffer written and read back by every judged element
	special                 special
	differs, excused, ulpOK bool
}

// at judges element i.
func (j *judge) at(i int) element {
	e := j.raw(i)
	j.excuse(i, &e)
	return e
}

// raw judges element i up to the equivalence rule, which excuse applies:
// raw reads the output only through j's own readers and the stateless
// bounds, so forks of a judge may run it from several goroutines, while
// an Equivalent rule may keep state and runs on one.
func (j *judge) raw(i int) element {
	return j.rawOf(i, j.actual.Float64At(i), j.o.Expected.At(i), j.o.Exact.At(i))
}

// rawOf is raw on element i's values, already read.
func (j *judge) rawOf(i int, av, ev, xv float64) element {
	var e element
	j.rawInto(&e, i, av, ev, xv)
	return e
}

// rawInto is rawOf into *e, in place: a run's elements are judged where
// they are kept, not built and copied (88 bytes an element).
func (j *judge) rawInto(e *element, i int, av, ev, xv float64) {
	if j.classify(e, av, ev, xv) {
		j.finish(e, j.b.Tol(i, xv, ev))
	}
}

// classify judges what an element's values decide without its tolerance:
// the same bits on all three sides (but on the element path), a special
// value's match or mismatch. It reports whether the element is numbers,
// to be judged by its error against the tolerance (finish).
func (j *judge) classify(e *element, av, ev, xv float64) bool {
	if b := math.Float64bits(av); !j.elementPath && b == math.Float64bits(ev) && b == math.Float64bits(xv) && finite(av) {
		*e = element{special: same, av: av, ev: ev, xv: xv}
		return false
	}
	*e = element{av: av, ev: ev, xv: xv}
	nanA, nanE := math.IsNaN(av), math.IsNaN(ev)
	switch {
	case nanA != nanE:
		e.special = nanMismatch
		return false
	case nanA:
		e.special = nanMatch
		return false
	case math.IsInf(av, 0) || math.IsInf(ev, 0):
		e.special = infMatch
		if av != ev {
			e.special = infMismatch
		}
		if overflowed(j.actual.DType, av, ev, xv) {
			e.special = overflow
		}
		return false
	}
	return true
}

// finish judges a numbers element (classify) by its error against tol,
// its tolerance (Bounds.Tol).
func (j *judge) finish(e *element, tol float64) {
	av, ev, xv := e.av, e.ev, e.xv
	bitwise := j.o.Mode == kernel.Bitwise
	e.ref = xv
	if bitwise || !finite(xv) {
		e.ref = ev
	}
	e.err = math.Abs(av - e.ref)
	e.tol = tol
	e.differs = e.err > e.tol
	if bitwise {
		e.differs = av != ev
	}
	if e.differs {
		e.exc = math.Inf(1)
		if e.tol > 0 {
			e.exc = e.err / e.tol
		}
	} else if e.tol > 0 {
		e.exc = e.err / e.tol
	}
	e.ulp, e.ulpOK = j.ulp(av, ev)
}

// rawRun judges elements lo .. lo+len(dst)-1 up to the equivalence rule
// into dst, as raw does one by one: their values are read a block at a
// time (kernel.ReadBlock), not through three interface calls an element,
// and the tolerances of those judged by their error in one call
// (Bounds.TolRun).
func (j *judge) rawRun(lo int, dst []element) {
	n := len(dst)
	if j.elementPath {
		for k := range dst {
			dst[k] = j.raw(lo + k)
		}
		return
	}
	if cap(j.av) < n {
		j.av, j.ev, j.xv, j.tol = make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
	}
	av, ev, xv, tol := j.av[:n], j.ev[:n], j.xv[:n], j.tol[:n]
	j.actual.RowInto(av, lo, n)
	kernel.ReadBlock(j.o.Expected, lo, ev)
	kernel.ReadBlock(j.o.Exact, lo, xv)
	judged := false // by the error: some element needs its tolerance
	for k := range dst {
		judged = j.classify(&dst[k], av[k], ev[k], xv[k]) || judged
	}
	if !judged {
		return
	}
	if j.b.TolRun != nil {
		j.b.TolRun(lo, xv, ev, tol)
	}
	for k := range dst {
		if dst[k].special != numbers {
			continue
		}
		if j.b.TolRun == nil {
			tol[k] = j.b.Tol(lo+k, xv[k], ev[k])
		}
		j.finish(&dst[k], tol[k])
	}
}

// excuse applies the output's equivalence rule to a differing element.
func (j *judge) excuse(i int, e *element) {
	if e.differs && e.special == 0 && j.o.Equivalent != nil && j.o.Equivalent(i, e.av) {
		e.excused = true
		e.exc = 0
	}
}

// parallelChunk is how many elements one goroutine judges at a time when
// an output is shared out (about a tenth of a millisecond of work); outputs
// under two chunks are judged on one goroutine.
const parallelChunk = 1 << 12

// ScratchBytes is the most a comparison holds besides its inputs and the
// reference: the judged elements of one chunk per CPU and the four
// blocks of values and tolerances each was judged from, whatever the
// output's size (internal/check counts it in its memory estimates). Not
// counted, as the signature's bitmap of failing elements (N/8 bytes) is
// not: the record of the excess the profile reads, made for a failing
// output (or one whose profile is asked for), 16 bytes an element it
// holds and at most recordCap elements (64 MiB).
func ScratchBytes() int64 {
	return int64(runtime.GOMAXPROCS(0)) * parallelChunk * int64(unsafe.Sizeof(element{})+4*8)
}

// window returns the judge's window for an output of n elements, made on
// first use and shared by the comparison and the signature's passes: one
// reader of the output per CPU. It is nil when the output is too small to
// share out, there is one CPU, or its values cannot be read from several
// goroutines (see kernel.Fork).
func (j *judge) window(n int) *window {
	if j.winMade {
		return j.win
	}
	j.winMade = true
	w := min(runtime.GOMAXPROCS(0), (n+parallelChunk-1)/parallelChunk)
	if w < 2 {
		return nil
	}
	forks := make([]*judge, 0, w)
	for k := 0; k < w; k++ {
		ex, ok1 := kernel.Fork(j.o.Exact)
		xp, ok2 := kernel.Fork(j.o.Expected)
		if !ok1 || !ok2 {
			return nil
		}
		o := *j.o
		o.Exact, o.Expected = ex, xp
		f := newJudge(&o, j.actual, j.b)
		f.elementPath, f.worstK, f.band, f.ctx = j.elementPath, j.worstK, j.band, j.ctx
		f.record, f.recordAll, f.sample, f.failSeen = j.record, j.recordAll, j.sample, j.failSeen
		forks = append(forks, f)
	}
	j.win = &window{forks: forks, chunks: make([]chunk, len(forks))}
	return j.win
}

// excess is the element's err/tol as the signature reads it: +Inf for a
// special-value mismatch, 0 for a special value that matches.
func (e element) excess() float64 {
	switch e.special {
	case nanMismatch, infMismatch, overflow:
		return math.Inf(1)
	case nanMatch, infMatch, same:
		return 0
	}
	return e.exc
}

// excessValues is every element's excess as kernel.Values, judged again
// on each read (an output may be a whole KV cache: nothing is stored per
// element). The signature reads them in passes from the first element to
// the last, so a read outside the window the last read judged judges the
// window from there on every core (as tallyAll does). Once the judge's
// context is done every element reads as 0 without being judged, so the
// signature's passes end at once (Compare then returns the context's
// error).
type excessValues struct {
	n       int
	j       *judge
	w       *window // nil: one goroutine
	stopped bool
	// rec, recFrom, recUpTo: the comparison's record; p its cursor
	// (fromRecord)
	rec              []recorded
	recFrom, recUpTo int
	p                int
}

func newExcessValues(n int, j *judge, t *tally) *excessValues {
	x := &excessValues{n: n, j: j, w: j.window(n)}
	if j.record {
		x.rec, x.recFrom, x.recUpTo = t.rec, t.recFrom, t.recUpTo
	}
	return x
}

// fromRecord returns element i's excess from the comparison's record
// (tally.rec), ok = false where the record does not hold it: elements
// outside [recFrom, recUpTo), and those neither failing nor in the
// sample. A sampled element in that range that is not in it was in a bulk
// run: its excess
// is 0. Reads in index order advance a cursor; a read behind it searches.
func (x *excessValues) fromRecord(i int) (float64, bool) {
	r := x.rec
	if i < x.recFrom || i >= x.recUpTo || r == nil {
		return 0, false
	}
	if x.p > 0 && r[x.p-1].i >= i {
		x.p = sort.Search(len(r), func(k int) bool { return r[k].i >= i })
	}
	for x.p < len(r) && r[x.p].i < i {
		x.p++
	}
	if x.p < len(r) && r[x.p].i == i {
		return r[x.p].exc, true
	}
	if x.j.sample.Has(i) {
		return 0, true
	}
	return 0, false
}

func (x *excessValues) Len() int { return x.n }

func (x *excessValues) At(i int) float64 {
	if x.stopped || (i%parallelChunk == 0 && x.j.ctx.Err() != nil) {
		x.stopped = true
		return 0
	}
	if v, ok := x.fromRecord(i); ok {
		return v
	}
	if w := x.w; w != nil && i < x.n {
		// A read outside the window judges the window from i on: the
		// signature reads in passes in index order, each skipping the
		// elements it has no use for and those the record serves, so a
		// pass's first read may lie anywhere behind the last pass's
		// window, and its next anywhere past the window's end. (The
		// window Compare's tally left, not full, holds no element judged
		// for reading.)
		if !(w.full && i >= w.lo && i < w.hi) {
			if x.j.ctx.Err() != nil {
				x.stopped = true
				return 0
			}
			w.fill(i, x.n, true)
		}
		e := *w.element(i)
		x.j.excuse(i, &e)
		return e.excess()
	}
	return x.j.at(i).excess()
}

// cosDiff is FlashMLA's cosine difference 1 - 2Σxy/Σ(x²+y²), computed as
// Σ(x-y)²/Σ(x²+y²), the same number: x² - 2xy + y² = (x-y)². The first form
// subtracts two sums that agree to the last bits when x and y are close,
// which leaves float64 rounding of the sums, about N·2^-53 (1e-13 over a
// million elements), in place of a difference of 1e-16, even a negative
// one; that noise made a bit-exact declared-precision output fail its
// cos_diff bound (issue 11 item 2). The second sums non-negative terms and
// is accurate to a few ulps of itself.
func cosDiff(sumDiff2, sumSq float64) float64 {
	if sumSq == 0 {
		return 0
	}
	return sumDiff2 / sumSq
}

func ratio(v, bound float64) float64 {
	switch {
	case v == 0:
		return 0
	case bound == 0:
		return math.Inf(1)
	}
	return v / bound
}

// item and elemHeap keep the k worst elements (a min-heap on badness).
type item struct {
	i                    int
	av, ev, xv, err, tol float64
	exc                  float64
}

type elemHeap struct{ items []item }

// less orders by excess, then by error, then by lower index (so ties are
// reported in a deterministic order).
func (h *elemHeap) less(a, b item) bool {
	if a.exc != b.exc {
		return a.exc < b.exc
	}
	ae, be := a.err, b.err
	if math.IsNaN(ae) != math.IsNaN(be) {
		return !math.IsNaN(ae)
	}
	if ae != be && !math.IsNaN(ae) { // two NaN errors tie
		return ae < be
	}
	return a.i > b.i
}
func (h *elemHeap) Len() int           { return len(h.items) }
func (h *elemHeap) Less(i, j int) bool { return h.less(h.items[i], h.items[j]) }
func (h *elemHeap) Swap(i, j int)      { h.items[i], h.items[j] = h.items[j], h.items[i] }
func (h *elemHeap) Push(x any)         { h.items = append(h.items, x.(item)) }
func (h *elemHeap) Pop() any {
	it := h.items[len(h.items)-1]
	h.items = h.items[:len(h.items)-1]
	return it
}

func (h *elemHeap) sorted(shape []int, coords kernel.Coords) []Element {
	out := make([]Element, h.Len())
	for j := len(out) - 1; j >= 0; j-- {
		out[j] = named(heap.Pop(h).(item), shape, coords)
	}
	return out
}

// named is it as an Element, its position named in the kernel's coordinates.
func named(it item, shape []int, coords kernel.Coords) Element {
	idx := tensor.Unravel(it.i, shape)
	var cs []Coord
	for _, kc := range coords.Name(idx) {
		cs = append(cs, Coord{kc.Name(), kc.Value})
	}
	return Element{Flat: it.i, Index: idx, Coords: cs, Actual: Float(it.av), Expected: Float(it.ev),
		Exact: Float(it.xv), Err: Float(it.err), Tol: Float(it.tol), Excess: Float(it.exc)}
}

// Combine folds verdicts into one: any error gives error, else any fail
// gives fail, else any inconclusive gives inconclusive, else pass. No
// verdicts at all give inconclusive: nothing was verified.
func Combine(vs ...Verdict) Verdict {
	if len(vs) == 0 {
		return Inconclusive
	}
	rank := map[Verdict]int{Pass: 0, Inconclusive: 1, Fail: 2, Error: 3}
	out := Pass
	for _, v := range vs {
		r, ok := rank[v]
		if !ok {
			r = 3 // an unknown verdict cannot be trusted
			v = Error
		}
		if r > rank[out] {
			out = v
		}
	}
	return out
}

// FileVerdict combines the verdicts of a file's checks.
func FileVerdict(checks []Check) Verdict {
	vs := make([]Verdict, len(checks))
	for i, c := range checks {
		vs[i] = c.Verdict
	}
	return Combine(vs...)
}
