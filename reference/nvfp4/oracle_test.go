package nvfp4

import (
	"context"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// The GEMM oracle is the arithmetic GEMM's doc describes, one output at a
// time with the plainest loops: per 16-element block the exact sum of
// products, added in K order to an fp32 and a float64 accumulator. The
// tiled, parallel GEMM must reproduce it bit for bit.
func gemmOracle(a, b *Matrix, out tensor.DType) (exact, expected []float64) {
	av, bv := a.blockValues(), b.blockValues()
	num, den := 1.0, 1.0
	num32, den32 := float32(1), float32(1)
	for _, x := range []*Matrix{a, b} {
		if x.Kind == Quant {
			den *= x.Global
			den32 = float32(den32 * float32(x.Global))
		} else {
			num *= x.Global
			num32 = float32(num32 * float32(x.Global))
		}
	}
	alpha32 := float32(num32 / den32)
	m, n, k := a.Rows, b.Rows, a.K
	exact, expected = make([]float64, m*n), make([]float64, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var acc32 float32
			var acc64 float64
			for c0 := 0; c0 < k; c0 += BlockSize {
				var s float32 // exact: see GEMM
				for c := c0; c < c0+BlockSize; c++ {
					s += av[i*k+c] * bv[j*k+c]
				}
				acc32 = float32(acc32 + s)
				acc64 += float64(s)
			}
			exact[i*n+j] = acc64 * num / den
			expected[i*n+j] = RoundTo(out, float64(float32(alpha32*acc32)))
		}
	}
	return exact, expected
}

func sameBits(t *testing.T, what string, got, want []float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if math.Float64bits(got[i]) != math.Float64bits(want[i]) && !(math.IsNaN(got[i]) && math.IsNaN(want[i])) {
			t.Fatalf("%s[%d] = %v, oracle %v (not bit-identical)", what, i, got[i], want[i])
		}
	}
}

// TestGEMMMatchesOracle: shapes that are and are not multiples of the
// tiles, every scale code including subnormals and 448, both global kinds,
// a NaN scale, and every output dtype.
func TestGEMMMatchesOracle(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 41))
	for _, sh := range [][3]int{{1, 1, 16}, {5, 37, 48}, {9, 70, 560}, {33, 64, 1024}} {
		for _, od := range []tensor.DType{tensor.BF16, tensor.F16, tensor.F32} {
			m, n, k := sh[0], sh[1], sh[2]
			a := randomMatrix(r, m, k, float64(float32(0.0123)), Dequant, nil)
			b := randomMatrix(r, n, k, float64(float32(2688/3.7)), Quant, nil)
			if m*n > 100 {
				a.Scales[len(a.Scales)/2] = 0xFF // NaN
			}
			ex, xp, err := GEMM(context.Background(), a, b, od)
			if err != nil {
				t.Fatal(err)
			}
			wx, wp := gemmOracle(a, b, od)
			sameBits(t, "exact", ex, wx)
			sameBits(t, "expected", xp, wp)
		}
	}
}

// TestGEMMDeterministicAcrossGOMAXPROCS: the tiles are shared out to
// however many threads run, and no output depends on which.
func TestGEMMDeterministicAcrossGOMAXPROCS(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 9))
	a := randomMatrix(r, 40, 512, 1e-3, Dequant, nil)
	b := randomMatrix(r, 100, 512, 2e-3, Dequant, nil)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	var ex0, xp0 []float64
	for _, p := range []int{1, 2, 8} {
		runtime.GOMAXPROCS(p)
		for run := 0; run < 2; run++ {
			ex, xp, err := GEMM(context.Background(), a, b, tensor.BF16)
			if err != nil {
				t.Fatal(err)
			}
			if ex0 == nil {
				ex0, xp0 = ex, xp
				continue
			}
			sameBits(t, "exact", ex, ex0)
			sameBits(t, "expected", xp, xp0)
		}
	}
}

