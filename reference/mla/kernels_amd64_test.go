//go:build amd64 && !purego

package mla

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/internal/simd"
)

// TestExp2fVectorSettlesAlmostEverything: the vector exp2f leaves a block
// to the scalar definition only when a rounding is too close to call (about
// one argument in 2^23) or an argument is NaN or past 127; on a million
// softmax arguments it settles all but a handful, and what it settles is
// the definition's bits.
func TestExp2fVectorSettlesAlmostEverything(t *testing.T) {
	if level != simd.AVX512 {
		t.Skip("no AVX-512 here: the vector exp2f does not run")
	}
	rng := rand.New(rand.NewPCG(8, 8))
	const n = 1 << 20
	src, dst, want := make([]float64, n), make([]float64, n), make([]float64, n)
	for i := range src {
		src[i] = -160 * rng.Float64() // below -149 too: settled as 0 or 2^-149
	}
	unsettled := exp2fVecAVX512(&dst[0], &src[0], n)
	exp2fVecGeneric(want, src)
	if unsettled > 8 {
		t.Fatalf("%d of %d arguments left to the scalar definition; want a handful", unsettled, n)
	}
	mismatched := 0
	for i := range dst {
		if math.Float64bits(dst[i]) != math.Float64bits(want[i]) {
			mismatched++
		}
	}
	if mismatched > unsettled {
		t.Fatalf("%d lanes differ from the definition but only %d were reported unsettled", mismatched, unsettled)
	}
	t.Logf("%d of %d unsettled", unsettled, n)
}
