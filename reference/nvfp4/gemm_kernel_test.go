package nvfp4

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/internal/simd"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// edgeMatrix is randomMatrix with edge values mixed in: about one block
// scale in eight is zero, -0, a subnormal, 448 or a negative scale; about
// one block in eight has all its codes ±0; and one block scale (when nan)
// is NaN, so that one row of the output is NaN and the rest is not.
func edgeMatrix(r *rand.Rand, rows, k int, global float64, kind GlobalKind, nan bool) *Matrix {
	x := randomMatrix(r, rows, k, global, kind, nil)
	special := []uint8{0x00, 0x80, 0x01, 0x07, 0x08, 0x7E, 0xFE, 0x81, 0xB8, 0xC0}
	for i := range x.Scales {
		if r.IntN(8) == 0 {
			x.Scales[i] = special[r.IntN(len(special))]
		}
		if r.IntN(8) == 0 {
			for j := range BlockSize / 2 {
				x.Packed[i*BlockSize/2+j] = uint8(8*r.IntN(2) | 8*r.IntN(2)<<4) // +0 and -0 codes
			}
		}
	}
	if nan && len(x.Scales) > 0 {
		x.Scales[r.IntN(len(x.Scales))] = []uint8{0x7F, 0xFF}[r.IntN(2)]
	}
	return x
}

// TestGEMMMatchesGeneric: the GEMM at every level this build runs (the
// assembly tiles of gemm_amd64.s and gemm_avx2_amd64.s on amd64) gives
// runGeneric's bits, exact and
// expected, on shapes with ragged row tiles (M not a multiple of 8), ragged
// panels (N not a multiple of 32), several K slices with a short last one,
// row runs split between units, every output dtype, both global kinds and
// the edge values of edgeMatrix.
func TestGEMMMatchesGeneric(t *testing.T) {
	simd.AtEachLevel(t, &level, levels, testGEMMMatchesGeneric)
}

func testGEMMMatchesGeneric(t *testing.T) {
	r := rand.New(rand.NewPCG(61, 62))
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, sh := range [][3]int{
		{1, 1, 16}, {8, 32, 16}, {7, 31, 32}, {9, 33, 48}, {16, 64, 512}, {17, 65, 528},
		{3, 100, 1040}, {64, 40, 160}, {600, 3, 64}, {24, 96, 2064}, {1, 300, 256}, {130, 1, 1024},
	} {
		m, n, k := sh[0], sh[1], sh[2]
		for _, od := range []tensor.DType{tensor.BF16, tensor.F16, tensor.F32, tensor.F64} {
			// a NaN in one row of a (or of b when a has one row) spoils one
			// row (column) of the output
			a := edgeMatrix(r, m, k, float64(float32(0.0123)), Dequant, m > 1)
			b := edgeMatrix(r, n, k, float64(float32(2688/3.7)), []GlobalKind{Dequant, Quant}[r.IntN(2)], m == 1 && n > 1)
			for _, procs := range []int{1, 3} {
				runtime.GOMAXPROCS(procs)
				what := fmt.Sprintf("[%d,%d,%d] %s GOMAXPROCS %d", m, n, k, od, procs)
				got, want := newGemmJob(context.Background(), a, b, od), newGemmJob(context.Background(), a, b, od)
				if err := got.run(b); err != nil {
					t.Fatal(err)
				}
				if err := want.runGeneric(b); err != nil {
					t.Fatal(err)
				}
				sameBits(t, what+" exact", got.exact, want.exact)
				sameBits(t, what+" expected", got.expected, want.expected)
				nans, live := 0, 0
				for _, x := range want.exact {
					if math.IsNaN(x) {
						nans++
					} else if x != 0 {
						live++
					}
				}
				if live < len(want.exact)/4 || (nans == 0) != (m == 1 && n == 1) {
					t.Errorf("%s: %d NaN and %d nonzero outputs of %d: the edge values swamp the test", what, nans, live, m*n)
				}
			}
		}
	}
}
