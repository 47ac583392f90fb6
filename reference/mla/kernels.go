package mla

import (
	"math"

	"github.com/kcheck-dev/kcheck/reference/splitk"
)

// The inner loops of the decode. Each is defined by a one-row loop written
// out in its comment (the arithmetic the package doc describes) and
// implemented twice: a plain-Go version here (the definition, blocked only
// so that each value loaded serves several products) and, on amd64 with
// AVX-512, an assembly version (kernels_amd64.s) that computes sixteen query
// rows or 8-16 latent columns a vector. Both perform the same scalar
// operations in the same order on every output element, so results are
// bit-identical whichever runs; kernels_test.go checks it. A product and its
// addition are fused (one rounding) only where the definition says so
// (math.FMA), or where the product is exact so that fusing changes nothing;
// elsewhere products are written float64(x*y) so that no compiler fuses
// them with the following addition (Go may fuse x*y + z; the conversion
// forbids it).

// qpack is a unit's query rows, packed once per unit.
type qpack struct {
	n      int       // rows
	stride int       // row stride of a score block: n rounded up to qLanes
	rows   []float64 // [n][D], row-major
	t      []float64 // [D][stride], transposed and zero-padded (when qLanes > 1), or [stride/group][D][group]
	group  int       // 0, or the lanes of t's groups when it is laid out group by group
}

func (p *qpack) pack(q []float64, rows []rowSpec, d int) {
	p.n = len(rows)
	p.stride = (p.n + qLanes - 1) / qLanes * qLanes
	if cap(p.rows) < p.n*d {
		p.rows = make([]float64, p.n*d)
	}
	p.rows = p.rows[:p.n*d]
	for r, rs := range rows {
		copy(p.rows[r*d:(r+1)*d], q[rs.q:rs.q+d])
	}
	if qLanes == 1 {
		return
	}
	if cap(p.t) < d*p.stride {
		p.t = make([]float64, d*p.stride)
	}
	p.t = p.t[:d*p.stride]
	clear(p.t)
	p.group = qtGroup()
	for r := 0; r < p.n; r++ {
		for i, v := range p.rows[r*d : (r+1)*d] {
			if p.group == 0 {
				p.t[i*p.stride+r] = v
			} else {
				p.t[(r/p.group*d+i)*p.group+r%p.group] = v
			}
		}
	}
}

// blockDot is one score, both answers, from the same products: q·k in
// k-blocks of MMAK products as a tensor-core MMA accumulates them (even and
// odd positions of the block summed separately in float64, the odd tail
// position in the even sum), each block sum added to Exact in float64 and to
// Expected's accumulator with one rounding to m:
//
//	for each block [d0, d1): s0 = Σ q[d]k[d] (d-d0 even), s1 = Σ (d-d0 odd), in d order
//	                         b = s0 + s1;  exact = exact + b;  expected = round_m(expected + b)
//
// Exact's order is a choice (any fixed one is a float64 dot product); this
// one shares every product with Expected, so each is formed and added once.
func blockDot(q, k []float64, m rmode) (exact, expected float64) {
	k = k[:len(q)]
	for d0 := 0; d0 < len(q); d0 += MMAK {
		d1 := min(d0+MMAK, len(q))
		var s0, s1 float64
		d := d0
		for ; d+2 <= d1; d += 2 {
			s0 += float64(q[d] * k[d])
			s1 += float64(q[d+1] * k[d+1])
		}
		if d < d1 {
			s0 += float64(q[d] * k[d])
		}
		b := s0 + s1
		exact += b
		expected = m.round(expected + b)
	}
	return exact, expected
}

// blockDotx2 is blockDot of q against two rows at once.
func blockDotx2(q, k, n []float64, m rmode) (ek, xk, en, xn float64) {
	k, n = k[:len(q)], n[:len(q)]
	for d0 := 0; d0 < len(q); d0 += MMAK {
		d1 := min(d0+MMAK, len(q))
		var s0, s1, t0, t1 float64
		d := d0
		for ; d+2 <= d1; d += 2 {
			q0, q1 := q[d], q[d+1]
			s0 += float64(q0 * k[d])
			s1 += float64(q1 * k[d+1])
			t0 += float64(q0 * n[d])
			t1 += float64(q1 * n[d+1])
		}
		if d < d1 {
			s0 += float64(q[d] * k[d])
			t0 += float64(q[d] * n[d])
		}
		b, c := s0+s1, t0+t1
		ek, en = ek+b, en+c
		xk, xn = m.round(xk+b), m.round(xn+c)
	}
	return ek, xk, en, xn
}

