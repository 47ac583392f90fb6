package mla

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/internal/guard"
	"github.com/kcheck-dev/kcheck/reference/internal/simd"
)

// TestKernelsMatchDefinitions: the inner loops at every level this build
// runs (assembly on amd64 with AVX-512 or AVX2) give the bits of the plain-Go definitions, between NaN
// guards (package guard: a read past a slice shows as NaN, a write past it
// as an overrun), on shapes
// the assembly takes (D a multiple of 16, latent widths of 32 and 64
// columns) and on shapes it leaves to the definitions, with values spanning
// many binades, zeros, subnormal products and infinities.
func TestKernelsMatchDefinitions(t *testing.T) {
	simd.AtEachLevel(t, &level, levels, testKernelsMatchDefinitions)
}

func testKernelsMatchDefinitions(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 17))
	val := func() float64 {
		switch rng.IntN(40) {
		case 0:
			return 0
		case 1:
			return math.Ldexp(1, -140) // products of two underflow below float32
		case 2:
			return math.Inf(1 - 2*rng.IntN(2))
		}
		x := math.Ldexp(rng.NormFloat64(), rng.IntN(40)-20)
		return float64(math.Float32frombits(math.Float32bits(float32(x)) &^ 0xFFFF)) // bf16
	}
	fill := func(n int, finite bool) []float64 {
		v := make([]float64, n)
		for i := range v {
			for v[i] = val(); finite && math.IsInf(v[i], 0); v[i] = val() {
			}
		}
		return v
	}
	for _, c := range []struct{ rows, d, nj int }{
		{16, 576, 64}, {64, 576, 61}, {11, 576, 3}, {33, 32, 9}, {5, 43, 7}, {1, 16, 1},
	} {
		for _, m := range []rmode{r32, r64, rBF16} {
			q := fill(c.rows*c.d, false)
			kg := guard.New(fill(Block*c.d, false))
			k := kg.S()
			rows := make([]rowSpec, c.rows)
			for r := range rows {
				rows[r].q = r * c.d
			}
			var p qpack
			p.pack(q, rows, c.d)
			n := Block * p.stride
			sxg, srg := guard.Zeros[float64](n), guard.Zeros[float64](n)
			sx, sr, gx, gr := sxg.S(), srg.S(), make([]float64, n), make([]float64, n)
			scoresGeneric(&p, k, c.d, c.nj, gx, gr, m)
			// bf16 values: exact products, so the fused kernel may run too
			for _, fused := range []bool{false, true} {
				scores(&p, k, c.d, c.nj, sx, sr, m, fused)
				noOverrun(t, "scores sx", sxg)
				noOverrun(t, "scores sr", srg)
				noOverrun(t, "scores k", kg)
				for j := 0; j < c.nj; j++ {
					for r := 0; r < c.rows; r++ {
						i := j*p.stride + r
						if !sameFloat(sx[i], gx[i]) || !sameFloat(sr[i], gr[i]) {
							t.Fatalf("scores rows=%d d=%d nj=%d mode %d fused %v: token %d row %d: (%v, %v), definition (%v, %v)",
								c.rows, c.d, c.nj, m, fused, j, r, sx[i], sr[i], gx[i], gr[i])
						}
					}
				}
			}
			// full float64 queries: products are inexact, the unfused kernel must still agree
			for i := range q {
				q[i] = rng.NormFloat64()
			}
			p.pack(q, rows, c.d)
			scoresGeneric(&p, k, c.d, c.nj, gx, gr, m)
			scores(&p, k, c.d, c.nj, sx, sr, m, false)
			for j := 0; j < c.nj; j++ {
				for r := 0; r < c.rows; r++ {
					if i := j*p.stride + r; !sameFloat(sx[i], gx[i]) || !sameFloat(sr[i], gr[i]) {
						t.Fatalf("scores (float64 q) rows=%d d=%d nj=%d mode %d: token %d row %d: (%v, %v), definition (%v, %v)",
							c.rows, c.d, c.nj, m, j, r, sx[i], sr[i], gx[i], gr[i])
					}
				}
			}
		}
	}
	for _, c := range []struct{ l, d, nj, rows int }{
		{512, 576, 64, 64}, {512, 576, 1, 4}, {64, 80, 13, 7}, {37, 43, 9, 5}, {128, 128, 5, 2},
	} {
		accg, vg := guard.New(fill(c.rows*2*c.l, true)), guard.New(fill(Block*c.d, true))
		acc, v := accg.S(), vg.S()
		pg := guard.Zeros[float64](c.rows * Block) // probabilities: full float64 significands
		p := pg.S()
		for i := range p {
			p[i] = rng.Float64()
		}
		want := append([]float64(nil), acc...)
		pvExact(acc, 2*c.l, p, Block, v, c.d, c.nj, c.l, c.rows)
		noOverrun(t, "pvExact acc", accg)
		pvExactGeneric(want, 2*c.l, p, Block, v, c.d, c.nj, c.l, c.rows)
		for i := range acc {
			if !sameFloat(acc[i], want[i]) {
				t.Fatalf("pvExact l=%d nj=%d rows=%d: element %d is %v, definition %v", c.l, c.nj, c.rows, i, acc[i], want[i])
			}
		}
		// fp32: bf16 values and P whose products are normal float32
		a32g, v32g, p32g := guard.Zeros[float32](c.rows*c.l), guard.Zeros[float32](Block*c.l), guard.Zeros[float32](c.rows*Block)
		a32, v32, p32 := a32g.S(), v32g.S(), p32g.S()
		for i := range a32 {
			a32[i] = float32(rng.NormFloat64())
		}
		for i := range v32 {
			v32[i] = math.Float32frombits(math.Float32bits(float32(rng.NormFloat64())) &^ 0xFFFF)
		}
		for i := range p32 {
			p32[i] = math.Float32frombits(math.Float32bits(float32(rng.Float64())) &^ 0xFFFF)
		}
		w32 := append([]float32(nil), a32...)
		pvExpected32(a32, c.l, p32, Block, v32, c.nj, c.l, c.rows)
		noOverrun(t, "pvExpected32 acc", a32g)
		pvExpected32Generic(w32, c.l, p32, Block, v32, c.nj, c.l, c.rows)
		for i := range a32 {
			if math.Float32bits(a32[i]) != math.Float32bits(w32[i]) {
				t.Fatalf("pvExpected32 l=%d nj=%d rows=%d: element %d is %v, definition %v", c.l, c.nj, c.rows, i, a32[i], w32[i])
			}
		}
	}
}

