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

// TestNormalsAreNormal: Normals fills a slice with what as many calls of
// Normal return, from any state (a spare pending or not), at every length
// around its batch and its pairs, and leaves the generator where those
// calls would.
func TestNormalsAreNormal(t *testing.T) {
	for _, skip := range []int{0, 1} {
		for _, n := range []int{0, 1, 2, 3, 7, 255, 256, 511, 512, 513, 1000} {
			a, b := NewRNG(5, 9), NewRNG(5, 9)
			for range skip {
				a.Normal()
				b.Normal()
			}
			got := make([]float64, n)
			a.Normals(got)
			for k := range got {
				if w := b.Normal(); math.Float64bits(got[k]) != math.Float64bits(w) {
					t.Fatalf("after %d, n=%d: value %d is %v; Normal gives %v", skip, n, k, got[k], w)
				}
			}
			for k := 0; k < 3; k++ {
				if x, y := a.Normal(), b.Normal(); x != y {
					t.Fatalf("after %d, n=%d: the generator drew %v next; Normal's calls leave it to draw %v", skip, n, x, y)
				}
			}
		}
	}
}
