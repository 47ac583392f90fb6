package nvfp4

import (
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
			ex, xp, err := GEMM(a, b, od)
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
			ex, xp, err := GEMM(a, b, tensor.BF16)
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
