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
		// one spare row at the end takes the sums of repeated rows
		var acc32 [(simdTI + 1) * simdTJ]float32
		var acc64 [(simdTI + 1) * simdTJ]float64
		for k0 := 0; k0 < k; k0 += simdTK {
			k1 := min(k0+simdTK, k)
			for i := i0; i < i1; i += 4 {
				// four rows (a short last group repeats its last row into
				// the spare accumulator row), 32 columns: eight block sums
				// in registers (Go gives vectors 16), the two accumulators
				// in memory
				var rows [4][]float32
				var t [4]int
				for q := range rows {
					r := min(i+q, i1-1)
					rows[q], t[q] = g.av[r*k:(r+1)*k], (r-i0)*simdTJ
					if i+q >= i1 {
						t[q] = simdTI * simdTJ
					}
				}
				for c := k0; c < k1; c += BlockSize {
					var s00, s01, s10, s11, s20, s21, s30, s31 archsimd.Float32x16
					for e := c; e < c+BlockSize; e++ {
						row := bt[e*np+j0 : e*np+j0+simdTJ]
						b0 := archsimd.LoadFloat32x16Slice(row)
						b1 := archsimd.LoadFloat32x16Slice(row[16:])
						x := archsimd.BroadcastFloat32x16(rows[0][e])
						s00, s01 = x.MulAdd(b0, s00), x.MulAdd(b1, s01)
						x = archsimd.BroadcastFloat32x16(rows[1][e])
						s10, s11 = x.MulAdd(b0, s10), x.MulAdd(b1, s11)
						x = archsimd.BroadcastFloat32x16(rows[2][e])
						s20, s21 = x.MulAdd(b0, s20), x.MulAdd(b1, s21)
						x = archsimd.BroadcastFloat32x16(rows[3][e])
						s30, s31 = x.MulAdd(b0, s30), x.MulAdd(b1, s31)
					}
					addBlock(acc32[t[0]:], acc64[t[0]:], s00, s01)
					addBlock(acc32[t[1]:], acc64[t[1]:], s10, s11)
					addBlock(acc32[t[2]:], acc64[t[2]:], s20, s21)
					addBlock(acc32[t[3]:], acc64[t[3]:], s30, s31)
				}
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

// addBlock adds one block's partials s0 (columns 0..15) and s1 (16..31) to
// the fp32 and float64 accumulators of one output row of the tile.
func addBlock(a32 []float32, a64 []float64, s0, s1 archsimd.Float32x16) {
	a32, a64 = a32[:simdTJ], a64[:simdTJ]
	archsimd.LoadFloat32x16Slice(a32).Add(s0).StoreSlice(a32)
	archsimd.LoadFloat32x16Slice(a32[16:]).Add(s1).StoreSlice(a32[16:])
	archsimd.LoadFloat64x8Slice(a64).Add(s0.GetLo().ConvertToFloat64()).StoreSlice(a64)
	archsimd.LoadFloat64x8Slice(a64[8:]).Add(s0.GetHi().ConvertToFloat64()).StoreSlice(a64[8:])
	archsimd.LoadFloat64x8Slice(a64[16:]).Add(s1.GetLo().ConvertToFloat64()).StoreSlice(a64[16:])
	archsimd.LoadFloat64x8Slice(a64[24:]).Add(s1.GetHi().ConvertToFloat64()).StoreSlice(a64[24:])
}
