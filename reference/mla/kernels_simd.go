//go:build goexperiment.simd && amd64

package mla

import "simd/archsimd"

// With the simd experiment (GOEXPERIMENT=simd) and AVX-512, the scores are
// computed eight query rows at a time, one row a vector lane, and the PV
// products eight latent columns at a time. Each lane performs exactly the
// scalar operations of the reference loops (dot64, dotAcc, pvExact1,
// pvExpected1) in the same order, as separate multiplies and adds (no fused
// multiply-add), so the results are bit-identical to the plain-Go twin in
// kernels_generic.go.

const qLanes = 8

var useAVX512 = archsimd.X86.AVX512()

func scoresExact(p *qpack, k []float64, d, nj int, s []float64) {
	if !useAVX512 {
		scoresExactGeneric(p, k, d, nj, s)
		return
	}
	for g := 0; g < p.stride; g += 8 {
		j := 0
		for ; j+2 <= nj; j += 2 {
			k0, k1 := k[j*d:(j+1)*d], k[(j+1)*d:(j+2)*d]
			var a0, a1, a2, a3, b0, b1, b2, b3 archsimd.Float64x8
			i := 0
			for ; i+4 <= d; i += 4 {
				// one query vector live at a time: Go gives vectors 16
				// registers and eight hold the sums
				qt := p.t[i*p.stride+g : (i+3)*p.stride+g+8]
				q := archsimd.LoadFloat64x8Slice(qt)
				a0 = a0.Add(q.Mul(archsimd.BroadcastFloat64x8(k0[i])))
				b0 = b0.Add(q.Mul(archsimd.BroadcastFloat64x8(k1[i])))
				q = archsimd.LoadFloat64x8Slice(qt[p.stride:])
				a1 = a1.Add(q.Mul(archsimd.BroadcastFloat64x8(k0[i+1])))
				b1 = b1.Add(q.Mul(archsimd.BroadcastFloat64x8(k1[i+1])))
				q = archsimd.LoadFloat64x8Slice(qt[2*p.stride:])
				a2 = a2.Add(q.Mul(archsimd.BroadcastFloat64x8(k0[i+2])))
				b2 = b2.Add(q.Mul(archsimd.BroadcastFloat64x8(k1[i+2])))
				q = archsimd.LoadFloat64x8Slice(qt[3*p.stride:])
				a3 = a3.Add(q.Mul(archsimd.BroadcastFloat64x8(k0[i+3])))
				b3 = b3.Add(q.Mul(archsimd.BroadcastFloat64x8(k1[i+3])))
			}
			for ; i < d; i++ {
				q0 := archsimd.LoadFloat64x8Slice(p.t[i*p.stride+g:])
				a0 = a0.Add(q0.Mul(archsimd.BroadcastFloat64x8(k0[i])))
				b0 = b0.Add(q0.Mul(archsimd.BroadcastFloat64x8(k1[i])))
			}
			a0.Add(a1).Add(a2.Add(a3)).StoreSlice(s[j*p.stride+g:])
			b0.Add(b1).Add(b2.Add(b3)).StoreSlice(s[(j+1)*p.stride+g:])
		}
		for ; j < nj; j++ {
			k0 := k[j*d : (j+1)*d]
			var a0, a1, a2, a3 archsimd.Float64x8
			i := 0
			for ; i+4 <= d; i += 4 {
				a0 = a0.Add(archsimd.LoadFloat64x8Slice(p.t[i*p.stride+g:]).Mul(archsimd.BroadcastFloat64x8(k0[i])))
				a1 = a1.Add(archsimd.LoadFloat64x8Slice(p.t[(i+1)*p.stride+g:]).Mul(archsimd.BroadcastFloat64x8(k0[i+1])))
				a2 = a2.Add(archsimd.LoadFloat64x8Slice(p.t[(i+2)*p.stride+g:]).Mul(archsimd.BroadcastFloat64x8(k0[i+2])))
				a3 = a3.Add(archsimd.LoadFloat64x8Slice(p.t[(i+3)*p.stride+g:]).Mul(archsimd.BroadcastFloat64x8(k0[i+3])))
			}
			for ; i < d; i++ {
				a0 = a0.Add(archsimd.LoadFloat64x8Slice(p.t[i*p.stride+g:]).Mul(archsimd.BroadcastFloat64x8(k0[i])))
			}
			a0.Add(a1).Add(a2.Add(a3)).StoreSlice(s[j*p.stride+g:])
		}
	}
}

