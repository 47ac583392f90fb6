package splitk

import (
	"context"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/tensor"
)

type handFile struct {
	Cases []struct {
		Name, Base, Empty string
		L                 int
		LSE               []string
		O                 [][]string
		Out               []string
		OutLSE            string `json:"out_lse"`
		Why               string
	}
	Errors []struct {
		Name string
		LSE  []string
		Want string
	}
}

func parse(t *testing.T, s string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatalf("testdata value %q: %v", s, err)
	}
	return v
}

func parseAll(t *testing.T, ss []string) []float64 {
	out := make([]float64, len(ss))
	for i, s := range ss {
		out[i] = parse(t, s)
	}
	return out
}

func loadHand(t *testing.T) handFile {
	b, err := os.ReadFile("testdata/hand.json")
	if err != nil {
		t.Fatal(err)
	}
	var f handFile
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	return f
}

// close reports whether got is within rel (relative to max(|want|, 1)) of
// want, with infinities required to match exactly.
func close(got, want, rel float64) bool {
	if math.IsInf(want, 0) || math.IsNaN(want) {
		return got == want || (math.IsNaN(got) && math.IsNaN(want))
	}
	return math.Abs(got-want) <= rel*math.Max(math.Abs(want), 1)
}

func TestCombineHandCases(t *testing.T) {
	f := loadHand(t)
	for _, tc := range f.Cases {
		t.Run(tc.Name, func(t *testing.T) {
			base, err := ParseBase(tc.Base)
			if err != nil {
				t.Fatal(err)
			}
			empty, err := ParseEmpty(tc.Empty)
			if err != nil {
				t.Fatal(err)
			}
			c := Convention{Base: base, Empty: empty}
			var o []float64
			for _, row := range tc.O {
				o = append(o, parseAll(t, row)...)
			}
			lse := parseAll(t, tc.LSE)
			wantOut, wantLSE := parseAll(t, tc.Out), parse(t, tc.OutLSE)
			ex, exp, err := Combine(context.Background(), o, lse, 1, len(lse), tc.L, c, tensor.F32, tensor.F32)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range []struct {
				name string
				res  Result
				rel  float64
			}{{"exact", ex, 1e-15}, {"expected", exp, 4e-7}} {
				for i, w := range wantOut {
					if !close(r.res.Out[i], w, r.rel) {
						t.Errorf("%s out[%d] = %v, want %v (%s)", r.name, i, r.res.Out[i], w, tc.Why)
					}
				}
				if !close(r.res.LSE[0], wantLSE, r.rel) {
					t.Errorf("%s lse = %v, want %v (%s)", r.name, r.res.LSE[0], wantLSE, tc.Why)
				}
			}
		})
	}
	for _, tc := range f.Errors {
		t.Run(tc.Name, func(t *testing.T) {
			lse := parseAll(t, tc.LSE)
			_, _, err := Combine(context.Background(), make([]float64, len(lse)), lse, 1, len(lse), 1, DefaultConvention(), tensor.F32, tensor.F32)
			if err == nil || !strings.Contains(err.Error(), tc.Want) {
				t.Fatalf("error %v, want one containing %q", err, tc.Want)
			}
		})
	}
}

// softmaxRange is the independent formulation: the softmax of scores over
// tokens [lo, hi) applied to values, written out directly (two passes, max
// shift), with its natural-log lse. An empty range gives 0 and -inf.
func softmaxRange(scores []float64, vals [][]float64, lo, hi, l int) ([]float64, float64) {
	out := make([]float64, l)
	if lo >= hi {
		return out, math.Inf(-1)
	}
	m := math.Inf(-1)
	for j := lo; j < hi; j++ {
		m = math.Max(m, scores[j])
	}
	den := 0.0
	for j := lo; j < hi; j++ {
		e := math.Exp(scores[j] - m)
		den += e
		for i := range out {
			out[i] += e * vals[j][i]
		}
	}
	for i := range out {
		out[i] /= den
	}
	return out, m + math.Log(den)
}

