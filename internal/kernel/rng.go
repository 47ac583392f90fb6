package kernel

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/kcheck-dev/kcheck/reference/normal"
)

// RNG is a seeded generator whose sequence is fixed by its own code (PCG's
// published algorithm, Box-Muller for normals), not by the standard
// library's choice of distribution algorithms, so fixtures regenerate
// bit-identically under any Go release.
type RNG struct {
	src   *rand.PCG
	spare float64
	has   bool
}

// NewRNG returns the generator of seed and stream.
func NewRNG(seed uint64, stream uint64) *RNG {
	return &RNG{src: rand.NewPCG(seed, 0x9E3779B97F4A7C15^stream)}
}

// Uniform returns a float64 in [0, 1) from the top 53 bits.
func (r *RNG) Uniform() float64 { return float64(r.src.Uint64()>>11) * 0x1p-53 }

// Intn returns an int in [0, n).
func (r *RNG) Intn(n int) int { return int(r.src.Uint64() % uint64(n)) }

// Normal returns a standard normal variate.
func (r *RNG) Normal() float64 {
	if r.has {
		r.has = false
		return r.spare
	}
	u1 := r.Uniform()
	for u1 == 0 {
		u1 = r.Uniform()
	}
	u2 := r.Uniform()
	rad := math.Sqrt(-2 * math.Log(u1))
	// Sincos shares Sin's and Cos's reduction and polynomials, so it gives
	// their bits (rng_test.go), at most of the cost of one of them: the
	// drawn values are pinned by the fixtures' checksums
	sin, cos := math.Sincos(2 * math.Pi * u2)
	r.spare, r.has = rad*sin, true
	return rad * cos
}

// Normals fills dst with what len(dst) calls of Normal return, in order,
// leaving the generator where they would: its uniforms are drawn in
// Normal's order and transformed a batch at a time (normal.BoxMuller:
// the same bits, four pairs a pass in AVX2), which is what the catalog's
// generators spent a fifth of a run on one value at a time.
func (r *RNG) Normals(dst []float64) {
	k := 0
	if r.has && len(dst) > 0 {
		dst[0], r.has = r.spare, false
		k = 1
	}
	const batch = 256
	var u1, u2, c, s [batch]float64
	for k+1 < len(dst) {
		n := min(batch, (len(dst)-k)/2)
		for p := 0; p < n; p++ {
			a := r.Uniform()
			for a == 0 {
				a = r.Uniform()
			}
			u1[p], u2[p] = a, r.Uniform()
		}
		normal.BoxMuller(u1[:n], u2[:n], c[:n], s[:n])
		for p := 0; p < n; p++ {
			dst[k], dst[k+1] = c[p], s[p]
			k += 2
		}
	}
	if k < len(dst) {
		dst[k] = r.Normal() // and its pair's second value kept for the next
	}
}

// Perm returns a permutation of [0, n) (Fisher-Yates).
func (r *RNG) Perm(n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	for i := n - 1; i > 0; i-- {
		j := r.Intn(i + 1)
		p[i], p[j] = p[j], p[i]
	}
	return p
}

// Uint64 returns 64 random bits.
func (r *RNG) Uint64() uint64 { return r.src.Uint64() }

// State is the generator's whole state, for a key or a Restore: what it
// will draw from here on is a function of it alone.
func (r *RNG) State() []byte {
	b, err := r.src.MarshalBinary()
	if err != nil {
		panic("kernel: PCG state: " + err.Error()) // PCG's marshaling cannot fail
	}
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(r.spare))
	if r.has {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	return b
}

// Restore sets the generator to a State it had.
func (r *RNG) Restore(state []byte) error {
	n := len(state) - 9
	if n < 0 {
		return fmt.Errorf("RNG state of %d bytes", len(state))
	}
	if err := r.src.UnmarshalBinary(state[:n]); err != nil {
		return err
	}
	r.spare = math.Float64frombits(binary.LittleEndian.Uint64(state[n:]))
	r.has = state[n+8] == 1
	return nil
}