// roundLanes is rmode.round on eight lanes (r32 and r64 only).
func roundLanes(x archsimd.Float64x8, m rmode) archsimd.Float64x8 {
	if m == r32 {
		return x.ConvertToFloat32().ConvertToFloat64()
	}
	return x
}

func scoresExpected(p *qpack, k []float64, d, nj int, s []float64, m rmode) {
	if !useAVX512 || (m != r32 && m != r64) {
		scoresExpectedGeneric(p, k, d, nj, s, m)
		return
	}
	for g := 0; g < p.stride; g += 8 {
		j := 0
		for ; j+2 <= nj; j += 2 {
			k0, k1 := k[j*d:(j+1)*d], k[(j+1)*d:(j+2)*d]
			var acc, bcc archsimd.Float64x8
			for d0 := 0; d0 < d; d0 += MMAK {
				d1 := min(d0+MMAK, d)
				var s0, s1, t0, t1 archsimd.Float64x8
				i := d0
				for ; i+2 <= d1; i += 2 {
					q0 := archsimd.LoadFloat64x8Slice(p.t[i*p.stride+g:])
					q1 := archsimd.LoadFloat64x8Slice(p.t[(i+1)*p.stride+g:])
					s0 = s0.Add(q0.Mul(archsimd.BroadcastFloat64x8(k0[i])))
					s1 = s1.Add(q1.Mul(archsimd.BroadcastFloat64x8(k0[i+1])))
					t0 = t0.Add(q0.Mul(archsimd.BroadcastFloat64x8(k1[i])))
					t1 = t1.Add(q1.Mul(archsimd.BroadcastFloat64x8(k1[i+1])))
				}
				if i < d1 {
					q0 := archsimd.LoadFloat64x8Slice(p.t[i*p.stride+g:])
					s0 = s0.Add(q0.Mul(archsimd.BroadcastFloat64x8(k0[i])))
					t0 = t0.Add(q0.Mul(archsimd.BroadcastFloat64x8(k1[i])))
				}
				acc = roundLanes(acc.Add(s0.Add(s1)), m)
				bcc = roundLanes(bcc.Add(t0.Add(t1)), m)
			}
			acc.StoreSlice(s[j*p.stride+g:])
			bcc.StoreSlice(s[(j+1)*p.stride+g:])
		}
		for ; j < nj; j++ {
			k0 := k[j*d : (j+1)*d]
			var acc archsimd.Float64x8
			for d0 := 0; d0 < d; d0 += MMAK {
				d1 := min(d0+MMAK, d)
				var s0, s1 archsimd.Float64x8
				i := d0
				for ; i+2 <= d1; i += 2 {
					s0 = s0.Add(archsimd.LoadFloat64x8Slice(p.t[i*p.stride+g:]).Mul(archsimd.BroadcastFloat64x8(k0[i])))
					s1 = s1.Add(archsimd.LoadFloat64x8Slice(p.t[(i+1)*p.stride+g:]).Mul(archsimd.BroadcastFloat64x8(k0[i+1])))
				}
				if i < d1 {
					s0 = s0.Add(archsimd.LoadFloat64x8Slice(p.t[i*p.stride+g:]).Mul(archsimd.BroadcastFloat64x8(k0[i])))
				}
				acc = roundLanes(acc.Add(s0.Add(s1)), m)
			}
			acc.StoreSlice(s[j*p.stride+g:])
		}
	}
}

