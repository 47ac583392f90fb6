package normal

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/internal/simd"
)

// pairs is uniforms of every kind the generators draw and the edges of
// the arithmetic: u1 at the ends of (0, 1), at √2/2 times powers of two
// (where Log's f1 meets √2/2) and beside them, u2 at the octants of 2π
// (where Sincos's j changes) and beside them, and random draws as
// RNG.Uniform makes them.
func pairs(r *rand.Rand, n int) (u1, u2 []float64) {
	edges1 := []float64{0x1p-53, 0x1p-1022, 0.5, 0.25, 1 - 0x1p-53, math.Nextafter(1, 0), 0.75, 1e-300}
	for e := 0; e < 60; e++ {
		h := 7.07106781186547524401e-01 * math.Ldexp(1, -e)
		edges1 = append(edges1, h, math.Nextafter(h, 0), math.Nextafter(h, 1))
	}
	var edges2 []float64
	for m := 0; m < 8; m++ {
		v := float64(m) / 8
		edges2 = append(edges2, v, math.Nextafter(v, 0), math.Nextafter(v, 1))
	}
	edges2 = append(edges2, math.Nextafter(1, 0), 0x1p-53)
	for len(u1) < n {
		a := float64(r.Uint64()>>11) * 0x1p-53
		if a == 0 {
			continue
		}
		u1 = append(u1, a)
		u2 = append(u2, float64(r.Uint64()>>11)*0x1p-53)
	}
	for k := range edges1 {
		u1[k] = edges1[k]
	}
	for k := range edges2 {
		u2[len(u2)-1-k] = edges2[k]
	}
	for k := 0; k < len(edges1) && k < len(edges2); k++ { // edges beside edges too
		u1[len(u1)-1-k], u2[k] = edges1[k], edges2[k]
	}
	return u1, u2
}

// TestBoxMullerIsTheDefinition: at every level the CPU runs, BoxMuller
// gives the definition's bits for a million pairs and the edges, at
// every length around the four pairs of a pass, with pairs outside the
// assembly's domain among them (u1 subnormal, 1 or 0; u2 1 or negative).
func TestBoxMullerIsTheDefinition(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	u1, u2 := pairs(r, 1<<20)
	want1, want2 := make([]float64, len(u1)), make([]float64, len(u1))
	boxMullerGeneric(u1, u2, want1, want2)
	simd.AtEachLevel(t, &level, levels, func(t *testing.T) {
		c, s := make([]float64, len(u1)), make([]float64, len(u1))
		BoxMuller(u1, u2, c, s)
		for k := range u1 {
			if math.Float64bits(c[k]) != math.Float64bits(want1[k]) || math.Float64bits(s[k]) != math.Float64bits(want2[k]) {
				t.Fatalf("pair %d (u1 %v = %#x, u2 %v = %#x): %v, %v; want %v, %v", k, u1[k], math.Float64bits(u1[k]),
					u2[k], math.Float64bits(u2[k]), c[k], s[k], want1[k], want2[k])
			}
		}
		for n := 0; n < 13; n++ {
			a, b := append([]float64(nil), u1[:n]...), append([]float64(nil), u2[:n]...)
			if n > 5 {
				a[5], b[2] = 0x1p-1030, 1 // outside the domain: the definition's
			}
			c, s, wc, ws := make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
			BoxMuller(a, b, c, s)
			boxMullerGeneric(a, b, wc, ws)
			for k := range a {
				if math.Float64bits(c[k]) != math.Float64bits(wc[k]) || math.Float64bits(s[k]) != math.Float64bits(ws[k]) {
					t.Fatalf("length %d: pair %d is %v, %v; want %v, %v", n, k, c[k], s[k], wc[k], ws[k])
				}
			}
		}
	})
}

func BenchmarkBoxMuller(b *testing.B) {
	u1, u2 := pairs(rand.New(rand.NewPCG(1, 2)), 4096)
	c, s := make([]float64, len(u1)), make([]float64, len(u1))
	simd.AtEachLevel(b, &level, levels, func(b *testing.B) {
		for b.Loop() {
			BoxMuller(u1, u2, c, s)
		}
	})
}
