//go:build !amd64 || purego

package mla

import "github.com/kcheck-dev/kcheck/reference/internal/simd"

// Without the assembly kernels (another architecture, or the purego build
// tag) the plain-Go definitions run, one query row at a time.

const qLanes = 1

// qtGroup is qpack's layout: the plain Go reads no transposed rows.
func qtGroup() int { return 0 }

func scores(p *qpack, k []float64, d, nj int, sx, sr []float64, m rmode, exactProducts bool) {
	scoresGeneric(p, k, d, nj, sx, sr, m)
}

func pvExact(acc []float64, accStride int, p []float64, pStride int, v []float64, d, nj, l, rows int) {
	pvExactGeneric(acc, accStride, p, pStride, v, d, nj, l, rows)
}

func pvExpected32(acc []float32, accStride int, p []float32, pStride int, v []float32, nj, l, rows int) {
	pvExpected32Generic(acc, accStride, p, pStride, v, nj, l, rows)
}

var level, levels = simd.Generic, []simd.Level{simd.Generic}

// kernelsName names the inner loops this build runs (for benchmarks).
func kernelsName() string { return level.String() }

func narrow(dst []float32, src []float64, lo float64) float64 { return narrowGeneric(dst, src, lo) }

func widenF32(dst []float64, src []float32) { widenF32Generic(dst, src) }

func expVec(dst, src []float64) { expVecGeneric(dst, src) }

func exp2fVec(dst, src []float64) { exp2fVecGeneric(dst, src) }