// pvExact2 is pvExact2Generic with 16 latent columns of two rows held in
// four vectors across the token loop (Go gives vectors 16 registers, and
// its scheduler computes a token's products before adding them, so wider
// tiles spill).
func pvExact2(acc0, acc1, p0, p1, v []float64, d int) {
	n := len(acc0)
	if !useAVX512 || n < 8 {
		pvExact2Generic(acc0, acc1, p0, p1, v, d)
		return
	}
	acc1 = acc1[:n]
	p1 = p1[:len(p0)]
	l := 0
	for ; l+16 <= n; l += 16 {
		a0 := archsimd.LoadFloat64x8Slice(acc0[l:])
		a1 := archsimd.LoadFloat64x8Slice(acc0[l+8:])
		b0 := archsimd.LoadFloat64x8Slice(acc1[l:])
		b1 := archsimd.LoadFloat64x8Slice(acc1[l+8:])
		for j, pa := range p0 {
			x := v[j*d+l : j*d+l+16]
			x0 := archsimd.LoadFloat64x8Slice(x)
			x1 := archsimd.LoadFloat64x8Slice(x[8:])
			va, vb := archsimd.BroadcastFloat64x8(pa), archsimd.BroadcastFloat64x8(p1[j])
			a0 = a0.Add(x0.Mul(va))
			a1 = a1.Add(x1.Mul(va))
			b0 = b0.Add(x0.Mul(vb))
			b1 = b1.Add(x1.Mul(vb))
		}
		a0.StoreSlice(acc0[l:])
		a1.StoreSlice(acc0[l+8:])
		b0.StoreSlice(acc1[l:])
		b1.StoreSlice(acc1[l+8:])
	}
	for ; l+8 <= n; l += 8 {
		a0 := archsimd.LoadFloat64x8Slice(acc0[l:])
		b0 := archsimd.LoadFloat64x8Slice(acc1[l:])
		for j, pa := range p0 {
			x0 := archsimd.LoadFloat64x8Slice(v[j*d+l : j*d+l+8])
			a0 = a0.Add(x0.Mul(archsimd.BroadcastFloat64x8(pa)))
			b0 = b0.Add(x0.Mul(archsimd.BroadcastFloat64x8(p1[j])))
		}
		a0.StoreSlice(acc0[l:])
		b0.StoreSlice(acc1[l:])
	}
	if l < n {
		pvExact2Generic(acc0[l:], acc1[l:], p0, p1, v[l:], d)
	}
}

