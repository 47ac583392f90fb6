//go:build amd64 && !purego

package nvfp4

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/internal/guard"
	"github.com/kcheck-dev/kcheck/reference/internal/simd"
)

// TestPanelMatchesBlockValues: the transposed panels the assembly tiles
// read hold blockValues' bits, written between NaN guards (package guard), for every scale code (zeros, subnormals,
// 448, negative scales, the two NaNs) and every E2M1 code, in full panels,
// ragged last panels (16 rows through panelAVX512, the rest through
// panelGeneric; every row through panelGeneric below AVX-512) and K
// slices that start past 0.
func TestPanelMatchesBlockValues(t *testing.T) {
	simd.AtEachLevel(t, &level, levels, testPanelMatchesBlockValues)
}

func testPanelMatchesBlockValues(t *testing.T) {
	if level == simd.Generic {
		t.Skip("the plain-Go GEMM reads no panels")
	}
	r := rand.New(rand.NewPCG(71, 72))
	const k = 4096 // 256 blocks a row
	for _, n := range []int{32, 64, 45, 16, 7} {
		b := randomMatrix(r, n, k, 1, Dequant, nil)
		for i := range b.Scales {
			b.Scales[i] = uint8(i) // every scale code in every row
		}
		bv := b.blockValues()
		for j0 := 0; j0 < n; j0 += asmTJ {
			for _, ks := range [][2]int{{0, k}, {512, 1024}, {k - 16, k}} {
				pg := guard.Zeros[float32]((ks[1] - ks[0]) * asmTJ)
				p := pg.S()
				b.panel(p, j0, ks[0], ks[1])
				if err := pg.Overrun(); err != nil {
					t.Fatalf("n=%d panel %d slice %v: %v", n, j0, ks, err)
				}
				for c := ks[0]; c < ks[1]; c++ {
					for q := 0; q < asmTJ; q++ {
						got, want := p[(c-ks[0])*asmTJ+q], float32(0)
						if j0+q < n {
							want = bv[(j0+q)*k+c]
						}
						if math.Float32bits(got) != math.Float32bits(want) {
							t.Fatalf("n=%d row %d position %d (slice %v): %v (%#x), blockValues %v (%#x)",
								n, j0+q, c, ks, got, math.Float32bits(got), want, math.Float32bits(want))
						}
					}
				}
			}
		}
	}
}
