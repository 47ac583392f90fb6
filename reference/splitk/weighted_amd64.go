//go:build amd64 && !purego

package splitk

import "github.com/kcheck-dev/kcheck/reference/internal/simd"

// On amd64 with AVX-512 the weighted sums run in assembly
// (weighted_amd64.s), 32 columns of both sums held in registers while every
// split passes over them, and with AVX2 sixteen (weighted_avx2_amd64.s);
// columns past the last multiple of 32 run the Go definition, which gives
// the same bits.

// level is the widest instruction set the CPU runs; tests set it to each
// of levels in turn.
var level, levels = simd.Best(), simd.Supported()

// weightedSumAVX512 is weightedSumGeneric on columns [0, cols), cols%32 ==
// 0 and cols > 0, over the n > 0 splits listed in splits, in its order:
//
//	for k := 0; k < n; k++ {
//		ws, cs := w[k], cw[k]
//		for i := 0; i < cols; i++ {
//			v := o[splits[k]*l+i]
//			ex[i] += float64(ws * v)
//			xp[i] = float64(float32(xp[i] + cs*float64(float32(v))))
//		}
//	}
//
//go:noescape
func weightedSumAVX512(ex *float64, xp *float64, o *float64, l int, splits *int, n int, w *float64, cw *float64, cols int)

// weightedSum32AVX512 is weightedSumAVX512's loop over float32 partials
// (v := float64(o[splits[k]*l+i]), exact; float32(v) is then o's value).
//
//go:noescape
func weightedSum32AVX512(ex *float64, xp *float64, o *float32, l int, splits *int, n int, w *float64, cw *float64, cols int)

// weightedSumAVX2 is weightedSumAVX512 in 256-bit vectors.
//
//go:noescape
func weightedSumAVX2(ex *float64, xp *float64, o *float64, l int, splits *int, n int, w *float64, cw *float64, cols int)

// weightedSum32AVX2 is weightedSum32AVX512 in 256-bit vectors.
//
//go:noescape
func weightedSum32AVX2(ex *float64, xp *float64, o *float32, l int, splits *int, n int, w *float64, cw *float64, cols int)

func weightedSum[T float32 | float64](ex, xp []float64, o []T, l int, splits []int, w, cw []float64) {
	cols := len(ex) &^ 31
	n := len(splits)
	if level == simd.Generic || cols == 0 || n == 0 || len(xp) < len(ex) || len(w) < n || len(cw) < n || !inRange(len(o), l, splits, len(ex)) {
		weightedSumGeneric(ex, xp, o, l, splits, w, cw)
		return
	}
	avx2 := level == simd.AVX2
	switch o := any(o).(type) {
	case []float64:
		if avx2 {
			weightedSumAVX2(&ex[0], &xp[0], &o[0], l, &splits[0], n, &w[0], &cw[0], cols)
		} else {
			weightedSumAVX512(&ex[0], &xp[0], &o[0], l, &splits[0], n, &w[0], &cw[0], cols)
		}
	case []float32:
		if avx2 {
			weightedSum32AVX2(&ex[0], &xp[0], &o[0], l, &splits[0], n, &w[0], &cw[0], cols)
		} else {
			weightedSum32AVX512(&ex[0], &xp[0], &o[0], l, &splits[0], n, &w[0], &cw[0], cols)
		}
	}
	if cols < len(ex) {
		weightedSumGeneric(ex[cols:], xp[cols:], o[cols:], l, splits, w, cw)
	}
}

// inRange reports whether every listed split's columns [0, cols) lie in
// the n partial values.
func inRange(n, l int, splits []int, cols int) bool {
	for _, s := range splits {
		if s < 0 || s*l+cols > n {
			return false
		}
	}
	return true
}
