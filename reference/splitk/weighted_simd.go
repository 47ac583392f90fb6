//go:build goexperiment.simd && amd64

package splitk

import "simd/archsimd"

var useAVX512 = archsimd.X86.AVX512()

// weightedAdd is weightedAddGeneric eight elements a vector: per lane the
// same separate multiply and add for the exact sum, and the same float32
// roundings (convert down and back) for the expected one.
func weightedAdd(ex, xp, o []float64, w, cs float64) {
	if !useAVX512 {
		weightedAddGeneric(ex, xp, o, w, cs)
		return
	}
	n := len(o)
	ex, xp = ex[:n], xp[:n]
	vw, vc := archsimd.BroadcastFloat64x8(w), archsimd.BroadcastFloat64x8(cs)
	i := 0
	for ; i+8 <= n; i += 8 {
		x := archsimd.LoadFloat64x8Slice(o[i:])
		archsimd.LoadFloat64x8Slice(ex[i:]).Add(x.Mul(vw)).StoreSlice(ex[i:])
		x32 := x.ConvertToFloat32().ConvertToFloat64()
		archsimd.LoadFloat64x8Slice(xp[i:]).Add(x32.Mul(vc)).ConvertToFloat32().ConvertToFloat64().StoreSlice(xp[i:])
	}
	weightedAddGeneric(ex[i:], xp[i:], o[i:], w, cs)
}
