package formats_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/formats"
)

// The bit-level encoders behind Encode (and Code, its code alone) for
// E2M1, E4M3FN and E5M2 must give the code and Accuracy of the arithmetic encoder (EncodeGeneral, the
// definition) for every float64. Both are monotone step functions of |x|
// that step only at midpoints between codes, so agreeing at every
// midpoint and on both sides of it (TestBitEncoderMidpoints) is agreeing
// everywhere; the float32 sweep (TestBitEncoderEveryFloat32) checks that
// directly for every float32 of the formats' ranges, the inputs the
// kernels convert; and the general encoder is itself checked against
// NVIDIA's conversions (TestFP8EncodeNVIDIA, fp8_encode.csv).

func sameEncode(t *testing.T, f *formats.Minifloat, x float64, mode formats.Overflow) bool {
	t.Helper()
	got, gotAcc := f.Encode(x, mode)
	want, wantAcc := f.EncodeGeneral(x, mode)
	if got != want || gotAcc != wantAcc {
		t.Errorf("%s.Encode(%x, %s) = %#02x, %v; the general encoder gives %#02x, %v", f.Name, x, modeName(mode), got, gotAcc, want, wantAcc)
		return false
	}
	if c := f.Code(x, mode); c != want {
		t.Errorf("%s.Code(%x, %s) = %#02x; the general encoder gives %#02x", f.Name, x, modeName(mode), c, want)
		return false
	}
	return sameNearTie(t, f, x)
}

// tieTolerances are NearTie's tolerances in use (nvfp4's roundQuotient
// 2^-40, its TieTol 2^-21) and either side of them, up to 2^-8.
var tieTolerances = []float64{0, 0x1p-52, 0x1p-40, 0x1p-30, 0x1p-21, 0x1p-16, 0x1p-8}

// sameNearTie: the bit-level NearTie agrees with its arithmetic
// definition at x for every tolerance in use.
func sameNearTie(t *testing.T, f *formats.Minifloat, x float64) bool {
	t.Helper()
	for _, tol := range tieTolerances {
		if got, want := f.NearTie(x, tol), f.NearTieGeneral(x, tol); got != want {
			t.Errorf("%s.NearTie(%x, %v) = %v; the general definition gives %v", f.Name, x, tol, got, want)
			return false
		}
	}
	return true
}

// TestBitEncoderMidpoints: at every code, every midpoint between
// neighbouring codes (and the one above the largest), 1 to 8 float64 ulps
// and 1 to 8 float32 ulps either side of each, both signs, both overflow
// modes; the specials; and random float64 over every binade from the
// underflow to past the overflow.
func TestBitEncoderMidpoints(t *testing.T) {
	if testing.Short() {
		t.Skip("arithmetic on one goroutine (40 s under the race detector, which finds nothing here): make test runs it in its pass without -race")
	}
	for _, f := range minifloats {
		var points []float64
		ladder := positiveLadder(f)
		for i, r := range ladder {
			points = append(points, r.v)
			if i+1 < len(ladder) {
				points = append(points, (r.v+ladder[i+1].v)/2)
			}
		}
		top := ladder[len(ladder)-1].v
		step := top - ladder[len(ladder)-2].v
		points = append(points, top+step/2, top+step, 2*top, f.SmallestSubnormal()/2, f.SmallestSubnormal()/4)
		var xs []float64
		for _, p := range points {
			xs = append(xs, p)
			up, down, up32, down32 := p, p, float32(p), float32(p)
			for range 8 {
				up, down = math.Nextafter(up, math.Inf(1)), math.Nextafter(down, 0)
				up32, down32 = math.Nextafter32(up32, float32(math.Inf(1))), math.Nextafter32(down32, 0)
				xs = append(xs, up, down, float64(up32), float64(down32))
			}
		}
		xs = append(xs, 0, math.Inf(1), math.NaN(), math.MaxFloat64, math.SmallestNonzeroFloat64, 0x1p-1022, 0x1.fffffffffffffp-1023)
		r := rand.New(rand.NewPCG(3, uint64(f.Bits())))
		lo, hi := math.Log2(f.SmallestSubnormal())-3, math.Log2(top)+3
		for range 200000 {
			frac, e := 1+r.Float64(), lo+r.Float64()*(hi-lo)
			xs = append(xs, math.Ldexp(frac, int(math.Floor(e))))
		}
		n := 0
		for _, x := range xs {
			for _, mode := range []formats.Overflow{formats.Saturate, formats.NoSaturate} {
				for _, s := range []float64{1, -1} {
					n++
					if !sameEncode(t, f, math.Copysign(x, s*math.Copysign(1, x)), mode) {
						return
					}
				}
			}
		}
		t.Logf("%s: %d encodes agree", f.Name, n)
	}
}

