package signature

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestSampleIsTheHashBelowTheRate holds Sample's integer comparison to
// the definition it stands for, unitHash(i) < rate in floating point
// (every element where rate >= 1), at rates of every kind: none, NaN,
// all, tiny, a multiple of 2^-53, random, and each element's own hash and
// the next float64 above it, where the strict comparison decides.
func TestSampleIsTheHashBelowTheRate(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 53))
	rates := []float64{0, -1, math.NaN(), 1, 1.5, math.Inf(1), 0x1p-60, 0x1p-53, 3 * 0x1p-53, 0.5, 1 - 0x1p-53}
	for range 20 {
		rates = append(rates, r.Float64())
	}
	for _, k := range []uint64{0, 1, 7, 1 << 20, 123456789} {
		h := unitHash(k)
		rates = append(rates, h, math.Nextafter(h, 1), math.Nextafter(h, 0))
	}
	for _, rate := range rates {
		s := NewSample(rate)
		check := func(i int) {
			want := rate >= 1 || unitHash(uint64(i)) < rate
			if got := s.Has(i); got != want {
				t.Fatalf("rate %v (%x): element %d in the sample %v, unitHash %v < rate %v", rate, math.Float64bits(rate), i, got, unitHash(uint64(i)), want)
			}
			if got := InSample(i, rate); got != want {
				t.Fatalf("rate %v: InSample(%d) %v, want %v", rate, i, got, want)
			}
		}
		for i := range 1 << 14 {
			check(i)
		}
		for _, k := range []int{1 << 20, 123456789} {
			check(k)
		}
		for range 1 << 12 {
			check(int(r.Uint64() >> 1))
		}
	}
}
