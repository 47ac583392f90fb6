package kernel

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestSincosIsSinAndCos: Normal draws its pair with math.Sincos where it
// once called math.Sin and math.Cos, and every generated input (the
// fixtures' checksums pin them) depends on the two giving the same bits.
// Over Normal's angles 2π·u for u in [0, 1): the octant boundaries and
// their neighbours, and a million random ones.
func TestSincosIsSinAndCos(t *testing.T) {
	var angles []float64
	for k := range 9 {
		a := float64(k) * math.Pi / 4
		angles = append(angles, a, math.Nextafter(a, 0), math.Nextafter(a, 7))
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 1 << 20 {
		angles = append(angles, 2*math.Pi*(float64(r.Uint64()>>11)*0x1p-53))
	}
	for _, a := range angles {
		s, c := math.Sincos(a)
		if math.Float64bits(s) != math.Float64bits(math.Sin(a)) || math.Float64bits(c) != math.Float64bits(math.Cos(a)) {
			t.Fatalf("Sincos(%x) = %x, %x; Sin and Cos give %x, %x", a, s, c, math.Sin(a), math.Cos(a))
		}
	}
}
