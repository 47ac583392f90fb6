//go:build !amd64 || purego

package splitk

import "github.com/kcheck-dev/kcheck/reference/internal/simd"

var level, levels = simd.Generic, []simd.Level{simd.Generic}

func weightedSum[T float32 | float64](ex, xp []float64, o []T, l int, splits []int, w, cw []float64) {
	weightedSumGeneric(ex, xp, o, l, splits, w, cw)
}