// scoresGeneric sets sx[j*stride + r], sr[j*stride + r] = blockDot(q_r, k_j, m)
// for the nj rows k_j = k[j*D:(j+1)*D] and every query row r.
func scoresGeneric(p *qpack, k []float64, d, nj int, sx, sr []float64, m rmode) {
	j := 0
	for ; j+2 <= nj; j += 2 {
		k0, k1 := k[j*d:(j+1)*d], k[(j+1)*d:(j+2)*d]
		for r := 0; r < p.n; r++ {
			a, b, c, e := blockDotx2(p.rows[r*d:(r+1)*d], k0, k1, m)
			sx[j*p.stride+r], sr[j*p.stride+r] = a, b
			sx[(j+1)*p.stride+r], sr[(j+1)*p.stride+r] = c, e
		}
	}
	if j < nj {
		for r := 0; r < p.n; r++ {
			sx[j*p.stride+r], sr[j*p.stride+r] = blockDot(p.rows[r*d:(r+1)*d], k[j*d:(j+1)*d], m)
		}
	}
}

// pvExact1 is the Exact PV update of one row over len(p) tokens, each
// product added with one rounding (more accurate than two, and what the
// assembly does in one instruction):
//
//	for j := range p { for l := range acc { acc[l] = fma(p[j], v[j*D+l], acc[l]) } }
func pvExact1(acc, p, v []float64, d int) {
	for j, pj := range p {
		x := v[j*d : j*d+len(acc)]
		for l := range acc {
			acc[l] = math.FMA(pj, x[l], acc[l])
		}
	}
}

// pvExact2Generic is pvExact1 for two rows over the same tokens, four
// columns at a time held in registers across the token loop.
func pvExact2Generic(acc0, acc1, p0, p1, v []float64, d int) {
	n := len(acc0)
	acc1 = acc1[:n]
	p1 = p1[:len(p0)]
	l := 0
	for ; l+4 <= n; l += 4 {
		a0, a1, a2, a3 := acc0[l], acc0[l+1], acc0[l+2], acc0[l+3]
		b0, b1, b2, b3 := acc1[l], acc1[l+1], acc1[l+2], acc1[l+3]
		for j, pa := range p0 {
			pb := p1[j]
			x := v[j*d+l : j*d+l+4]
			a0 = math.FMA(pa, x[0], a0)
			a1 = math.FMA(pa, x[1], a1)
			a2 = math.FMA(pa, x[2], a2)
			a3 = math.FMA(pa, x[3], a3)
			b0 = math.FMA(pb, x[0], b0)
			b1 = math.FMA(pb, x[1], b1)
			b2 = math.FMA(pb, x[2], b2)
			b3 = math.FMA(pb, x[3], b3)
		}
		acc0[l], acc0[l+1], acc0[l+2], acc0[l+3] = a0, a1, a2, a3
		acc1[l], acc1[l+1], acc1[l+2], acc1[l+3] = b0, b1, b2, b3
	}
	for ; l < n; l++ {
		a, b := acc0[l], acc1[l]
		for j, pa := range p0 {
			a = math.FMA(pa, v[j*d+l], a)
			b = math.FMA(p1[j], v[j*d+l], b)
		}
		acc0[l], acc1[l] = a, b
	}
}

// pvExactGeneric is pvExact1 for rows rows over nj tokens: row r's
// accumulator is acc[r*accStride:][:l] and its probabilities
// p[r*pStride:][:nj].
func pvExactGeneric(acc []float64, accStride int, p []float64, pStride int, v []float64, d, nj, l, rows int) {
	r := 0
	for ; r+2 <= rows; r += 2 {
		pvExact2Generic(acc[r*accStride:r*accStride+l], acc[(r+1)*accStride:(r+1)*accStride+l],
			p[r*pStride:r*pStride+nj], p[(r+1)*pStride:(r+1)*pStride+nj], v, d)
	}
	if r < rows {
		pvExact1(acc[r*accStride:r*accStride+l], p[r*pStride:r*pStride+nj], v, d)
	}
}