// TestDequantizeMatchesElementLoop: the blocked, parallel dequantizers
// give, bit for bit, the element-by-element formulas (CodeAt, ScaleValue),
// at GOMAXPROCS 1, 2 and 8, for both global kinds and every output dtype.
func TestDequantizeMatchesElementLoop(t *testing.T) {
	r := rand.New(rand.NewPCG(12, 34))
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, kind := range []GlobalKind{Dequant, Quant} {
		a := randomMatrix(r, 40, 4096+48, float64(float32(0.37)), kind, nil) // three units of 15 rows
		a.Scales[5] = 0x7F                                                   // NaN
		for _, od := range []tensor.DType{tensor.BF16, tensor.F16, tensor.F32} {
			wantEx, wantXp := make([]float64, a.Rows*a.K), make([]float64, a.Rows*a.K)
			g32 := float32(a.Global)
			for i := range wantEx {
				v := CodeValue(CodeAt(a.Packed, i)) * ScaleValue(a.Scales[i/BlockSize])
				if kind == Quant {
					wantEx[i] = v / a.Global
					wantXp[i] = RoundTo(od, float64(float32(float32(v)/g32)))
				} else {
					wantEx[i] = v * a.Global
					wantXp[i] = RoundTo(od, float64(float32(float32(v)*g32)))
				}
			}
			for _, p := range []int{1, 2, 8} {
				runtime.GOMAXPROCS(p)
				ex, err := Dequantize(context.Background(), a)
				if err != nil {
					t.Fatal(err)
				}
				xp, err := DequantizeExpected(context.Background(), a, od)
				if err != nil {
					t.Fatal(err)
				}
				sameBits(t, "exact", ex, wantEx)
				sameBits(t, "expected", xp, wantXp)
			}
		}
	}
}

func BenchmarkDequantize(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 3))
	w := randomMatrix(r, 2048, 7168, 1e-3, Dequant, nil)
	for b.Loop() {
		if _, err := Dequantize(context.Background(), w); err != nil {
			b.Fatal(err)
		}
		if _, err := DequantizeExpected(context.Background(), w, tensor.BF16); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkQuantize(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
	x := make([]float64, 256*7168)
	for i := range x {
		x[i] = r.NormFloat64()
	}
	for b.Loop() {
		if _, err := Quantize(context.Background(), x, 256, 7168, 2688/4.5); err != nil {
			b.Fatal(err)
		}
		if _, err := QuantizeExpected(context.Background(), x, 256, 7168, 2688/4.5); err != nil {
			b.Fatal(err)
		}
	}
}

// TestQuantizeDeterministicAcrossGOMAXPROCS: codes, scales and the values
// they were rounded from are the same at 1, 2 and 8 threads.
func TestQuantizeDeterministicAcrossGOMAXPROCS(t *testing.T) {
	r := rand.New(rand.NewPCG(6, 7))
	const rows, k = 70, 2048
	x := make([]float64, rows*k)
	for i := range x {
		x[i] = r.NormFloat64() * math.Ldexp(1, r.IntN(20)-10)
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	var ref [2]*Quantized
	for _, p := range []int{1, 2, 8} {
		runtime.GOMAXPROCS(p)
		for i, f := range []func(context.Context, []float64, int, int, float64) (*Quantized, error){Quantize, QuantizeExpected} {
			q, err := f(context.Background(), x, rows, k, 2688/40.0)
			if err != nil {
				t.Fatal(err)
			}
			if ref[i] == nil {
				ref[i] = q
				continue
			}
			sameBits(t, "scale inputs", q.ScaleIn, ref[i].ScaleIn)
			sameBits(t, "code inputs", q.CodeIn, ref[i].CodeIn)
			if string(q.Codes) != string(ref[i].Codes) || string(q.Scales) != string(ref[i].Scales) {
				t.Fatalf("GOMAXPROCS %d: codes or scales differ", p)
			}
		}
	}
}