// TestCombineMatchesUnsplitSoftmax splits a softmax into contiguous ranges
// (some empty, more splits than tokens in some rows), computes each split's
// partial directly, and checks that combining them gives the unsplit softmax
// to 1e-13 relative, in both lse bases.
func TestCombineMatchesUnsplitSoftmax(t *testing.T) {
	const seed = 20240607
	rng := rand.New(rand.NewPCG(seed, 1))
	for trial := 0; trial < 40; trial++ {
		n := rng.IntN(40) // tokens, 0 included
		s := 1 + rng.IntN(8)
		if trial%5 == 0 {
			s = n + 1 + rng.IntN(3) // S > tokens
		}
		l := 1 + rng.IntN(5)
		scores := make([]float64, n)
		vals := make([][]float64, n)
		for j := range scores {
			scores[j] = 20 * (rng.Float64() - 0.5)
			vals[j] = make([]float64, l)
			for i := range vals[j] {
				vals[j][i] = rng.NormFloat64()
			}
		}
		// random monotone bounds 0 = b0 <= ... <= bS = n
		bounds := make([]int, s+1)
		for k := 1; k < s; k++ {
			bounds[k] = rng.IntN(n + 1)
		}
		bounds[s] = n
		sortInts(bounds)
		want, wantLSE := softmaxRange(scores, vals, 0, n, l)
		for _, base := range []Base{BaseE, Base2} {
			var po, plse []float64
			for k := 0; k < s; k++ {
				o, lse := softmaxRange(scores, vals, bounds[k], bounds[k+1], l)
				if base == Base2 {
					lse *= math.Log2E
				}
				po = append(po, o...)
				plse = append(plse, lse)
			}
			ex, _, err := Combine(context.Background(), po, plse, 1, s, l, Convention{Base: base, Empty: math.Inf(-1)}, tensor.F32, tensor.F32)
			if err != nil {
				t.Fatal(err)
			}
			wl := wantLSE
			if base == Base2 {
				wl *= math.Log2E
			}
			scale := 0.0
			for _, v := range want {
				scale = math.Max(scale, math.Abs(v))
			}
			for i := range want {
				if math.Abs(ex.Out[i]-want[i]) > 1e-13*math.Max(scale, 1e-300) {
					t.Fatalf("seed %d trial %d base %v bounds %v: out[%d] = %v, unsplit %v", seed, trial, base, bounds, i, ex.Out[i], want[i])
				}
			}
			if !close(ex.LSE[0], wl, 1e-13) {
				t.Fatalf("seed %d trial %d base %v: lse %v, unsplit %v", seed, trial, base, ex.LSE[0], wl)
			}
		}
	}
}

func sortInts(a []int) {
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && a[j] < a[j-1]; j-- {
			a[j], a[j-1] = a[j-1], a[j]
		}
	}
}

// TestExpectedNearExact: the fp32 combine differs from the float64 one by a
// few fp32 ulps (its error is a handful of roundings of relative size 2^-24
// times the exp2 argument's magnitude), and a BF16 output adds its own
// half-ulp rounding; and no NaN appears for finite input.
func TestExpectedNearExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	const n, s, l = 200, 6, 16
	po := make([]float64, n*s*l)
	plse := make([]float64, n*s)
	for i := range po {
		po[i] = float64(float32(rng.NormFloat64()))
	}
	for i := range plse {
		switch rng.IntN(6) {
		case 0:
			plse[i] = math.Inf(-1)
		default:
			plse[i] = float64(float32(30 * (rng.Float64() - 0.5)))
		}
	}
	for _, d := range []struct {
		dt  tensor.DType
		rel float64
	}{{tensor.F32, 64 * 0x1p-24}, {tensor.BF16, 0x1p-8 + 64*0x1p-24}} {
		ex, exp, err := Combine(context.Background(), po, plse, n, s, l, DefaultConvention(), d.dt, tensor.F32)
		if err != nil {
			t.Fatal(err)
		}
		worst := 0.0
		for i := range ex.Out {
			if math.IsNaN(exp.Out[i]) || math.IsNaN(ex.Out[i]) {
				t.Fatalf("NaN at %d for finite input", i)
			}
			// |out| <= max |o_s| <= ~5: bound the error absolutely by rel·max|o|.
			row := i / l
			mo := 0.0
			for k := 0; k < s; k++ {
				if !math.IsInf(plse[row*s+k], -1) {
					mo = math.Max(mo, math.Abs(po[(row*s+k)*l+i%l]))
				}
			}
			e := math.Abs(exp.Out[i] - ex.Out[i])
			if e > d.rel*math.Max(mo, math.Abs(ex.Out[i])) {
				t.Errorf("%s out[%d]: expected %v exact %v (|o| <= %v)", d.dt, i, exp.Out[i], ex.Out[i], mo)
			}
			worst = math.Max(worst, e)
		}
		for r := range ex.LSE {
			if !close(exp.LSE[r], ex.LSE[r], 16*0x1p-24) {
				t.Errorf("lse[%d]: expected %v exact %v", r, exp.LSE[r], ex.LSE[r])
			}
		}
		t.Logf("%s output: max |expected - exact| = %.3g", d.dt, worst)
	}
}