// pvExpected1 is the Expected PV update of one row (package doc, step 5):
// P already rounded, accumulated in Acc one token at a time:
//
//	for j := range p { for l := range acc { acc[l] = round_m(acc[l] + p[j]*v[j*D+l]) } }
func pvExpected1(acc, p, v []float64, d int, m rmode) {
	for j, pj := range p {
		x := v[j*d : j*d+len(acc)]
		if m == r64 {
			for l := range acc {
				acc[l] += float64(pj * x[l])
			}
			continue
		}
		if m == r32 {
			for l := range acc {
				acc[l] = float64(float32(acc[l] + float64(pj*x[l])))
			}
			continue
		}
		for l := range acc {
			acc[l] = m.round(acc[l] + float64(pj*x[l]))
		}
	}
}

// pvExpected32Generic is the fp32 PV update of rows rows over values v
// [tokens][l] (see worker.pvExpected32 for when it equals pvExpected1): row
// r's accumulator is acc[r*accStride:][:l] and its probabilities
// p[r*pStride:][:nj].
//
//	for j := 0; j < nj; j++ { for i := range acc_r { acc_r[i] += p_r[j] * v[j*l+i] } }
func pvExpected32Generic(acc []float32, accStride int, p []float32, pStride int, v []float32, nj, l, rows int) {
	for r := 0; r < rows; r++ {
		a, pr := acc[r*accStride:r*accStride+l], p[r*pStride:r*pStride+nj]
		for j, pj := range pr {
			x := v[j*l : (j+1)*l]
			for i, xv := range x {
				a[i] = float32(a[i] + float32(pj*xv))
			}
		}
	}
}

// narrowGeneric sets dst[i] = float32(src[i]) and returns the smallest of lo
// and the nonzero magnitudes |src[i]| (NaN never is).
func narrowGeneric(dst []float32, src []float64, lo float64) float64 {
	dst = dst[:len(src)]
	for i, x := range src {
		dst[i] = float32(x)
		if a := math.Abs(x); a < lo && a != 0 {
			lo = a
		}
	}
	return lo
}

// widenF32Generic sets dst[i] = float64(src[i]).
func widenF32Generic(dst []float64, src []float32) {
	dst = dst[:len(src)]
	for i, x := range src {
		dst[i] = float64(x)
	}
}

// expDef is Exact's e^x, the softmax's exp (its arguments are differences
// from a running maximum, so x <= 0; larger x work up to 709, past which it
// returns +Inf). It is written out rather than taken from math.Exp so that
// the assembly can compute eight at once with the same operations: x =
// n·ln2 + r with |r| <= ln2/2 (n by rounding x·log2e, r by two fused
// multiply-adds against ln2 split in two), e^r by its degree-13 Taylor
// polynomial (truncation below 2^-57 relative) in fused Horner steps, and
// 2^n put into the exponent bits. Within 2 ulp of e^x (TestExpDef). Below
// -708 it returns 0 instead of a subnormal: such terms are under 2^-1021 of
// a softmax sum that is at least 1.
func expDef(x float64) float64 {
	if x > 709 {
		return math.Inf(1)
	}
	if x < -708 {
		return 0
	}
	t := float64(x*math.Log2E) + expMagic
	n := t - expMagic
	r := math.FMA(-n, expLn2Hi, x)
	r = math.FMA(-n, expLn2Lo, r)
	p := expTaylor[0]
	for _, c := range expTaylor[1:] {
		p = math.FMA(p, r, c)
	}
	return p * math.Float64frombits(math.Float64bits(t)<<52+1023<<52)
}

const (
	expMagic = 0x1.8p52 // adding it rounds to an integer, ties to even, held in the low bits
	expLn2Hi = 0x1.62e42fefa39efp-1
	expLn2Lo = 0x1.abc9e3b39803fp-56
)

// expTaylor are 1/k! for k = 13 down to 0 (the assembly reads them from
// here too).
var expTaylor = [14]float64{1.0 / 6227020800, 1.0 / 479001600, 1.0 / 39916800, 1.0 / 3628800, 1.0 / 362880,
	1.0 / 40320, 1.0 / 5040, 1.0 / 720, 1.0 / 120, 1.0 / 24, 1.0 / 6, 1.0 / 2, 1, 1}

// expVecGeneric sets dst[i] = expDef(src[i]).
func expVecGeneric(dst, src []float64) {
	dst = dst[:len(src)]
	for i, x := range src {
		dst[i] = expDef(x)
	}
}

// exp2fVecGeneric sets dst[i] to Expected's exp2f(src[i]): the argument
// rounded to fp32, then splitk.Exp2F32.
func exp2fVecGeneric(dst, src []float64) {
	dst = dst[:len(src)]
	for i, x := range src {
		dst[i] = float64(splitk.Exp2F32(float32(x)))
	}
}