// pvExpected2 is pvExpected2Generic; for fp32 accumulation each lane's sum
// is rounded to fp32 and widened back, as float64(float32(...)) does.
func pvExpected2(acc0, acc1, p0, p1, v []float64, d int, m rmode) {
	n := len(acc0)
	if !useAVX512 || n < 8 || m != r32 {
		if m == r64 {
			pvExact2(acc0, acc1, p0, p1, v, d)
			return
		}
		pvExpected2Generic(acc0, acc1, p0, p1, v, d, m)
		return
	}
	acc1 = acc1[:n]
	p1 = p1[:len(p0)]
	r := func(x archsimd.Float64x8) archsimd.Float64x8 { return x.ConvertToFloat32().ConvertToFloat64() }
	l := 0
	for ; l+32 <= n; l += 32 {
		a0 := archsimd.LoadFloat64x8Slice(acc0[l:])
		a1 := archsimd.LoadFloat64x8Slice(acc0[l+8:])
		a2 := archsimd.LoadFloat64x8Slice(acc0[l+16:])
		a3 := archsimd.LoadFloat64x8Slice(acc0[l+24:])
		b0 := archsimd.LoadFloat64x8Slice(acc1[l:])
		b1 := archsimd.LoadFloat64x8Slice(acc1[l+8:])
		b2 := archsimd.LoadFloat64x8Slice(acc1[l+16:])
		b3 := archsimd.LoadFloat64x8Slice(acc1[l+24:])
		for j, pa := range p0 {
			x := v[j*d+l : j*d+l+32]
			va, vb := archsimd.BroadcastFloat64x8(pa), archsimd.BroadcastFloat64x8(p1[j])
			y := archsimd.LoadFloat64x8Slice(x)
			a0 = r(a0.Add(y.Mul(va)))
			b0 = r(b0.Add(y.Mul(vb)))
			y = archsimd.LoadFloat64x8Slice(x[8:])
			a1 = r(a1.Add(y.Mul(va)))
			b1 = r(b1.Add(y.Mul(vb)))
			y = archsimd.LoadFloat64x8Slice(x[16:])
			a2 = r(a2.Add(y.Mul(va)))
			b2 = r(b2.Add(y.Mul(vb)))
			y = archsimd.LoadFloat64x8Slice(x[24:])
			a3 = r(a3.Add(y.Mul(va)))
			b3 = r(b3.Add(y.Mul(vb)))
		}
		a0.StoreSlice(acc0[l:])
		a1.StoreSlice(acc0[l+8:])
		a2.StoreSlice(acc0[l+16:])
		a3.StoreSlice(acc0[l+24:])
		b0.StoreSlice(acc1[l:])
		b1.StoreSlice(acc1[l+8:])
		b2.StoreSlice(acc1[l+16:])
		b3.StoreSlice(acc1[l+24:])
	}
	for ; l+8 <= n; l += 8 {
		a0 := archsimd.LoadFloat64x8Slice(acc0[l:])
		b0 := archsimd.LoadFloat64x8Slice(acc1[l:])
		for j, pa := range p0 {
			x0 := archsimd.LoadFloat64x8Slice(v[j*d+l : j*d+l+8])
			a0 = r(a0.Add(x0.Mul(archsimd.BroadcastFloat64x8(pa))))
			b0 = r(b0.Add(x0.Mul(archsimd.BroadcastFloat64x8(p1[j]))))
		}
		a0.StoreSlice(acc0[l:])
		b0.StoreSlice(acc1[l:])
	}
	if l < n {
		pvExpected2Generic(acc0[l:], acc1[l:], p0, p1, v[l:], d, m)
	}
}

// pvExpected32x2 is pvExpected32x2Generic sixteen columns a vector, 64
// columns of two rows held across the token loop. The fused multiply-add
// rounds once, like the generic loop's separate multiply (exact here) and add.
func pvExpected32x2(acc0, acc1 []float32, p0, p1 []float64, v []float32, l int) {
	if !useAVX512 {
		pvExpected32x2Generic(acc0, acc1, p0, p1, v, l)
		return
	}
	acc0, acc1 = acc0[:l], acc1[:l]
	p1 = p1[:len(p0)]
	i := 0
	for ; i+64 <= l; i += 64 {
		a0 := archsimd.LoadFloat32x16Slice(acc0[i:])
		a1 := archsimd.LoadFloat32x16Slice(acc0[i+16:])
		a2 := archsimd.LoadFloat32x16Slice(acc0[i+32:])
		a3 := archsimd.LoadFloat32x16Slice(acc0[i+48:])
		b0 := archsimd.LoadFloat32x16Slice(acc1[i:])
		b1 := archsimd.LoadFloat32x16Slice(acc1[i+16:])
		b2 := archsimd.LoadFloat32x16Slice(acc1[i+32:])
		b3 := archsimd.LoadFloat32x16Slice(acc1[i+48:])
		for j, pa := range p0 {
			x := v[j*l+i : j*l+i+64]
			x0 := archsimd.LoadFloat32x16Slice(x)
			x1 := archsimd.LoadFloat32x16Slice(x[16:])
			x2 := archsimd.LoadFloat32x16Slice(x[32:])
			x3 := archsimd.LoadFloat32x16Slice(x[48:])
			va, vb := archsimd.BroadcastFloat32x16(float32(pa)), archsimd.BroadcastFloat32x16(float32(p1[j]))
			a0 = va.MulAdd(x0, a0)
			a1 = va.MulAdd(x1, a1)
			a2 = va.MulAdd(x2, a2)
			a3 = va.MulAdd(x3, a3)
			b0 = vb.MulAdd(x0, b0)
			b1 = vb.MulAdd(x1, b1)
			b2 = vb.MulAdd(x2, b2)
			b3 = vb.MulAdd(x3, b3)
		}
		a0.StoreSlice(acc0[i:])
		a1.StoreSlice(acc0[i+16:])
		a2.StoreSlice(acc0[i+32:])
		a3.StoreSlice(acc0[i+48:])
		b0.StoreSlice(acc1[i:])
		b1.StoreSlice(acc1[i+16:])
		b2.StoreSlice(acc1[i+32:])
		b3.StoreSlice(acc1[i+48:])
	}
	if i < l {
		for j := range p0 { // the tail columns, token by token as the generic loop
			pa, pb := float32(p0[j]), float32(p1[j])
			for c := i; c < l; c++ {
				xv := v[j*l+c]
				acc0[c] = float32(acc0[c] + float32(pa*xv))
				acc1[c] = float32(acc1[c] + float32(pb*xv))
			}
		}
	}
}

