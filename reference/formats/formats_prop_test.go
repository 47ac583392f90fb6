package formats_test

// Property tests (pgregory.net/rapid). The oracle is a brute-force search over
// every code of the format, which shares nothing with the package's
// arithmetic: the nearest value is the one no other code beats, and on equal
// distance the one with the even mantissa (= the even code).

import (
	"math"
	"math/big"
	"testing"

	"pgregory.net/rapid"

	"github.com/kcheck-dev/kcheck/reference/formats"
)

// nearest is the brute-force oracle. It returns the value Encode must store
// and whether the result is an overflow (NaN for E4M3FN, ±inf for E5M2 under
// NoSaturate). Overflow follows IEEE 754: round as if the exponent range were
// unbounded; the value above the largest one is max+spacing, whose mantissa
// parity is that of the code after max.
func nearest(f *formats.Minifloat, x float64, mode formats.Overflow) (v float64, overflow bool) {
	type cand struct {
		v        float64
		even     bool
		overflow bool
	}
	ladder := positiveLadder(f)
	cands := make([]cand, 0, 2*len(ladder)+2)
	for _, r := range ladder {
		cands = append(cands, cand{r.v, r.code&1 == 0, false}, cand{-r.v, r.code&1 == 0, false})
	}
	if mode == formats.NoSaturate && !f.NoNaN {
		top := ladder[len(ladder)-1]
		next := 2*top.v - ladder[len(ladder)-2].v
		cands = append(cands, cand{next, top.code&1 != 0, true}, cand{-next, top.code&1 != 0, true})
	}
	// Distances are exact rationals: in float64, |x - v| rounds and two
	// distinct codes far below a huge x would look equally near.
	dist := func(v float64) *big.Rat {
		d := new(big.Rat).SetFloat64(x)
		d.Sub(d, new(big.Rat).SetFloat64(v))
		return d.Abs(d)
	}
	best := cands[0]
	bestD := dist(best.v)
	for _, c := range cands[1:] {
		d := dist(c.v)
		switch cmp := d.Cmp(bestD); {
		case cmp < 0:
			best, bestD = c, d
		case cmp == 0 && c.v != best.v && c.even:
			best = c
		}
	}
	if best.v == 0 {
		best.v = math.Copysign(0, x) // the sign of zero follows x
	}
	return best.v, best.overflow
}

// genX draws float64 inputs that exercise f: log-uniform over its range and
// beyond, near a midpoint of two neighbouring values (a few float64 ulps
// either side, or exactly on it), near a code, or any finite float64.
func genX(f *formats.Minifloat) *rapid.Generator[float64] {
	ladder := positiveLadder(f)
	lo := math.Ilogb(f.SmallestSubnormal()) - 3
	hi := math.Ilogb(f.MaxFinite()) + 3
	nudge := func(x float64, k int) float64 {
		for ; k > 0; k-- {
			x = math.Nextafter(x, math.Inf(1))
		}
		for ; k < 0; k++ {
			x = math.Nextafter(x, math.Inf(-1))
		}
		return x
	}
	return rapid.Custom(func(t *rapid.T) float64 {
		var x float64
		switch rapid.IntRange(0, 3).Draw(t, "kind") {
		case 0:
			m := rapid.Float64Range(1, 2).Draw(t, "mant")
			x = math.Ldexp(m, rapid.IntRange(lo, hi).Draw(t, "exp"))
		case 1:
			i := rapid.IntRange(0, len(ladder)-1).Draw(t, "i")
			var mid float64
			if i+1 < len(ladder) {
				mid = (ladder[i].v + ladder[i+1].v) / 2
			} else { // the overflow midpoint
				mid = ladder[i].v + (ladder[i].v-ladder[i-1].v)/2
			}
			x = nudge(mid, rapid.IntRange(-3, 3).Draw(t, "ulps"))
		case 2:
			i := rapid.IntRange(0, len(ladder)-1).Draw(t, "i")
			x = nudge(ladder[i].v, rapid.IntRange(-2, 2).Draw(t, "ulps"))
		default:
			x = rapid.Float64().Draw(t, "any")
		}
		if rapid.Bool().Draw(t, "neg") {
			x = -x
		}
		return x
	})
}

var modes = []formats.Overflow{formats.Saturate, formats.NoSaturate}

// TestPropEncodeIsNearest: Decode(Encode(x)) is the brute-force nearest value
// (ties to even, overflow as the mode says), for E2M1, E4M3FN and E5M2 in both
// modes, and Accuracy says on which side of x it lies.
func TestPropEncodeIsNearest(t *testing.T) {
	for _, f := range minifloats {
		for _, mode := range modes {
			t.Run(f.Name+"/"+modeName(mode), func(t *testing.T) {
				rapid.Check(t, func(t *rapid.T) {
					x := genX(f).Draw(t, "x")
					code, acc := f.Encode(x, mode)
					if int(code) >= 1<<f.Bits() {
						t.Fatalf("Encode(%x) = %#x does not fit in %d bits", x, code, f.Bits())
					}
					got := f.Decode(code)
					want, overflow := nearest(f, x, mode)
					switch {
					case overflow && f.HasInf:
						if !math.IsInf(got, int(math.Copysign(1, x))) {
							t.Fatalf("Encode(%x) = %#02x (%v), want an infinity of the same sign", x, code, got)
						}
					case overflow:
						if !f.IsNaN(code) {
							t.Fatalf("Encode(%x) = %#02x (%v), want NaN", x, code, got)
						}
					default:
						if !same(got, want) {
							t.Fatalf("Encode(%x) = %#02x (%v), the nearest value is %v", x, code, got, want)
						}
					}
					if math.IsNaN(got) {
						return // Accuracy of a NaN result carries no order
					}
					var wantAcc formats.Accuracy
					switch {
					case got < x:
						wantAcc = formats.Below
					case got > x:
						wantAcc = formats.Above
					}
					if acc != wantAcc {
						t.Fatalf("Encode(%x) stored %v with Accuracy %v, want %v", x, got, acc, wantAcc)
					}
					// Round agrees with Encode.
					if r, racc := f.Round(x, mode); !same(r, got) || racc != acc {
						t.Fatalf("Round(%x) = %v, %v; Encode gives %v, %v", x, r, racc, got, acc)
					}
				})
			})
		}
	}
}

