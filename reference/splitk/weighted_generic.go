//go:build !(goexperiment.simd && amd64)

package splitk

func weightedAdd(ex, xp, o []float64, w, cs float64) { weightedAddGeneric(ex, xp, o, w, cs) }