// TestNarrowWidenMatchDefinitions: the float64/float32 conversions and the
// running smallest nonzero magnitude, on every length up to 40 with zeros,
// NaN, infinities and values that round when narrowed, at every level this
// CPU runs.
func TestNarrowWidenMatchDefinitions(t *testing.T) {
	simd.AtEachLevel(t, &level, levels, testNarrowWidenMatchDefinitions)
}

func testNarrowWidenMatchDefinitions(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	special := []float64{0, math.Copysign(0, -1), math.NaN(), math.Inf(1), math.Inf(-1), 1e-300, -3e-41, 1 + 0x1p-40}
	for n := 0; n <= 40; n++ {
		srcg := guard.Zeros[float64](n)
		src := srcg.S()
		for i := range src {
			if rng.IntN(4) == 0 {
				src[i] = special[rng.IntN(len(special))]
			} else {
				src[i] = math.Ldexp(rng.NormFloat64(), rng.IntN(60)-30)
			}
		}
		for _, lo := range []float64{math.Inf(1), 1e-3, 0} {
			gg, w := guard.Zeros[float32](n), make([]float32, n)
			g := gg.S()
			gl, wl := narrow(g, src, lo), narrowGeneric(w, src, lo)
			noOverrun(t, "narrow dst", gg)
			if math.Float64bits(gl) != math.Float64bits(wl) {
				t.Fatalf("narrow n=%d lo=%v: smallest %v, definition %v", n, lo, gl, wl)
			}
			for i := range g {
				if math.Float32bits(g[i]) != math.Float32bits(w[i]) {
					t.Fatalf("narrow n=%d: value %d is %v, definition %v", n, i, g[i], w[i])
				}
			}
			gwg, wg, ww := guard.Zeros[float64](n), guard.New(w), make([]float64, n)
			gw := gwg.S()
			widenF32(gw, wg.S())
			noOverrun(t, "widenF32 dst", gwg)
			widenF32Generic(ww, w)
			for i := range gw {
				if math.Float64bits(gw[i]) != math.Float64bits(ww[i]) {
					t.Fatalf("widenF32 n=%d: value %d is %v, definition %v", n, i, gw[i], ww[i])
				}
			}
		}
	}
}

