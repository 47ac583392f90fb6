// Package normal holds Box-Muller's transform of uniform pairs into
// standard normal pairs, the catalog generators' one source of normal
// variates (internal/kernel's RNG): rad = √(-2·ln u1), (rad·cos 2πu2,
// rad·sin 2πu2), with Go's own math.Log, math.Sqrt and math.Sincos, so
// that every fixture keeps its bits. On amd64 with AVX2 it runs in
// assembly, four pairs a pass, each lane making the operations Go's
// math.Log (log_amd64.s) and math.Sincos (sin.go, compiled without fused
// multiply-adds) make, in their order.
package normal

import "math"

// BoxMuller sets c[k] and s[k], for every k < len(u1), to
//
//	rad := math.Sqrt(-2 * math.Log(u1[k]))
//	sin, cos := math.Sincos(2 * math.Pi * u2[k])
//	c[k], s[k] = rad*cos, rad*sin
//
// bit for bit. u2, c and s are at least as long as u1.
func BoxMuller(u1, u2, c, s []float64) {
	n := len(u1)
	u2, c, s = u2[:n], c[:n], s[:n]
	k := 0
	if useAsm() {
		// The assembly covers the uniforms' domain, u1 a normal number in
		// (0, 1) and u2 in [0, 1): any other value is left to the
		// definition.
		for k+4 <= n {
			m := k
			for m+4 <= n && inDomain(u1[m:m+4], u2[m:m+4]) {
				m += 4
			}
			if m > k {
				boxMullerAVX2(&u1[k], &u2[k], &c[k], &s[k], m-k)
				k = m
				continue
			}
			boxMullerGeneric(u1[k:k+4], u2[k:k+4], c[k:k+4], s[k:k+4])
			k += 4
		}
	}
	boxMullerGeneric(u1[k:], u2[k:], c[k:], s[k:])
}

// boxMullerGeneric is BoxMuller's definition.
func boxMullerGeneric(u1, u2, c, s []float64) {
	for k, a := range u1 {
		rad := math.Sqrt(-2 * math.Log(a))
		sin, cos := math.Sincos(2 * math.Pi * u2[k])
		c[k], s[k] = rad*cos, rad*sin
	}
}

// inDomain reports whether the assembly covers the pairs of u1 and u2:
// u1 a normal number in (0, 1), u2 in [0, 1).
func inDomain(u1, u2 []float64) bool {
	for k, a := range u1 {
		if !(a >= 0x1p-1022 && a < 1) || !(u2[k] >= 0 && u2[k] < 1) {
			return false
		}
	}
	return true
}