func TestSplitOrderDoesNotMatter(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 9))
	const s, l = 5, 4
	o := make([]float64, s*l)
	lse := make([]float64, s)
	for i := range o {
		o[i] = rng.NormFloat64()
	}
	for i := range lse {
		lse[i] = 10 * rng.NormFloat64()
	}
	lse[2] = math.Inf(-1)
	out1 := make([]float64, l)
	g1, err := CombineRowExact(o, lse, l, DefaultConvention(), out1)
	if err != nil {
		t.Fatal(err)
	}
	perm := []int{4, 2, 0, 3, 1}
	o2 := make([]float64, s*l)
	lse2 := make([]float64, s)
	for k, p := range perm {
		copy(o2[k*l:(k+1)*l], o[p*l:(p+1)*l])
		lse2[k] = lse[p]
	}
	out2 := make([]float64, l)
	g2, _ := CombineRowExact(o2, lse2, l, DefaultConvention(), out2)
	for i := range out1 {
		if !close(out1[i], out2[i], 1e-14) {
			t.Errorf("out[%d]: %v vs %v after permuting splits", i, out1[i], out2[i])
		}
	}
	if !close(g1, g2, 1e-14) {
		t.Errorf("lse %v vs %v after permuting splits", g1, g2)
	}
}

func TestParseConventions(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Base
		ok   bool
	}{{"", BaseE, true}, {"e", BaseE, true}, {"2", Base2, true}, {"10", 0, false}, {"E", 0, false}} {
		b, err := ParseBase(tc.in)
		if (err == nil) != tc.ok || (tc.ok && b != tc.want) {
			t.Errorf("ParseBase(%q) = %v, %v", tc.in, b, err)
		}
	}
	for _, tc := range []struct {
		in   string
		want float64
		ok   bool
	}{{"", math.Inf(-1), true}, {"-inf", math.Inf(-1), true}, {"+inf", math.Inf(1), true}, {"0", 0, false}} {
		v, err := ParseEmpty(tc.in)
		if (err == nil) != tc.ok || (tc.ok && v != tc.want) {
			t.Errorf("ParseEmpty(%q) = %v, %v", tc.in, v, err)
		}
	}
}

// TestExp2F32: the polynomial shortcut gives float32(math.Exp2(x)) for
// every fp32 argument in [-150, 128] with the low 6 significand bits
// cleared (about 2^26 arguments, every binade, both signs), and for the
// values past the ends, NaN and the infinities.
func TestExp2F32(t *testing.T) {
	want := func(x float32) float32 { return float32(math.Exp2(float64(x))) }
	check := func(x float32) {
		if got, w := Exp2F32(x), want(x); math.Float32bits(got) != math.Float32bits(w) && !(got != got && w != w) {
			t.Fatalf("Exp2F32(%v) = %v (%#08x), want %v (%#08x)", x, got, math.Float32bits(got), w, math.Float32bits(w))
		}
	}
	n := 0
	for b := uint32(0); b < 1<<31; b += 1 << 6 {
		for _, sign := range []uint32{0, 1 << 31} {
			x := math.Float32frombits(b | sign)
			if x >= -150 && x <= 128 {
				check(x)
				n++
			}
		}
	}
	for _, x := range []float32{-149, -149.5, -150, 127, 127.99, 128, 200, -200, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN())} {
		check(x)
	}
	if n < 1<<25 {
		t.Fatalf("checked only %d arguments", n)
	}
}