// TestExpDef: Exact's exp is within 2 ulp of math.Exp across its range
// (arguments in every binade from 2^-40 to 708, both signs), 0 below -708,
// +Inf above 709, NaN for NaN, and 1 at 0.
func TestExpDef(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	worst := 0.0
	for i := 0; i < 1<<20; i++ {
		x := math.Ldexp(rng.Float64(), rng.IntN(50)-40)
		if rng.IntN(2) == 0 {
			x = -x
		}
		if x > 709 || x < -708 {
			continue
		}
		got, want := expDef(x), math.Exp(x)
		ulp := math.Nextafter(want, math.Inf(1)) - want
		if e := math.Abs(got-want) / ulp; e > worst {
			worst = e
		}
	}
	if worst > 2 {
		t.Fatalf("expDef is %.2f ulp from math.Exp at worst; want at most 2", worst)
	}
	t.Logf("expDef: at most %.2f ulp from math.Exp", worst)
	for _, c := range []struct{ x, want float64 }{{0, 1}, {-708.5, 0}, {math.Inf(-1), 0}, {709.5, math.Inf(1)}, {math.Inf(1), math.Inf(1)}} {
		if got := expDef(c.x); got != c.want {
			t.Fatalf("expDef(%v) = %v, want %v", c.x, got, c.want)
		}
	}
	if !math.IsNaN(expDef(math.NaN())) {
		t.Fatalf("expDef(NaN) is not NaN")
	}
}

// TestExpVectorsMatchDefinitions: the softmax's vector exps give the bits
// of expDef and of exp2f (splitk.Exp2F32 of the fp32 argument) on random
// arguments of a softmax's range, the ends of fp32's exponent range, and
// infinities and NaN, at lengths that leave remainders, at every level this
// CPU runs.
func TestExpVectorsMatchDefinitions(t *testing.T) {
	simd.AtEachLevel(t, &level, levels, testExpVectorsMatchDefinitions)
}

func testExpVectorsMatchDefinitions(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 6))
	special := []float64{0, math.Copysign(0, -1), -149, -149.5, -150, -150.5, -126, 127, 127.5, 128, -708, -708.5, 709, 709.5,
		math.Inf(1), math.Inf(-1), math.NaN(), -1e300}
	for _, n := range []int{1, 7, 8, 64, 1003} {
		for trial := 0; trial < 200; trial++ {
			srcg := guard.Zeros[float64](n)
			src := srcg.S()
			for i := range src {
				switch rng.IntN(10) {
				case 0:
					src[i] = special[rng.IntN(len(special))]
				case 1:
					src[i] = -300 * rng.Float64()
				default:
					src[i] = -40 * rng.Float64()
				}
			}
			for _, f := range []struct {
				name      string
				vec, spec func(dst, src []float64)
			}{{"exp", expVec, expVecGeneric}, {"exp2f", exp2fVec, exp2fVecGeneric}} {
				gotg, want := guard.Zeros[float64](n), make([]float64, n)
				got := gotg.S()
				f.vec(got, src)
				noOverrun(t, f.name+" dst", gotg)
				f.spec(want, src)
				for i := range got {
					if !sameFloat(got[i], want[i]) {
						t.Fatalf("%s(%v) = %v, definition %v", f.name, src[i], got[i], want[i])
					}
				}
			}
		}
	}
}

// sameFloat: the same bits, or both NaN (payloads may differ with operand order).
func sameFloat(a, b float64) bool {
	return math.Float64bits(a) == math.Float64bits(b) || (math.IsNaN(a) && math.IsNaN(b))
}

// noOverrun fails the test when a kernel wrote past the slice of b (the
// assembly's stores are not bounds-checked).
func noOverrun[T float32 | float64](t *testing.T, what string, b guard.Buffer[T]) {
	t.Helper()
	if err := b.Overrun(); err != nil {
		t.Fatalf("%s (kernels %s): %v", what, kernelsName(), err)
	}
}
