//go:build !(goexperiment.simd && amd64)

package mla

// Without the simd experiment the scores are computed by the plain-Go loops,
// one query row at a time against two cache rows.

const qLanes = 1

func scoresExact(p *qpack, k []float64, d, nj int, s []float64) {
	scoresExactGeneric(p, k, d, nj, s)
}

func scoresExpected(p *qpack, k []float64, d, nj int, s []float64, m rmode) {
	scoresExpectedGeneric(p, k, d, nj, s, m)
}

func pvExact2(acc0, acc1, p0, p1, v []float64, d int) { pvExact2Generic(acc0, acc1, p0, p1, v, d) }

func pvExpected2(acc0, acc1, p0, p1, v []float64, d int, m rmode) {
	pvExpected2Generic(acc0, acc1, p0, p1, v, d, m)
}

func pvExpected32x2(acc0, acc1 []float32, p0, p1 []float64, v []float32, l int) {
	pvExpected32x2Generic(acc0, acc1, p0, p1, v, l)
}

// scoresBoth is the two score kernels, one after the other (the simd build
// fuses them; the results are the same bits).
func scoresBoth(p *qpack, k []float64, d, nj int, sx, sr []float64, m rmode) {
	scoresExactGeneric(p, k, d, nj, sx)
	scoresExpectedGeneric(p, k, d, nj, sr, m)
}
