package compare

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/signature"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// constPolicy allows the same tolerance everywhere, so metric and verdict
// tests do not depend on the real policies.
type constPolicy struct{ tol, band float64 }

func (constPolicy) Name() string { return "const" }
func (p constPolicy) Bounds(context.Context, kernel.Output, tensor.DType) Bounds {
	return Bounds{Tol: func(int, float64, float64) float64 { return p.tol }, Band: p.band, Explanation: "constant"}
}

func near(a, b, rel float64) bool { return math.Abs(a-b) <= rel*math.Abs(b) }

func TestMetricsByHand(t *testing.T) {
	o := kernel.Output{Name: "y", Shape: []int{2, 2}, DType: tensor.F32,
		Exact: kernel.Dense([]float64{1, 2, 3, 4}), Expected: kernel.Dense([]float64{1, 2, 3, 4}),
		Coords: kernel.Coords{Axes: []kernel.CoordKind{"row", "col"}}}
	act := tensor.FromFloat64s(tensor.F32, []int{2, 2}, []float64{1, 2.5, 3, 3})
	c, err := Compare(o, act, constPolicy{tol: 0.4, band: 2}, Options{WorstK: 3})
	if err != nil {
		t.Fatal(err)
	}
	m := c.Metrics
	// err = [0, .5, 0, 1].
	//   max_rel = max(.5/2, 1/4) = .25
	//   rmse = sqrt((.25 + 1)/4) = sqrt(.3125)
	//   cos_diff = 1 - 2Σxy/Σ(x²+y²), Σxy = 1+5+9+12 = 27, Σx² = 1+6.25+9+9 = 25.25, Σy² = 30
	//            = 1 - 54/55.25 = 1.25/55.25
	//   sqnr = 10·log10(30/1.25) = 10·log10(24) = 13.8021 dB
	//   ulp: fp32 2 = 0x40000000, 2.5 = 0x40200000: 2^21; 3 = 0x40400000, 4 = 0x40800000: 2^22
	checks := []struct {
		name      string
		got, want float64
	}{
		{"max_abs", float64(m.MaxAbs), 1},
		{"max_rel", float64(m.MaxRel), 0.25},
		{"rmse", float64(m.RMSE), math.Sqrt(0.3125)},
		{"cos_diff", float64(m.CosDiff), 1.25 / 55.25},
		{"sqnr_db", float64(m.SQNRdB), 13.802112417116060},
		{"max_ulp", float64(m.MaxULP), 1 << 22},
		{"max_excess", float64(m.MaxExcess), 2.5},
		{"over_tol_frac", float64(m.OverFrac), 0.5},
	}
	for _, ch := range checks {
		if !near(ch.got, ch.want, 1e-12) {
			t.Errorf("%s = %.17g, want %.17g", ch.name, ch.got, ch.want)
		}
	}
	if m.OverTol != 2 || m.N != 4 {
		t.Errorf("over_tol %d n %d, want 2 and 4", m.OverTol, m.N)
	}
	// err 1 against tol .4 is 2.5× > band 2: fail.
	if c.Verdict != Fail {
		t.Errorf("verdict %s, want fail", c.Verdict)
	}
	if len(c.Worst) != 2 || c.Worst[0].Flat != 3 || c.Worst[1].Flat != 1 {
		t.Fatalf("worst %+v, want flat 3 then 1 (elements with zero error are not listed)", c.Worst)
	}
	w := c.Worst[0]
	if w.Where() != "row 1, col 1" || w.Err != 1 || w.Tol != 0.4 || w.Actual != 3 || w.Exact != 4 {
		t.Errorf("worst[0] = %+v (%s)", w, w.Where())
	}

	// With tol .6 the worst excess is 1/.6 = 1.67: inside the band.
	c, _ = Compare(o, act, constPolicy{tol: 0.6, band: 2}, Options{})
	if c.Verdict != Inconclusive {
		t.Errorf("tol .6: verdict %s, want inconclusive", c.Verdict)
	}
	c, _ = Compare(o, act, constPolicy{tol: 1, band: 2}, Options{})
	if c.Verdict != Pass || c.Signature != nil {
		t.Errorf("tol 1: verdict %s signature %v, want pass without signature", c.Verdict, c.Signature)
	}
}

