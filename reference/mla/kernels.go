package mla

// The inner loops of the decode, each defined by the one-row reference loop
// in its comment (the arithmetic the package doc describes) and written
// blocked: several output rows or tokens per pass, so that each value
// loaded serves several products. Blocking changes which products are
// computed together, never the operations or their order on any one output
// element, so every result is bit-identical to the reference loop's.
// Products are written float64(x*y) so that no compiler fuses them with the
// following addition (Go may fuse x*y + z; the conversion forbids it).

// qpack is a unit's query rows, packed once per unit.
type qpack struct {
	n      int       // rows
	stride int       // row stride of a score block: n rounded up to qLanes
	rows   []float64 // [n][D], row-major
	t      []float64 // [D][stride], transposed and zero-padded (when qLanes > 1)
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
	for r := 0; r < p.n; r++ {
		for i, v := range p.rows[r*d : (r+1)*d] {
			p.t[i*p.stride+r] = v
		}
	}
}

// dot64 is the Exact score: q·k in float64 with four partial sums, by d mod
// 4, the tail in the first, combined as (s0+s1)+(s2+s3).
//
//	for d := 0; d+4 <= D; d += 4 { s0 += q[d]*k[d]; s1 += q[d+1]*k[d+1]; s2 += ...; s3 += ... }
//	for ; d < D; d++ { s0 += q[d]*k[d] }
//	return (s0+s1) + (s2+s3)
func dot64(q, k []float64) float64 {
	k = k[:len(q)]
	var s0, s1, s2, s3 float64
	d := 0
	for ; d+4 <= len(q); d += 4 {
		s0 += float64(q[d] * k[d])
		s1 += float64(q[d+1] * k[d+1])
		s2 += float64(q[d+2] * k[d+2])
		s3 += float64(q[d+3] * k[d+3])
	}
	for ; d < len(q); d++ {
		s0 += float64(q[d] * k[d])
	}
	return (s0 + s1) + (s2 + s3)
}

// dot64x2 is dot64 of q against two rows at once.
func dot64x2(q, k, m []float64) (float64, float64) {
	k, m = k[:len(q)], m[:len(q)]
	var s0, s1, s2, s3, t0, t1, t2, t3 float64
	d := 0
	for ; d+4 <= len(q); d += 4 {
		q0, q1, q2, q3 := q[d], q[d+1], q[d+2], q[d+3]
		s0 += float64(q0 * k[d])
		s1 += float64(q1 * k[d+1])
		s2 += float64(q2 * k[d+2])
		s3 += float64(q3 * k[d+3])
		t0 += float64(q0 * m[d])
		t1 += float64(q1 * m[d+1])
		t2 += float64(q2 * m[d+2])
		t3 += float64(q3 * m[d+3])
	}
	for ; d < len(q); d++ {
		s0 += float64(q[d] * k[d])
		t0 += float64(q[d] * m[d])
	}
	return (s0 + s1) + (s2 + s3), (t0 + t1) + (t2 + t3)
}

// dotAcc is the Expected score: q·k as an MMA accumulates it, k-blocks of
// MMAK products (even and odd positions summed separately in float64, the
// odd tail position in the even sum) added to an accumulator rounded to m.
//
//	for each block [d0, d1): s0 = Σ q[d]k[d] (d-d0 even), s1 = Σ (d-d0 odd), in d order
//	                         acc = round_m(acc + (s0+s1))
func dotAcc(q, k []float64, m rmode) float64 {
	k = k[:len(q)]
	acc := 0.0
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
		acc = m.round(acc + (s0 + s1))
	}
	return acc
}

// dotAccx2 is dotAcc of q against two rows at once.
func dotAccx2(q, k, n []float64, m rmode) (float64, float64) {
	k, n = k[:len(q)], n[:len(q)]
	var acc, bcc float64
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
		acc = m.round(acc + (s0 + s1))
		bcc = m.round(bcc + (t0 + t1))
	}
	return acc, bcc
}

// scoresExactGeneric sets s[j*stride + r] = dot64(q_r, k_j) for the nj
// rows k_j = k[j*D:(j+1)*D] and every query row r.
func scoresExactGeneric(p *qpack, k []float64, d, nj int, s []float64) {
	j := 0
	for ; j+2 <= nj; j += 2 {
		k0, k1 := k[j*d:(j+1)*d], k[(j+1)*d:(j+2)*d]
		for r := 0; r < p.n; r++ {
			s[j*p.stride+r], s[(j+1)*p.stride+r] = dot64x2(p.rows[r*d:(r+1)*d], k0, k1)
		}
	}
	if j < nj {
		for r := 0; r < p.n; r++ {
			s[j*p.stride+r] = dot64(p.rows[r*d:(r+1)*d], k[j*d:(j+1)*d])
		}
	}
}