// nvfp4TieTol is reference/nvfp4's TieTol (that package imports this one).
const nvfp4TieTol = 0x1p-21

// TestBitEncoderEveryFloat32: for E2M1 and E4M3FN, the formats of NVFP4's
// codes and scales, every positive float32 from a quarter of the smallest
// subnormal to four times the largest value, in both overflow modes past
// half the largest value (below it the modes cannot differ), and one
// float32 in 4099 above that range through infinity and NaN, negated
// too (the sign is one bit either encoder copies; the midpoint test
// checks both signs everywhere). About 0.25 G encodes of each: run in the
// full test pass.
func TestBitEncoderEveryFloat32(t *testing.T) {
	if testing.Short() {
		t.Skip("every float32 of two formats' ranges: make test runs it in its pass without -race")
	}
	for _, f := range []*formats.Minifloat{formats.E2M1, formats.E4M3FN} {
		first := math.Float32bits(float32(f.SmallestSubnormal() / 4))
		last := math.Float32bits(float32(f.MaxFinite() * 4))
		half := math.Float32bits(float32(f.MaxFinite() / 2))
		workers := runtime.GOMAXPROCS(0)
		var wg sync.WaitGroup
		var mu sync.Mutex
		var failures []string
		for w := range workers {
			wg.Go(func() {
				check := func(x float64, mode formats.Overflow) bool {
					got, gotAcc := f.Encode(x, mode)
					want, wantAcc := f.EncodeGeneral(x, mode)
					if got == want && gotAcc == wantAcc && f.Code(x, mode) == want &&
						f.NearTie(x, 0x1p-40) == f.NearTieGeneral(x, 0x1p-40) && f.NearTie(x, nvfp4TieTol) == f.NearTieGeneral(x, nvfp4TieTol) {
						return true
					}
					mu.Lock()
					failures = append(failures, fmt.Sprintf("%s.Encode(%x, %s) = %#02x, %v; the general encoder gives %#02x, %v (or NearTie differs: %v %v at 2^-40, %v %v at TieTol)",
						f.Name, x, modeName(mode), got, gotAcc, want, wantAcc,
						f.NearTie(x, 0x1p-40), f.NearTieGeneral(x, 0x1p-40), f.NearTie(x, nvfp4TieTol), f.NearTieGeneral(x, nvfp4TieTol)))
					mu.Unlock()
					return false
				}
				for b := first + uint32(w); b <= last; b += uint32(workers) {
					x := float64(math.Float32frombits(b))
					if !check(x, formats.Saturate) || b >= half && !check(x, formats.NoSaturate) {
						return
					}
				}
				for b := last + uint32(w)*4099; b < 0x80000000; b += uint32(workers) * 4099 {
					x := float64(math.Float32frombits(b))
					if !check(x, formats.Saturate) || !check(-x, formats.NoSaturate) {
						return
					}
				}
			})
		}
		wg.Wait()
		if len(failures) > 0 {
			t.Fatalf("%d differences, first: %s", len(failures), failures[0])
		}
		t.Logf("%s: float32 %#08x .. %#08x agree", f.Name, first, last)
	}
}