func TestCosDiffZeroAndSQNRInf(t *testing.T) {
	o := kernel.Output{Name: "z", Shape: []int{3}, Exact: kernel.Dense([]float64{0, 0, 0}), Expected: kernel.Dense([]float64{0, 0, 0})}
	c, err := Compare(o, tensor.New(tensor.BF16, 3), ThreeWay{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	m := c.Metrics
	if m.CosDiff != 0 || !math.IsInf(float64(m.SQNRdB), 1) || m.RMSE != 0 || c.Verdict != Pass {
		t.Errorf("all-zero tensors: cos_diff %v sqnr %v rmse %v verdict %s; want 0, +Inf, 0, pass", m.CosDiff, m.SQNRdB, m.RMSE, c.Verdict)
	}
}

func TestSpecialValuesFirst(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	o := kernel.Output{Name: "lse", Shape: []int{5},
		Exact:    kernel.Dense([]float64{nan, inf, 1, -inf, 2}),
		Expected: kernel.Dense([]float64{nan, inf, 1, -inf, 2})}
	tests := []struct {
		name     string
		actual   []float64
		nan, inf int
		verdict  Verdict
	}{
		{"all agree", []float64{nan, inf, 1, -inf, 2}, 0, 0, Pass},
		{"NaN where a number is expected", []float64{nan, inf, nan, -inf, 2}, 1, 0, Fail},
		{"number where NaN is expected", []float64{0, inf, 1, -inf, 2}, 1, 0, Fail},
		{"infinity of the wrong sign", []float64{nan, inf, 1, inf, 2}, 0, 1, Fail},
		{"finite where infinity is expected", []float64{nan, 3e38, 1, -inf, 2}, 0, 1, Fail},
		{"infinity where a number is expected", []float64{nan, inf, 1, -inf, inf}, 0, 1, Fail},
	}
	for _, tc := range tests {
		act := tensor.FromFloat64s(tensor.F32, []int{5}, tc.actual)
		// A huge tolerance: special values must fail whatever the numbers allow.
		c, err := Compare(o, act, constPolicy{tol: 1e300, band: 2}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if c.Metrics.NaNMismatch != tc.nan || c.Metrics.InfMismatch != tc.inf || c.Verdict != tc.verdict {
			t.Errorf("%s: nan %d inf %d verdict %s; want %d %d %s", tc.name, c.Metrics.NaNMismatch, c.Metrics.InfMismatch, c.Verdict, tc.nan, tc.inf, tc.verdict)
		}
		if tc.verdict == Fail && (len(c.Worst) == 0 || !math.IsInf(float64(c.Worst[0].Excess), 1)) {
			t.Errorf("%s: the mismatch is not the worst element: %+v", tc.name, c.Worst)
		}
	}
}

// A NaN or an infinity where a number belongs is counted and located
// before any number is judged (FlashMLA's tests/kernelkit/compare.py does the
// same), and enters the error metrics as IEEE arithmetic has it: none of
// them may read as perfect (max abs 0, rmse 0, sqnr +Inf, cos_diff 0, max
// ulp 0), and the signature names the special values, not "uniform". The
// floor (expected against exact) does not depend on the actual at all.
func TestNonFiniteNeverLooksPerfect(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	const n = 64
	exact, expected := make([]float64, n), make([]float64, n)
	for i := range exact {
		exact[i] = math.Sin(float64(i)) + 2
		expected[i] = float64(float32(exact[i]))
	}
	fill := func(v float64, at func(i int) bool) []float64 {
		a := append([]float64(nil), expected...)
		for i := range a {
			if at(i) {
				a[i] = v
			}
		}
		return a
	}
	every := func(int) bool { return true }
	tests := []struct {
		name     string
		actual   []float64
		value    string // the special value that differs
		mismatch int
		first    int
	}{
		{"all NaN", fill(nan, every), "NaN", n, 0},
		{"one NaN, the rest exact", fill(nan, func(i int) bool { return i == 37 }), "NaN", 1, 37},
		{"all +Inf", fill(inf, every), "+Inf", n, 0},
		{"-Inf in the second half", fill(-inf, func(i int) bool { return i >= n/2 }), "-Inf", n / 2, n / 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := kernel.Output{Name: "out", Shape: []int{8, 8}, Exact: kernel.Dense(exact), Expected: kernel.Dense(expected),
				Coords: kernel.Coords{Axes: []kernel.CoordKind{"row", "col"}}}
			c, err := Compare(o, tensor.FromFloat64s(tensor.F32, []int{8, 8}, tc.actual), ThreeWay{}, Options{})
			if err != nil {
				t.Fatal(err)
			}
			m := c.Metrics
			if c.Verdict != Fail || m.OverTol != tc.mismatch {
				t.Errorf("verdict %s, %d over tolerance; want fail, %d", c.Verdict, m.OverTol, tc.mismatch)
			}
			// Errors are NaN or infinite; the ulp distance from an infinity
			// to a number is a finite count of codes, but never 0.
			for _, p := range []struct {
				name      string
				v         Float
				perfect   float64
				nonFinite bool
			}{{"max_abs", m.MaxAbs, 0, true}, {"max_rel", m.MaxRel, 0, true}, {"max_ulp", m.MaxULP, 0, tc.value == "NaN"},
				{"rmse", m.RMSE, 0, true}, {"cos_diff", m.CosDiff, 0, true}, {"sqnr_db", m.SQNRdB, inf, true}} {
				finite := !math.IsNaN(float64(p.v)) && !math.IsInf(float64(p.v), 0)
				if float64(p.v) == p.perfect || (p.nonFinite && finite) {
					t.Errorf("%s = %v: a tensor with %d unexpected %s must not read as perfect (nor as a finite error)", p.name, float64(p.v), tc.mismatch, tc.value)
				}
			}
			if m.FloorMaxAbs == 0 || m.FloorRMSE == 0 || m.FloorCosDiff == 0 {
				t.Errorf("floor max abs %v rmse %v cos_diff %v: the floor is expected against exact, whatever the actual holds",
					m.FloorMaxAbs, m.FloorRMSE, m.FloorCosDiff)
			}
			var sp *Special
			for i := range m.Specials {
				if m.Specials[i].Value == tc.value {
					sp = &m.Specials[i]
				}
			}
			if sp == nil || sp.Actual != tc.mismatch || sp.Expected != 0 || sp.Mismatch != tc.mismatch || sp.First == nil ||
				sp.First.Flat != tc.first || sp.First.Where() != fmt.Sprintf("row %d, col %d", tc.first/8, tc.first%8) {
				t.Fatalf("specials %+v: want %s in %d elements of the actual, none of the expected, first at %d", m.Specials, tc.value, tc.mismatch, tc.first)
			}
			if !strings.Contains(c.Reason, tc.value) || !strings.Contains(c.Reason, sp.First.Where()) {
				t.Errorf("reason %q does not name the %s and where the first is", c.Reason, tc.value)
			}
			if c.Signature == nil || (c.Signature.Pattern != signature.NonFinite && tc.mismatch == n) || !strings.HasPrefix(c.Signature.Detail, fmt.Sprint(tc.mismatch)) {
				t.Errorf("signature %+v: want %s first", c.Signature, signature.NonFinite)
			}
			// The worst elements are the special ones, in index order.
			if len(c.Worst) == 0 || c.Worst[0].Flat != tc.first {
				t.Errorf("worst elements %+v: want element %d first", c.Worst, tc.first)
			}
			for i := 1; i < len(c.Worst) && tc.mismatch == n; i++ {
				if c.Worst[i].Flat != i {
					t.Errorf("worst elements at %d: %d; equally bad elements come in index order", i, c.Worst[i].Flat)
				}
			}
		})
	}
}

func TestBitwise(t *testing.T) {
	nan := math.NaN()
	o := kernel.Output{Name: "codes", Shape: []int{4}, DType: tensor.F8E4M3, Mode: kernel.Bitwise,
		Exact: kernel.Dense([]float64{1, 2.1, 3, nan}), Expected: kernel.Dense([]float64{1, 2, 3, nan})}
	act := tensor.FromFloat64s(tensor.F8E4M3, []int{4}, []float64{1, 2.25, 3, nan})
	c, err := Compare(o, act, ThreeWay{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	// 2.25 and 2 are neighbouring E4M3 codes (spacing .25 in [2, 4)).
	if c.Verdict != Fail || c.Metrics.OverTol != 1 || c.Metrics.MaxULP != 1 || c.Mode != "bitwise" {
		t.Errorf("verdict %s over %d ulp %v mode %s; want fail, 1, 1, bitwise", c.Verdict, c.Metrics.OverTol, c.Metrics.MaxULP, c.Mode)
	}
	// The error of a bitwise output is measured against Expected.
	if c.Metrics.MaxAbs != 0.25 {
		t.Errorf("max_abs %v, want .25 (against expected, not exact)", c.Metrics.MaxAbs)
	}
	o.Equivalent = func(i int, a float64) bool { return i == 1 && a == 2.25 }
	c, _ = Compare(o, act, ThreeWay{}, Options{})
	if c.Verdict != Pass || c.Metrics.Excused != 1 {
		t.Errorf("with the equivalence rule: verdict %s excused %d; want pass, 1", c.Verdict, c.Metrics.Excused)
	}
}

func TestCompareErrors(t *testing.T) {
	o := kernel.Output{Name: "out", Shape: []int{2, 3}, Exact: make(kernel.Dense, 6), Expected: make(kernel.Dense, 6)}
	tests := []struct {
		name   string
		o      kernel.Output
		actual *tensor.Tensor
		want   string
	}{
		{"missing", o, nil, "output out is missing"},
		{"shape", o, tensor.New(tensor.BF16, 3, 2), "output out has shape [3 2]; the reference has [2 3]"},
		{"truncated", o, &tensor.Tensor{DType: tensor.BF16, Shape: []int{2, 3}, Data: make([]byte, 5)}, "needs 12 bytes, has 5"},
		{"unknown dtype", o, &tensor.Tensor{DType: "Q4", Shape: []int{2, 3}}, "unknown dtype"},
		{"reference lengths", kernel.Output{Name: "out", Exact: make(kernel.Dense, 6), Expected: make(kernel.Dense, 5)}, tensor.New(tensor.BF16, 2, 3), "6 exact and 5 expected"},
		{"element count", kernel.Output{Name: "out", Exact: make(kernel.Dense, 5), Expected: make(kernel.Dense, 5)}, tensor.New(tensor.BF16, 2, 3), "has 6 elements; the reference has 5"},
		{"no exact values", kernel.Output{Name: "out", Expected: make(kernel.Dense, 6)}, tensor.New(tensor.BF16, 2, 3), "output out: the reference lacks its exact or its expected values"},
	}
	for _, tc := range tests {
		_, err := Compare(tc.o, tc.actual, nil, Options{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

func TestCombine(t *testing.T) {
	tests := []struct {
		in   []Verdict
		want Verdict
	}{
		{nil, Inconclusive},
		{[]Verdict{Pass, Pass}, Pass},
		{[]Verdict{Pass, Inconclusive}, Inconclusive},
		{[]Verdict{Inconclusive, Fail, Pass}, Fail},
		{[]Verdict{Fail, Error}, Error},
		{[]Verdict{Pass, "maybe"}, Error},
	}
	for _, tc := range tests {
		if got := Combine(tc.in...); got != tc.want {
			t.Errorf("Combine(%v) = %s, want %s", tc.in, got, tc.want)
		}
	}
	if got := FileVerdict([]Check{{Verdict: Pass}, {Verdict: Fail}}); got != Fail {
		t.Errorf("FileVerdict = %s, want fail", got)
	}
}

func TestJSON(t *testing.T) {
	for _, tc := range []struct {
		f    Float
		want string
	}{{Float(math.NaN()), `"NaN"`}, {Float(math.Inf(1)), `"+Inf"`}, {Float(math.Inf(-1)), `"-Inf"`}, {0.1, `0.1`}, {1e-300, `1e-300`}} {
		b, err := json.Marshal(tc.f)
		if err != nil || string(b) != tc.want {
			t.Errorf("Marshal(%v) = %s, %v; want %s", float64(tc.f), b, err, tc.want)
		}
		var back Float
		if err := json.Unmarshal(b, &back); err != nil {
			t.Errorf("Unmarshal(%s): %v", b, err)
		}
		if !(back == tc.f || (math.IsNaN(float64(back)) && math.IsNaN(float64(tc.f)))) {
			t.Errorf("round trip of %s gave %v", b, float64(back))
		}
	}
	var f Float
	if err := json.Unmarshal([]byte(`"fast"`), &f); err == nil {
		t.Errorf("Unmarshal accepted \"fast\"")
	}

	// A whole check with non-finite metrics and a signature encodes, and
	// carries the fields `kcheck check --json` promises.
	o := kernel.Output{Name: "out", Shape: []int{2}, Exact: kernel.Dense([]float64{1, 2}), Expected: kernel.Dense([]float64{1, 2})}
	c, err := Compare(o, tensor.FromFloat64s(tensor.F32, []int{2}, []float64{1, math.NaN()}), nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatalf("Marshal(Check): %v", err)
	}
	var back map[string]any
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"tensor", "dtype", "shape", "verdict", "metrics", "worst", "tolerance", "signature"} {
		if _, ok := back[k]; !ok {
			t.Errorf("JSON of a failing check lacks %q: %s", k, b)
		}
	}
	if back["verdict"] != "fail" {
		t.Errorf("verdict %v, want fail", back["verdict"])
	}
}

// TestUnitRoundoffBound checks the provisional policy against its formula
// worked out by hand.
func TestUnitRoundoffBound(t *testing.T) {
	o := kernel.Output{Name: "y", Shape: []int{4}, Exact: kernel.Dense([]float64{1, -2, 0, 4}), Expected: kernel.Dense([]float64{1, -2, 0, 4}), Reduction: 16}
	b := UnitRoundoff{}.Bounds(t.Context(), o, tensor.BF16)
	// rms(exact) = sqrt((1+4+0+16)/4) = sqrt(5.25); γ_16 = 16u/(1-16u), u = 2^-24; u_bf16 = 2^-8.
	g := 16 * 0x1p-24 / (1 - 16*0x1p-24)
	rms := math.Sqrt(5.25)
	want := []float64{0x1p-8*1 + g*rms, 0x1p-8*2 + g*rms, g * rms, 0x1p-8*4 + g*4}
	for i, w := range want {
		x := o.Exact.At(i)
		if got := b.Tol(i, x, o.Expected.At(i)); !near(got, w, 1e-15) {
			t.Errorf("tol[%d] = %g, want %g", i, got, w)
		}
	}
	if gammaN(1<<24, 0x1p-24) != math.Inf(1) {
		t.Errorf("γ_n with nu >= 1 is not +Inf")
	}
}

// TestThreeWayExactOutput: when Expected equals Exact (no rounding declared
// inside the computation) the bound falls back to one ulp plus the
// accumulation term, so a correctly rounded output passes and one a few
// ulps off does not.
func TestThreeWayExactOutput(t *testing.T) {
	n := 64
	exact := make([]float64, n)
	for i := range exact {
		exact[i] = 1 + float64(i)/float64(n) + 1e-4 // not representable in bf16
	}
	o := kernel.Output{Name: "y", Shape: []int{8, 8}, Exact: kernel.Dense(exact), Expected: kernel.Dense(roundTo(tensor.BF16, exact)), Reduction: 1}
	c, err := Compare(o, tensor.FromFloat64s(tensor.BF16, []int{8, 8}, exact), ThreeWay{}, Options{})
	if err != nil || c.Verdict != Pass {
		t.Fatalf("correctly rounded: %s (%s) %v", c.Verdict, c.Reason, err)
	}
	off := make([]float64, n)
	for i, x := range kernel.Float64s(o.Expected) {
		off[i] = x + 4*Spacing(tensor.BF16, x)
	}
	c, _ = Compare(o, tensor.FromFloat64s(tensor.BF16, []int{8, 8}, off), ThreeWay{}, Options{})
	if c.Verdict != Fail {
		t.Errorf("4 ulps off: verdict %s (%s), want fail", c.Verdict, c.Reason)
	}
}

// onDemand is Values computed per read with state of its own (the last
// index read), like the cache kernels' outputs: it must be forked, never
// shared, across goroutines, which the race detector would catch.
type onDemand struct {
	v    []float64
	last int
}

func (o *onDemand) Len() int            { return len(o.v) }
func (o *onDemand) At(i int) float64    { o.last = i; return o.v[i] }
func (o *onDemand) Fork() kernel.Values { return &onDemand{v: o.v} }

// TestCompareSameWhateverGOMAXPROCS: an output of several parallel chunks,
// with errors, NaN and Inf positions and elements an equivalence rule (one
// that keeps state, so it must run on one goroutine) excuses, is judged to
// the same check, bit for bit, at GOMAXPROCS 1 (one goroutine) and 2 and 7
// (the elements shared out), for dense and for on-demand values.
func TestCompareSameWhateverGOMAXPROCS(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 40))
	n := 5*parallelChunk + 123
	exact, expected := make([]float64, n), make([]float64, n)
	actual := tensor.New(tensor.F32, n/3, 3)
	n = actual.Len()
	exact, expected = exact[:n], expected[:n]
	for i := range exact {
		exact[i] = rng.NormFloat64()
		expected[i] = float64(float32(exact[i]))
		a := expected[i]
		switch rng.IntN(500) {
		case 0:
			a += 1e-3 // over tolerance
		case 1:
			a = math.NaN()
		case 2:
			a, expected[i] = math.Inf(1), math.Inf(1)
		case 3:
			a *= 1 + 1e-6
		}
		actual.SetFloat64(i, a)
	}
	calls := 0
	equivalent := func(i int, a float64) bool { calls++; return i%3 == 0 }
	for _, dense := range []bool{true, false} {
		var ref []byte
		for _, procs := range []int{1, 2, 7} {
			o := kernel.Output{Name: "y", Shape: []int{n / 3, 3}, Reduction: 64, Equivalent: equivalent,
				Exact: kernel.Dense(exact), Expected: kernel.Dense(expected)}
			if !dense {
				o.Exact, o.Expected = &onDemand{v: exact}, &onDemand{v: expected}
			}
			prev := runtime.GOMAXPROCS(procs)
			c, err := Compare(o, actual, nil, Options{WorstK: 9})
			runtime.GOMAXPROCS(prev)
			if err != nil {
				t.Fatal(err)
			}
			got, err := json.Marshal(c)
			if err != nil {
				t.Fatal(err)
			}
			if c.Metrics.NaNMismatch == 0 || c.Metrics.Excused == 0 || c.Metrics.OverTol == 0 {
				t.Fatalf("the case lacks NaN mismatches (%d), excused (%d) or over-tolerance (%d) elements", c.Metrics.NaNMismatch, c.Metrics.Excused, c.Metrics.OverTol)
			}
			if ref == nil {
				ref = got
				continue
			}
			if !bytes.Equal(got, ref) {
				t.Fatalf("dense=%v GOMAXPROCS %d: the check differs from GOMAXPROCS 1's:\n%s\n%s", dense, procs, got, ref)
			}
		}
	}
	if calls == 0 {
		t.Fatal("the equivalence rule was never asked")
	}
}

// TestFastPathMatchesElementPath: an output where most elements are the
// same bits on all three sides (the bulk the fast path accounts for) and
// the rest are near misses of it (one ulp off in the actual, an exact value
// one ulp from the expected under an actual that equals the expected, -0
// against +0, subnormals, elements an equivalence rule excuses, far misses
// and, in one variant, a NaN and an infinity, which make the sums NaN), in
// numeric and bitwise mode, from dense and on-demand values, gives the same
// check, bit for bit, as the element path, at GOMAXPROCS 1, 2 and 8.
func TestFastPathMatchesElementPath(t *testing.T) {
	for _, specials := range []bool{false, true} {
		rng := rand.New(rand.NewPCG(17, 2))
		n := 4*parallelChunk + 77
		exact, expected := make([]float64, n), make([]float64, n)
		actual := tensor.New(tensor.F32, n)
		bulk := 0
		for i := range exact {
			v := float64(float32(rng.NormFloat64()))
			exact[i], expected[i] = v, v
			a := v
			switch rng.IntN(40) {
			case 0:
				a = float64(math.Nextafter32(float32(v), 10)) // one ulp off
			case 1:
				exact[i] = math.Nextafter(v, 10) // the floor, under an actual that equals the expected
			case 2:
				exact[i], expected[i], a = 0, 0, math.Copysign(0, -1) // -0 against +0
			case 3:
				v = float64(float32(1e-40)) // subnormal in float32, the same bits everywhere
				exact[i], expected[i], a = v, v, v
				bulk++
			case 4:
				if specials {
					a = math.NaN()
				}
			case 5:
				if specials {
					exact[i], expected[i], a = math.Inf(-1), math.Inf(-1), math.Inf(-1)
				}
			case 6:
				a += 1e-2 // far over tolerance
			default:
				bulk++
			}
			actual.SetFloat64(i, a)
		}
		if bulk < n/2 {
			t.Fatalf("only %d of %d elements are the same bits", bulk, n)
		}
		equivalent := func(i int, a float64) bool { return i%5 == 0 }
		for _, mode := range []kernel.Mode{kernel.Numeric, kernel.Bitwise} {
			for _, dense := range []bool{true, false} {
				o := kernel.Output{Name: "y", Shape: []int{n}, Reduction: 64, Mode: mode, Equivalent: equivalent,
					Exact: kernel.Dense(exact), Expected: kernel.Dense(expected)}
				if !dense {
					o.Exact, o.Expected = &onDemand{v: exact}, &onDemand{v: expected}
				}
				var want []byte
				for _, elementPath := range []bool{true, false} {
					for _, procs := range []int{1, 2, 8} {
						prev := runtime.GOMAXPROCS(procs)
						c, err := Compare(o, actual, nil, Options{WorstK: 7, Profile: true, ElementPath: elementPath})
						runtime.GOMAXPROCS(prev)
						if err != nil {
							t.Fatal(err)
						}
						got, err := json.Marshal(c)
						if err != nil {
							t.Fatal(err)
						}
						prof, _ := json.Marshal(c.Profile)
						got = append(got, prof...)
						if want == nil {
							want = got
							m := c.Metrics
							if m.OverTol == 0 || c.Signature == nil || specials != (m.NaNMismatch > 0) || !specials && !(finite(float64(m.CosDiff)) && m.CosDiff > 0 && finite(float64(m.RMSE))) {
								t.Fatalf("specials %v, mode %v: the case lacks failing elements, a signature, or finite sums: %s", specials, mode, got)
							}
							continue
						}
						if !bytes.Equal(got, want) {
							t.Errorf("specials %v, mode %v, dense %v, element path %v, GOMAXPROCS %d: the check differs from the element path's at GOMAXPROCS 1:\n%s\n%s", specials, mode, dense, elementPath, procs, got, want)
						}
					}
				}
			}
		}
	}
}

// TestOverflow: an infinity the output dtype made of a finite exact answer
// is an overflow, a fault even where a correct kernel's answer (the
// expected one) is that infinity; an infinity the exact answer holds too
// was given to the kernel, which carries it faithfully. F16's threshold is
// 65520, the midpoint of 65504 and 2^16 (nearest even gives inf from there);
// BF16's is (2 - 2^-8)·2^127 ≈ 3.3961e38.
func TestOverflow(t *testing.T) {
	inf := math.Inf(1)
	tests := []struct {
		name                  string
		dtype                 tensor.DType
		exact, expected, act  float64
		overflow, infMismatch int
		verdict               Verdict
		pattern               string
	}{
		{"the answer overflows F16", tensor.F16, 70000, inf, inf, 1, 0, Fail, signature.Overflow},
		{"at the threshold", tensor.F16, -65520, -inf, -inf, 1, 0, Fail, signature.Overflow},
		{"the kernel's value crossed it", tensor.F16, 65500, 65504, inf, 1, 0, Fail, signature.Overflow},
		{"a saturating kernel", tensor.F16, 70000, inf, 65504, 1, 0, Fail, signature.Overflow},
		{"an inf it was given", tensor.F16, inf, inf, inf, 0, 0, Pass, ""},
		{"a stray inf", tensor.F16, 1, 1, inf, 0, 1, Fail, signature.NonFinite},
		{"an inf of the other sign", tensor.F16, 70000, inf, -inf, 0, 1, Fail, signature.NonFinite},
		{"the answer overflows BF16", tensor.BF16, 3.4e38, inf, inf, 1, 0, Fail, signature.Overflow},
		{"within F32", tensor.F32, 70000, 70000, 70000, 0, 0, Pass, ""},
	}
	for _, tc := range tests {
		o := kernel.Output{Name: "out", Shape: []int{4}, DType: tc.dtype,
			Exact:    kernel.Dense([]float64{1, 2, tc.exact, 3}),
			Expected: kernel.Dense([]float64{1, 2, tc.expected, 3})}
		act := tensor.FromFloat64s(tc.dtype, []int{4}, []float64{1, 2, tc.act, 3})
		c, err := Compare(o, act, constPolicy{tol: 1e-3, band: 2}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		m := c.Metrics
		if m.Overflow != tc.overflow || m.InfMismatch != tc.infMismatch || c.Verdict != tc.verdict {
			t.Errorf("%s: overflow %d inf mismatch %d verdict %s (%s); want %d %d %s", tc.name, m.Overflow, m.InfMismatch, c.Verdict, c.Reason, tc.overflow, tc.infMismatch, tc.verdict)
			continue
		}
		if tc.overflow > 0 {
			if !strings.HasPrefix(c.Reason, "overflow: 1 of 4 elements are an infinity in "+string(tc.dtype)) || m.FirstOverflow == nil || m.FirstOverflow.Flat != 2 {
				t.Errorf("%s: reason %q, first %+v; want the overflow named at element 2", tc.name, c.Reason, m.FirstOverflow)
			}
		}
		if got := ""; c.Signature != nil {
			got = c.Signature.Pattern
			if got != tc.pattern {
				t.Errorf("%s: signature %q (%s), want %q", tc.name, got, c.Signature.Detail, tc.pattern)
			}
		} else if tc.pattern != "" {
			t.Errorf("%s: no signature, want %q", tc.name, tc.pattern)
		}
	}
}

// TestSignatureFromThePass: the signature read from the comparison's own
// record of the failing elements and of the largest finite excess
// (signature.Judged) is the one the element path gets by reading every
// element again, where the cap on an infinite excess matters: rows of a
// page that fail, two elements NaN where a number was expected, one a
// bitwise-like zero-tolerance miss.
func TestSignatureFromThePass(t *testing.T) {
	const R, C = 96, 40
	exact := make([]float64, R*C)
	actual := tensor.New(tensor.F32, R, C)
	r := rand.New(rand.NewPCG(3, 4))
	for i := range exact {
		exact[i] = r.NormFloat64()
		v := exact[i]
		if row := i / C; row%16 == 0 {
			v += 0.5 * (1 + r.Float64()) // page offset 0 of every page of 16 rows
		}
		actual.SetFloat64(i, v)
	}
	actual.SetFloat64(17*C+3, math.NaN())
	actual.SetFloat64(48*C+7, math.NaN())
	o := kernel.Output{Name: "gathered", Shape: []int{R, C}, DType: tensor.F32, Exact: kernel.Dense(exact), Expected: kernel.Dense(exact), Reduction: 1,
		Coords: kernel.Coords{Axes: []kernel.CoordKind{kernel.KindRow, "dim"}, Derived: func(dst []kernel.Coord, idx []int) []kernel.Coord {
			return append(dst, kernel.Coord{Kind: kernel.KindPageOffset, Value: idx[0] % 16})
		}}}
	for _, profile := range []bool{false, true} {
		want, got := onBothPaths(t, o, actual, Options{Profile: profile})
		if want.Signature == nil || want.Signature.Pattern == "" {
			t.Fatalf("no signature on the element path: %+v", want)
		}
		if diff := cmp.Diff(want.Signature, got.Signature); diff != "" {
			t.Errorf("profile %v: signature from the pass differs (-element path +pass):\n%s", profile, diff)
		}
		if profile {
			if diff := cmp.Diff(want.Profile.Coords(), got.Profile.Coords(), cmpopts.EquateNaNs()); diff != "" {
				t.Errorf("profile from the pass differs (-element path +pass):\n%s", diff)
			}
		}
	}
}

// onBothPaths is Compare of actual on the element path and on the fast
// path, opts otherwise alike: what the fast path's tests hold to each other.
func onBothPaths(t *testing.T, o kernel.Output, actual *tensor.Tensor, opts Options) (element, fast Check) {
	t.Helper()
	opts.ElementPath = true
	element, err := Compare(o, actual, nil, opts)
	if err != nil {
		t.Fatal(err)
	}
	opts.ElementPath = false
	fast, err = Compare(o, actual, nil, opts)
	if err != nil {
		t.Fatal(err)
	}
	return element, fast
}
