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
	simd.AtEachLevel(t, &level, levels, testExp2fVectorSettlesAlmostEverything)
}

func testExp2fVectorSettlesAlmostEverything(t *testing.T) {
	vec := map[simd.Level]func(dst, src *float64, n int) int{simd.AVX2: exp2fVecAVX2, simd.AVX512: exp2fVecAVX512}[level]
	if vec == nil {
		t.Skip("the plain Go has no vector exp2f")
	}
	rng := rand.New(rand.NewPCG(8, 8))
	const n = 1 << 20
	src, dst, want := make([]float64, n), make([]float64, n), make([]float64, n)
	for i := range src {
		src[i] = -160 * rng.Float64() // below -149 too: settled as 0 or 2^-149
	}
	unsettled := vec(&dst[0], &src[0], n)
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

// TestExp2fVectorLeavesCloseRoundings: arguments whose 2^x lies within a
// relative 2^-48 of a midpoint between fp32 values (found by a search over
// the fp32 arguments in [-8, -2^-8]; each is confirmed here with
// math.Exp2, whose error is far below 2^-48) are reported unsettled by the
// vector exp2f, each in a block of easy ones, and exp2fVec then gives the
// definition's bits: the neighbour test is what keeps a rounding too close
// to call away from the polynomial.
func TestExp2fVectorLeavesCloseRoundings(t *testing.T) {
	simd.AtEachLevel(t, &level, levels, testExp2fVectorLeavesCloseRoundings)
}

func testExp2fVectorLeavesCloseRoundings(t *testing.T) {
	vec := map[simd.Level]func(dst, src *float64, n int) int{simd.AVX2: exp2fVecAVX2, simd.AVX512: exp2fVecAVX512}[level]
	if vec == nil {
		t.Skip("the plain Go has no vector exp2f")
	}
	for _, bits := range []uint32{0xbcaf4d02, 0xbcf3a937, 0xbd723abf, 0xbe0e371b, 0xbe1f29de, 0xbe5e17c2, 0xbe62e434} {
		x := float64(math.Float32frombits(bits))
		if y := math.Exp2(x); float32(y*(1+0x1p-48)) == float32(y*(1-0x1p-48)) {
			t.Fatalf("2^%v = %v is not within 2^-48 of an fp32 midpoint: not a close rounding", x, y)
		}
		src := []float64{-1, -2, -3, x, -4, -5, -6, -7}
		dst, want := make([]float64, len(src)), make([]float64, len(src))
		if n := vec(&dst[0], &src[0], len(src)); n != 1 {
			t.Errorf("2^%v (bits %#x): %d lanes reported unsettled; want 1, its own", x, bits, n)
		}
		exp2fVec(dst, src)
		exp2fVecGeneric(want, src)
		for i := range dst {
			if math.Float64bits(dst[i]) != math.Float64bits(want[i]) {
				t.Errorf("2^%v: lane %d is %v, definition %v", src[i], i, dst[i], want[i])
			}
		}
	}
}
