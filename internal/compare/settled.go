package compare

import (
	"encoding/binary"
	"math"
)

// The arithmetic of settled runs: runs of elements whose exact and
// expected values are the same codes (kernel.Settler), read from the codes
// themselves. Each function here makes the additions the passes make over
// values, element by element in index order, so the sums keep their bits;
// what it saves is the decoding, the per-element tests and the table reads.

// The exponent fields of four BF16 and of four F16 codes in a 64-bit word:
// a code whose field is all ones is an infinity or a NaN.
const (
	bf16Exponent = 0x7F807F807F807F80
	f16Exponent  = 0x7C007C007C007C00
)

// finite16 reports whether every 16-bit code in b (little-endian) has an
// exponent field, as exp masks it, that is not all ones: whether a BF16
// (bf16Exponent) or F16 (f16Exponent) run holds no infinity and no NaN.
// Four codes a word: adding 0x8000 less the field's mask to each lane's
// field reaches the lane's top bit, which no field reaches otherwise and
// no lane carries out of, exactly where the field is all ones; four words
// are tested at once.
func finite16(b []byte, exp uint64) bool {
	const top = 0x8000800080008000
	add := top - exp
	k := 0
	for ; k+32 <= len(b); k += 32 {
		q := b[k : k+32]
		w0 := binary.LittleEndian.Uint64(q)&exp + add
		w1 := binary.LittleEndian.Uint64(q[8:])&exp + add
		w2 := binary.LittleEndian.Uint64(q[16:])&exp + add
		w3 := binary.LittleEndian.Uint64(q[24:])&exp + add
		if (w0|w1|w2|w3)&top != 0 {
			return false
		}
	}
	for ; k+8 <= len(b); k += 8 {
		if (binary.LittleEndian.Uint64(b[k:])&exp+add)&top != 0 {
			return false
		}
	}
	for ; k+1 < len(b); k += 2 {
		if e := uint16(exp); binary.LittleEndian.Uint16(b[k:])&e == e {
			return false
		}
	}
	return true
}

// bf16At is the value of the BF16 code at byte k of b, as
// tensor.Float64At and codeValues decode it.
func bf16At(b []byte, k int) float64 {
	return float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[k:])) << 16))
}

// bf16Quad is the values of the four BF16 codes in w, a little-endian
// word of them: bf16At's four, from one load.
func bf16Quad(w uint64) (x0, x1, x2, x3 float64) {
	lo, hi := uint32(w), uint32(w>>32)
	return float64(math.Float32frombits(lo << 16)), float64(math.Float32frombits(lo &^ 0xFFFF)),
		float64(math.Float32frombits(hi << 16)), float64(math.Float32frombits(hi &^ 0xFFFF))
}

// bf16Squares adds the square of every value of b, a finite BF16 run
// (finite16), to x2 and e2 and, where row is set, to rx, one element at a
// time in index order: ThreeWay.Bounds' first pass over elements whose
// floor is 0. Where x2 and e2 hold the same bits, which the same additions
// keep, one sum serves both.
func bf16Squares(b []byte, row bool, rx, x2, e2 float64) (float64, float64, float64) {
	b = b[:len(b)&^1]
	if math.Float64bits(x2) != math.Float64bits(e2) {
		for k := 0; k < len(b); k += 2 {
			x := bf16At(b, k)
			if row {
				rx += x * x
			}
			x2 += x * x
			e2 += x * x
		}
		return rx, x2, e2
	}
	k := 0
	if row {
		for ; k+8 <= len(b); k += 8 {
			v0, v1, v2, v3 := bf16Quad(binary.LittleEndian.Uint64(b[k:]))
			rx += v0 * v0
			x2 += v0 * v0
			rx += v1 * v1
			x2 += v1 * v1
			rx += v2 * v2
			x2 += v2 * v2
			rx += v3 * v3
			x2 += v3 * v3
		}
	} else {
		for ; k+8 <= len(b); k += 8 {
			v0, v1, v2, v3 := bf16Quad(binary.LittleEndian.Uint64(b[k:]))
			x2 += v0 * v0
			x2 += v1 * v1
			x2 += v2 * v2
			x2 += v3 * v3
		}
	}
	for ; k < len(b); k += 2 {
		x := bf16At(b, k)
		if row {
			rx += x * x
		}
		x2 += x * x
	}
	return rx, x2, x2
}

// bf16TolSquares adds, for every value x of b, a finite BF16 run within
// one row whose rms of exact is rowRMS, the squares of its ulp and of its
// γ·mag term, g·max(|x|, rowRMS), to ulp2 and acc2 in index order:
// ThreeWay.Bounds' second pass over elements whose floor is 0. The max of
// two non-negative numbers, neither NaN, is the max of their bits, which
// the compiler makes a conditional move where the float max is a branch.
func bf16TolSquares(b []byte, ulps *spacingTable, g, rowRMS, ulp2, acc2 float64) (float64, float64) {
	b = b[:len(b)&^1]
	rb := math.Float64bits(rowRMS)
	if math.IsNaN(rowRMS) || rb>>63 != 0 {
		for k := 0; k < len(b); k += 2 {
			x := bf16At(b, k)
			ulp := ulps.at(x)
			am := g * max(math.Abs(x), rowRMS)
			ulp2 += ulp * ulp
			acc2 += am * am
		}
		return ulp2, acc2
	}
	const abs = 1<<63 - 1
	k := 0
	for ; k+8 <= len(b); k += 8 {
		v0, v1, v2, v3 := bf16Quad(binary.LittleEndian.Uint64(b[k:]))
		a0, a1 := math.Float64bits(v0)&abs, math.Float64bits(v1)&abs
		a2, a3 := math.Float64bits(v2)&abs, math.Float64bits(v3)&abs
		u0, u1, u2, u3 := ulps[a0>>52], ulps[a1>>52], ulps[a2>>52], ulps[a3>>52]
		m0, m1 := g*math.Float64frombits(max(a0, rb)), g*math.Float64frombits(max(a1, rb))
		m2, m3 := g*math.Float64frombits(max(a2, rb)), g*math.Float64frombits(max(a3, rb))
		ulp2 += u0 * u0
		acc2 += m0 * m0
		ulp2 += u1 * u1
		acc2 += m1 * m1
		ulp2 += u2 * u2
		acc2 += m2 * m2
		ulp2 += u3 * u3
		acc2 += m3 * m3
	}
	for ; k < len(b); k += 2 {
		ax := math.Float64bits(bf16At(b, k)) & abs
		ulp := ulps[ax>>52]
		am := g * math.Float64frombits(max(ax, rb))
		ulp2 += ulp * ulp
		acc2 += am * am
	}
	return ulp2, acc2
}

// spacingTable is a dtype's spacing (spacingOf) by the float64 exponent
// field of |x|, NaN read as 0: the spacing of a finite x depends on its
// exponent field alone (a normal |x| at or above the dtype's smallest
// normal, a power of two, by its exponent; every smaller one, the float64
// subnormals and zero among them, has the subnormal spacing), so one
// lookup in 16 KB stands for the spacing's branches and bit arithmetic.
type spacingTable [1 << 11]float64

func newSpacingTable(spacing func(float64) float64) (t spacingTable) {
	for e := range t {
		if e == 0x7FF {
			continue // infinities and NaN: at is never asked for them
		}
		if u := spacing(math.Float64frombits(uint64(e) << 52)); !math.IsNaN(u) {
			t[e] = u
		}
	}
	return t
}

// at is the spacing at finite x, 0 where spacingOf gives NaN.
func (t *spacingTable) at(x float64) float64 { return t[math.Float64bits(x)>>52&0x7FF] }