// scoresBoth computes scoresExact and scoresExpected in one pass when both
// read the same cache rows (kx = kr): each product q[i]·k[i] is formed once
// and added to dot64's partial sum s_(i mod 4) and to dotAcc's block sum of
// its parity, in the order each of those defines; one token at a time, so
// the seven sums fit Go's 16 vector registers. Results are bit-identical to
// the two kernels (and so to dot64 and dotAcc).
func scoresBoth(p *qpack, k []float64, d, nj int, sx, sr []float64, m rmode) {
	if !useAVX512 || (m != r32 && m != r64) {
		scoresExact(p, k, d, nj, sx)
		scoresExpected(p, k, d, nj, sr, m)
		return
	}
	d4 := d &^ 3
	st := p.stride
	for g := 0; g < st; g += 8 {
		for j := 0; j < nj; j++ {
			kj := k[j*d : (j+1)*d]
			var a0, a1, a2, a3, acc archsimd.Float64x8
			for d0 := 0; d0 < d; d0 += MMAK {
				d1 := min(d0+MMAK, d)
				var s0, s1 archsimd.Float64x8
				i := d0
				for ; i+4 <= d1 && i+4 <= d4; i += 4 {
					qt := p.t[i*st+g : (i+3)*st+g+8]
					x := archsimd.LoadFloat64x8Slice(qt).Mul(archsimd.BroadcastFloat64x8(kj[i]))
					a0, s0 = a0.Add(x), s0.Add(x)
					x = archsimd.LoadFloat64x8Slice(qt[st:]).Mul(archsimd.BroadcastFloat64x8(kj[i+1]))
					a1, s1 = a1.Add(x), s1.Add(x)
					x = archsimd.LoadFloat64x8Slice(qt[2*st:]).Mul(archsimd.BroadcastFloat64x8(kj[i+2]))
					a2, s0 = a2.Add(x), s0.Add(x)
					x = archsimd.LoadFloat64x8Slice(qt[3*st:]).Mul(archsimd.BroadcastFloat64x8(kj[i+3]))
					a3, s1 = a3.Add(x), s1.Add(x)
				}
				for ; i < d1; i++ { // tails: dot64's past d&^3 go to s0
					x := archsimd.LoadFloat64x8Slice(p.t[i*st+g:]).Mul(archsimd.BroadcastFloat64x8(kj[i]))
					switch {
					case i >= d4 || i%4 == 0:
						a0 = a0.Add(x)
					case i%4 == 1:
						a1 = a1.Add(x)
					case i%4 == 2:
						a2 = a2.Add(x)
					default:
						a3 = a3.Add(x)
					}
					if (i-d0)%2 == 0 {
						s0 = s0.Add(x)
					} else {
						s1 = s1.Add(x)
					}
				}
				acc = roundLanes(acc.Add(s0.Add(s1)), m)
			}
			a0.Add(a1).Add(a2.Add(a3)).StoreSlice(sx[j*st+g:])
			acc.StoreSlice(sr[j*st+g:])
		}
	}
}