// scoresExpectedGeneric sets s[j*stride + r] = dotAcc(q_r, k_j, m).
func scoresExpectedGeneric(p *qpack, k []float64, d, nj int, s []float64, m rmode) {
	j := 0
	for ; j+2 <= nj; j += 2 {
		k0, k1 := k[j*d:(j+1)*d], k[(j+1)*d:(j+2)*d]
		for r := 0; r < p.n; r++ {
			s[j*p.stride+r], s[(j+1)*p.stride+r] = dotAccx2(p.rows[r*d:(r+1)*d], k0, k1, m)
		}
	}
	if j < nj {
		for r := 0; r < p.n; r++ {
			s[j*p.stride+r] = dotAcc(p.rows[r*d:(r+1)*d], k[j*d:(j+1)*d], m)
		}
	}
}

// pvExact1 is the Exact PV update of one row over len(p) tokens:
//
//	for j := range p { for l := range acc { acc[l] += p[j] * v[j*D+l] } }
func pvExact1(acc, p, v []float64, d int) {
	for j, pj := range p {
		x := v[j*d : j*d+len(acc)]
		for l := range acc {
			acc[l] += float64(pj * x[l])
		}
	}
}

// pvExact2 is pvExact1 for two rows over the same tokens, four columns at a
// time held in registers across the token loop.
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
			a0 += float64(pa * x[0])
			a1 += float64(pa * x[1])
			a2 += float64(pa * x[2])
			a3 += float64(pa * x[3])
			b0 += float64(pb * x[0])
			b1 += float64(pb * x[1])
			b2 += float64(pb * x[2])
			b3 += float64(pb * x[3])
		}
		acc0[l], acc0[l+1], acc0[l+2], acc0[l+3] = a0, a1, a2, a3
		acc1[l], acc1[l+1], acc1[l+2], acc1[l+3] = b0, b1, b2, b3
	}
	for ; l < n; l++ {
		a, b := acc0[l], acc1[l]
		for j, pa := range p0 {
			a += float64(pa * v[j*d+l])
			b += float64(p1[j] * v[j*d+l])
		}
		acc0[l], acc1[l] = a, b
	}
}

// pvExpected1 is the Expected PV update of one row (package doc, step 5):
// P already rounded, accumulated in Acc one token at a time:
//
//	for j := range p { for l := range acc { acc[l] = round_m(acc[l] + p[j]*v[j*D+l]) } }
func pvExpected1(acc, p, v []float64, d int, m rmode) {
	if m == r64 {
		pvExact1(acc, p, v, d)
		return
	}
	for j, pj := range p {
		x := v[j*d : j*d+len(acc)]
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

// pvExpected2 is pvExpected1 for two rows over the same tokens.
func pvExpected2Generic(acc0, acc1, p0, p1, v []float64, d int, m rmode) {
	if m != r32 {
		if m == r64 {
			pvExact2Generic(acc0, acc1, p0, p1, v, d)
			return
		}
		pvExpected1(acc0, p0, v, d, m)
		pvExpected1(acc1, p1, v, d, m)
		return
	}
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
			a0 = float64(float32(a0 + float64(pa*x[0])))
			a1 = float64(float32(a1 + float64(pa*x[1])))
			a2 = float64(float32(a2 + float64(pa*x[2])))
			a3 = float64(float32(a3 + float64(pa*x[3])))
			b0 = float64(float32(b0 + float64(pb*x[0])))
			b1 = float64(float32(b1 + float64(pb*x[1])))
			b2 = float64(float32(b2 + float64(pb*x[2])))
			b3 = float64(float32(b3 + float64(pb*x[3])))
		}
		acc0[l], acc0[l+1], acc0[l+2], acc0[l+3] = a0, a1, a2, a3
		acc1[l], acc1[l+1], acc1[l+2], acc1[l+3] = b0, b1, b2, b3
	}
	for ; l < n; l++ {
		a, b := acc0[l], acc1[l]
		for j, pa := range p0 {
			a = float64(float32(a + float64(pa*v[j*d+l])))
			b = float64(float32(b + float64(p1[j]*v[j*d+l])))
		}
		acc0[l], acc1[l] = a, b
	}
}

// pvExpected32x2Generic is the fp32 PV update of two rows over values v
// [tokens][l] (see worker.pvExpected32 for when it equals pvExpected2):
//
//	for j := range p0 { for i := range acc0 { acc0[i] += float32(p0[j]) * v[j*l+i]; acc1[i] += ... } }
func pvExpected32x2Generic(acc0, acc1 []float32, p0, p1 []float64, v []float32, l int) {
	acc0, acc1 = acc0[:l], acc1[:l]
	for j := range p0 {
		pa, pb := float32(p0[j]), float32(p1[j])
		x := v[j*l : (j+1)*l]
		for i, xv := range x {
			acc0[i] = float32(acc0[i] + float32(pa*xv))
			acc1[i] = float32(acc1[i] + float32(pb*xv))
		}
	}
}
