package kernel

import (
	"math"
	"testing"
)

// TestAbsMaxIsTheMathMaxFold: AbsMax gives what folding math.Max over
// the magnitudes gives (the definition it replaced), bit for bit: zeros
// of either sign, infinities, a NaN anywhere, nothing at all.
func TestAbsMaxIsTheMathMaxFold(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	negZero := math.Copysign(0, -1)
	for _, v := range [][]float64{
		nil,
		{negZero},
		{negZero, 0, negZero},
		{1, -3, 2},
		{-inf, 5},
		{4, nan, 9},
		{nan},
		{2, 7, -nan},
		{0x1p-1074, -0x1p-1074},
		{math.MaxFloat64, -inf, nan},
		{nan, inf, 3},
		{3, nan, 4},
	} {
		want := 0.0
		for _, x := range v {
			want = math.Max(want, math.Abs(x))
		}
		if got := AbsMax(v); math.Float64bits(got) != math.Float64bits(want) {
			t.Errorf("AbsMax(%v) = %v (%#x); the math.Max fold gives %v (%#x)", v, got, math.Float64bits(got), want, math.Float64bits(want))
		}
	}
}
