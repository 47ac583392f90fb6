package splitk

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/internal/guard"
	"github.com/kcheck-dev/kcheck/reference/internal/simd"
)

// TestWeightedSumMatchesDefinition: the weighted sums at every level this
// build runs (assembly on amd64 with AVX-512, 32 columns an iteration, or
// AVX2, 16) give the bits
// of weightedSumGeneric, over float64 and float32 partials, for row widths
// that leave remainders and split lists that skip and reorder splits, with
// the accumulators and partials between NaN guards (package guard: a read
// past a slice shows as NaN, a write past it as an overrun).
func TestWeightedSumMatchesDefinition(t *testing.T) {
	simd.AtEachLevel(t, &level, levels, testWeightedSumMatchesDefinition)
}

func testWeightedSumMatchesDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	for _, l := range []int{1, 31, 32, 33, 64, 83, 512} {
		for _, splits := range [][]int{{0}, {2, 0, 1}, {3}, {0, 1, 2, 3}} {
			const s = 4
			o := make([]float64, s*l)
			for i := range o {
				o[i] = float64(float32(rng.NormFloat64()))
			}
			o32 := make([]float32, len(o))
			for i, v := range o {
				o32[i] = float32(v)
			}
			w, cw := make([]float64, len(splits)), make([]float64, len(splits))
			for k := range w {
				w[k], cw[k] = rng.Float64(), float64(float32(rng.Float64()))
			}
			start := make([]float64, l)
			for i := range start {
				start[i] = rng.NormFloat64()
			}
			for _, wide := range []bool{true, false} {
				exg, xpg := guard.New(start), guard.New(start)
				ex, xp := exg.S(), xpg.S()
				wantEx, wantXp := append([]float64(nil), start...), append([]float64(nil), start...)
				if wide {
					og := guard.New(o)
					weightedSum(ex, xp, og.S(), l, splits, w, cw)
					weightedSumGeneric(wantEx, wantXp, o, l, splits, w, cw)
				} else {
					og := guard.New(o32)
					weightedSum(ex, xp, og.S(), l, splits, w, cw)
					weightedSumGeneric(wantEx, wantXp, o32, l, splits, w, cw)
				}
				for _, b := range []guard.Buffer[float64]{exg, xpg} {
					if err := b.Overrun(); err != nil {
						t.Fatalf("l=%d splits %v float64 partials %v: %v", l, splits, wide, err)
					}
				}
				for i := range ex {
					if math.Float64bits(ex[i]) != math.Float64bits(wantEx[i]) || math.Float64bits(xp[i]) != math.Float64bits(wantXp[i]) {
						t.Fatalf("l=%d splits %v float64 partials %v: column %d is (%v, %v), definition (%v, %v)",
							l, splits, wide, i, ex[i], xp[i], wantEx[i], wantXp[i])
					}
				}
			}
		}
	}
}