// midpoints lists every rounding midpoint of f's positive values, the
// overflow midpoint above the largest value included.
func midpoints(f *formats.Minifloat) []float64 {
	ladder := positiveLadder(f)
	var out []float64
	for i := 0; i+1 < len(ladder); i++ {
		out = append(out, (ladder[i].v+ladder[i+1].v)/2)
	}
	n := len(ladder)
	return append(out, ladder[n-1].v+(ladder[n-1].v-ladder[n-2].v)/2)
}

// TestMidpointDistanceSweep: 0.5 on every nonzero value, 0 on every midpoint.
func TestMidpointDistanceSweep(t *testing.T) {
	for _, f := range minifloats {
		for _, r := range positiveLadder(f) {
			for _, x := range []float64{r.v, -r.v} {
				if got := f.MidpointDistance(x); got != 0.5 {
					t.Errorf("%s.MidpointDistance(%v) = %v, want 0.5 (a code)", f.Name, x, got)
				}
			}
		}
		for _, m := range midpoints(f) {
			for _, x := range []float64{m, -m} {
				if got := f.MidpointDistance(x); got != 0 {
					t.Errorf("%s.MidpointDistance(%v) = %v, want 0 (a tie)", f.Name, x, got)
				}
				if !f.NearTie(x, 0) {
					t.Errorf("%s.NearTie(%v, 0) = false at a tie", f.Name, x)
				}
			}
		}
		for _, x := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
			if got := f.MidpointDistance(x); !math.IsInf(got, 1) {
				t.Errorf("%s.MidpointDistance(%v) = %v, want +Inf", f.Name, x, got)
			}
			if f.NearTie(x, 1) {
				t.Errorf("%s.NearTie(%v, 1) = true", f.Name, x)
			}
		}
		if f.NearTie(0, 1) {
			t.Errorf("%s.NearTie(0, 1) = true; zero is a code", f.Name)
		}
	}
}

// TestPropMidpointDistance: for |x| within range, MidpointDistance is in
// [0, 0.5], symmetric, and says how far the rounding moved x: the stored
// value lies (0.5 - d) spacings from x, where the spacing is that of the two
// neighbouring values around |x| (found by brute force).
func TestPropMidpointDistance(t *testing.T) {
	for _, f := range minifloats {
		ladder := positiveLadder(f)
		t.Run(f.Name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				x := genX(f).Draw(t, "x")
				ax := math.Abs(x)
				if ax >= f.MaxFinite() {
					t.Skip("beyond the largest value")
				}
				d := f.MidpointDistance(x)
				if !(d >= 0 && d <= 0.5) {
					t.Fatalf("MidpointDistance(%x) = %v, outside [0, 0.5]", x, d)
				}
				if d2 := f.MidpointDistance(-x); d2 != d {
					t.Fatalf("MidpointDistance(%x) = %v but (%x) gives %v", x, d, -x, d2)
				}
				var spacing float64
				for i := 0; i+1 < len(ladder); i++ {
					if ladder[i].v <= ax && ax < ladder[i+1].v {
						spacing = ladder[i+1].v - ladder[i].v
						break
					}
				}
				stored, _ := f.Round(x, formats.Saturate)
				moved := math.Abs(stored - x)
				if want := (0.5 - d) * spacing; math.Abs(moved-want) > 1e-12*spacing {
					t.Fatalf("x = %x: rounding moved it by %v = %v spacings, MidpointDistance = %v predicts %v",
						x, moved, moved/spacing, d, 0.5-d)
				}
			})
		})
	}
}

// TestPropNearTie: NearTie(x, tol) holds exactly when some midpoint of f lies
// within tol·|x| of x (brute force over all midpoints; tolerances up to 2^-8,
// the regime the checker uses: a few fp32 ulps). When it does not hold, a
// relative perturbation of half the tolerance never changes the code.
func TestPropNearTie(t *testing.T) {
	for _, f := range minifloats {
		mids := midpoints(f)
		t.Run(f.Name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				x := genX(f).Draw(t, "x")
				tol := rapid.SampledFrom([]float64{0, 0x1p-22, 0x1p-16, 0x1p-12, 0x1p-8}).Draw(t, "tol")
				ax := math.Abs(x)
				want := false
				for _, m := range mids {
					if math.Abs(ax-m) <= tol*ax {
						want = true
						break
					}
				}
				got := f.NearTie(x, tol)
				if got != want {
					t.Fatalf("NearTie(%x, %v) = %v, brute force over the midpoints says %v", x, tol, got, want)
				}
				if got {
					return
				}
				c0, _ := f.Encode(x, formats.NoSaturate)
				for _, s := range []float64{1 - tol/2, 1 + tol/2} {
					if c, _ := f.Encode(x*s, formats.NoSaturate); c != c0 && !(f.IsNaN(c) && f.IsNaN(c0)) {
						t.Fatalf("NearTie(%x, %v) = false, yet x·%v encodes to %#02x instead of %#02x", x, tol, s, c, c0)
					}
				}
			})
		})
	}
}
