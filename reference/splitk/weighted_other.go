//go:build !amd64 || purego

package splitk

func weightedSum(ex, xp, o []float64, l int, splits []int, w, cw []float64) {
	weightedSumGeneric(ex, xp, o, l, splits, w, cw)
}

func weightedSum32(ex, xp []float64, o []float32, l int, splits []int, w, cw []float64) {
	weightedSum32Generic(ex, xp, o, l, splits, w, cw)
}
