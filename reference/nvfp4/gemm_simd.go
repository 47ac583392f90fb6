//go:build goexperiment.simd && amd64

package nvfp4

import "simd/archsimd"

// With the simd experiment and AVX-512 the GEMM runs sixteen output columns
// a vector, one column a lane, over b's block values transposed ([K][N],
// padded to a multiple of 32 columns). Each lane adds the products of a
// block one at a time (a fused multiply-add: every product and partial sum
// is exact in fp32, see GEMM, so any order gives the same block partial),
// then adds the partial to its fp32 and float64 accumulators in K order,
// exactly as runGeneric and the package's reference loop do.

var useAVX512 = archsimd.X86.AVX512()

const simdTI, simdTJ, simdTK = 16, 32, 256

func (g *gemmJob) run(b *Matrix) {
	if !useAVX512 {
		g.runGeneric(b)
		return
	}
	m, n, k := g.m, g.n, g.k
	np := (n + simdTJ - 1) / simdTJ * simdTJ
	bt := b.blockValuesT(np)
	ti, tj := (m+simdTI-1)/simdTI, np/simdTJ
	parallel(ti*tj, func(u int) {
		i0, j0 := (u/tj)*simdTI, (u%tj)*simdTJ
		i1 := min(i0+simdTI, m)
		var acc32 [simdTI * simdTJ]float32
		var acc64 [simdTI * simdTJ]float64
		for k0 := 0; k0 < k; k0 += simdTK {
			k1 := min(k0+simdTK, k)
			for i := i0; i < i1; i += 2 {
				i2 := min(i+1, i1-1) // an odd last row is computed twice, stored once
				ar, as := g.av[i*k:(i+1)*k], g.av[i2*k:(i2+1)*k]
				t := (i - i0) * simdTJ
				t2 := t + simdTJ
				if i2 == i {
					t2 = t
				}
				c00 := archsimd.LoadFloat32x16Slice(acc32[t:])
				c01 := archsimd.LoadFloat32x16Slice(acc32[t+16:])
				c10 := archsimd.LoadFloat32x16Slice(acc32[t2:])
				c11 := archsimd.LoadFloat32x16Slice(acc32[t2+16:])
				d00 := archsimd.LoadFloat64x8Slice(acc64[t:])
				d01 := archsimd.LoadFloat64x8Slice(acc64[t+8:])
				d02 := archsimd.LoadFloat64x8Slice(acc64[t+16:])
				d03 := archsimd.LoadFloat64x8Slice(acc64[t+24:])
				d10 := archsimd.LoadFloat64x8Slice(acc64[t2:])
				d11 := archsimd.LoadFloat64x8Slice(acc64[t2+8:])
				d12 := archsimd.LoadFloat64x8Slice(acc64[t2+16:])
				d13 := archsimd.LoadFloat64x8Slice(acc64[t2+24:])
				for c := k0; c < k1; c += BlockSize {
					var s00, s01, s10, s11 archsimd.Float32x16
					for e := c; e < c+BlockSize; e++ {
						row := bt[e*np+j0 : e*np+j0+simdTJ]
						b0 := archsimd.LoadFloat32x16Slice(row)
						b1 := archsimd.LoadFloat32x16Slice(row[16:])
						x, y := archsimd.BroadcastFloat32x16(ar[e]), archsimd.BroadcastFloat32x16(as[e])
						s00 = x.MulAdd(b0, s00)
						s01 = x.MulAdd(b1, s01)
						s10 = y.MulAdd(b0, s10)
						s11 = y.MulAdd(b1, s11)
					}
					c00, c01, c10, c11 = c00.Add(s00), c01.Add(s01), c10.Add(s10), c11.Add(s11)
					d00 = d00.Add(s00.GetLo().ConvertToFloat64())
					d01 = d01.Add(s00.GetHi().ConvertToFloat64())
					d02 = d02.Add(s01.GetLo().ConvertToFloat64())
					d03 = d03.Add(s01.GetHi().ConvertToFloat64())
					d10 = d10.Add(s10.GetLo().ConvertToFloat64())
					d11 = d11.Add(s10.GetHi().ConvertToFloat64())
					d12 = d12.Add(s11.GetLo().ConvertToFloat64())
					d13 = d13.Add(s11.GetHi().ConvertToFloat64())
				}
				c10.StoreSlice(acc32[t2:])
				c11.StoreSlice(acc32[t2+16:])
				d10.StoreSlice(acc64[t2:])
				d11.StoreSlice(acc64[t2+8:])
				d12.StoreSlice(acc64[t2+16:])
				d13.StoreSlice(acc64[t2+24:])
				c00.StoreSlice(acc32[t:])
				c01.StoreSlice(acc32[t+16:])
				d00.StoreSlice(acc64[t:])
				d01.StoreSlice(acc64[t+8:])
				d02.StoreSlice(acc64[t+16:])
				d03.StoreSlice(acc64[t+24:])
			}
		}
		for i := i0; i < i1; i++ {
			for j := j0; j < min(j0+simdTJ, n); j++ {
				t := (i-i0)*simdTJ + j - j0
				g.store(i, j, acc32[t], acc64[t])
			}
		}
	})
}
