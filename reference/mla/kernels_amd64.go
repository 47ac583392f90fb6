//go:build amd64 && !purego

package mla

import "github.com/kcheck-dev/kcheck/reference/internal/simd"

// On amd64 the inner loops run in assembly when the CPU has AVX-512
// (kernels_amd64.s: sixteen query rows a pass, one row a vector lane, so
// the score block is laid out with a stride of 16) or AVX2
// (kernels_avx2_amd64.s: the scores, eight rows a pass, the PV updates,
// the narrowing and widening, both exps). Shapes the assembly does not cover (D not a
// multiple of MMAK, latent widths not a multiple of the strip, bf16 or
// fp16 accumulation) run the plain-Go definitions, which give the same
// bits.

const qLanes = 16

// level is the widest instruction set the CPU runs; tests set it to each
// of levels in turn.
var level, levels = simd.Best(), simd.Supported()

// kernelsName names the inner loops this build runs (for benchmarks).
func kernelsName() string { return level.String() }

// scoresAVX512 is scoresGeneric, sixteen query rows a pass: for the query
// rows packed transposed in qt (qt[e*stride+r] is q_r[e]; lanes past the
// query's rows hold zeros), the nj cache rows of k, and m = r32 when
// round32, else r64,
//
//	for j := 0; j < nj; j++ {
//		for r := 0; r < stride; r++ {
//			sx[j*stride+r], sr[j*stride+r] = blockDot(q_r, k[j*d:(j+1)*d], m)
//		}
//	}
//
// With fused, each product and its addition round once: the same bits when
// every product q·k is exact in float64, which the caller checks.
// stride%16 == 0, d%16 == 0, nj%4 == 0 and nj > 0.
//
//go:noescape
func scoresAVX512(qt *float64, stride int, k *float64, d int, nj int, sx *float64, sr *float64, round32 bool, fused bool)

// scoresAVX2 is scoresAVX512 in 256-bit vectors, eight query rows against
// two cache rows a pass.
//
//go:noescape
func scoresAVX2(qt *float64, stride int, k *float64, d int, nj int, sx *float64, sr *float64, round32 bool, fused bool)

// pvExactAVX512 is pvExactGeneric:
//
//	for r := 0; r < rows; r++ {
//		for j := 0; j < nj; j++ {
//			for i := 0; i < l; i++ {
//				acc[r*accStride+i] = math.FMA(p[r*pStride+j], v[j*vStride+i], acc[r*accStride+i])
//			}
//		}
//	}
//
// nj >= 1, l%32 == 0, rows%4 == 0 and rows > 0.
//
//go:noescape
func pvExactAVX512(acc *float64, accStride int, p *float64, pStride int, v *float64, vStride int, nj int, l int, rows int)

// pvExactAVX2 is pvExactAVX512 in 256-bit vectors.
//
//go:noescape
func pvExactAVX2(acc *float64, accStride int, p *float64, pStride int, v *float64, vStride int, nj int, l int, rows int)

// pvExpected32AVX512 is pvExpected32Generic:
//
//	for r := 0; r < rows; r++ {
//		for j := 0; j < nj; j++ {
//			for i := 0; i < l; i++ {
//				acc[r*accStride+i] = float32(acc[r*accStride+i] + float32(p[r*pStride+j]*v[j*l+i]))
//			}
//		}
//	}
//
// as one fused multiply-add a term, the same bits because every product is
// exact in fp32 (the caller checks). nj >= 1, l%64 == 0, rows%4 == 0 and
// rows > 0.
//
//go:noescape
func pvExpected32AVX512(acc *float32, accStride int, p *float32, pStride int, v *float32, nj int, l int, rows int)

// pvExpected32AVX2 is pvExpected32AVX512 in 256-bit vectors.
//
//go:noescape
func pvExpected32AVX2(acc *float32, accStride int, p *float32, pStride int, v *float32, nj int, l int, rows int)

// qtGroup is how qpack lays out its transposed rows for the scores kernel
// of this level: AVX2's reads eight rows' lanes a position, and with the
// rows' positions [D][stride] apart (1 KB for 128 heads) a chunk of them
// falls into few L1 sets and is evicted before the next token reads it
// (the scores ran 3x slower so); group by group, [stride/8][D][8], a
// group's positions are consecutive.
func qtGroup() int {
	if level == simd.AVX2 {
		return 8
	}
	return 0
}

// scores is scoresGeneric. The assembly computes whole groups of four
// tokens: rows nj up to the next multiple of four are read from k (the
// worker's block buffer holds them) and their scores are left in sx and sr
// unused. When every product q·k is exact in float64 (exactProducts: see
// engine.exactProducts) fusing each product with its addition gives the
// same bits, and the fused kernel runs (about a fifth faster).
func scores(p *qpack, k []float64, d, nj int, sx, sr []float64, m rmode, exactProducts bool) {
	n4 := (nj + 3) &^ 3
	if level == simd.Generic || p.group != qtGroup() || nj <= 0 || d%MMAK != 0 || (m != r32 && m != r64) || p.stride%16 != 0 ||
		len(k) < n4*d || len(sx) < n4*p.stride || len(sr) < n4*p.stride || len(p.t) < d*p.stride {
		scoresGeneric(p, k, d, nj, sx, sr, m)
		return
	}
	if level == simd.AVX2 {
		scoresAVX2(&p.t[0], p.stride, &k[0], d, n4, &sx[0], &sr[0], m == r32, exactProducts)
	} else {
		scoresAVX512(&p.t[0], p.stride, &k[0], d, n4, &sx[0], &sr[0], m == r32, exactProducts)
	}
}

// pvExact is pvExactGeneric; the assembly takes the rows in fours.
func pvExact(acc []float64, accStride int, p []float64, pStride int, v []float64, d, nj, l, rows int) {
	r4 := rows &^ 3
	if level == simd.Generic || nj <= 0 || l%32 != 0 || l == 0 || r4 == 0 ||
		len(acc) < (r4-1)*accStride+l || len(p) < (r4-1)*pStride+nj || len(v) < (nj-1)*d+l {
		pvExactGeneric(acc, accStride, p, pStride, v, d, nj, l, rows)
		return
	}
	if level == simd.AVX2 {
		pvExactAVX2(&acc[0], accStride, &p[0], pStride, &v[0], d, nj, l, r4)
	} else {
		pvExactAVX512(&acc[0], accStride, &p[0], pStride, &v[0], d, nj, l, r4)
	}
	if r4 < rows {
		pvExactGeneric(acc[r4*accStride:], accStride, p[r4*pStride:], pStride, v, d, nj, l, rows-r4)
	}
}

// pvExpected32 is pvExpected32Generic; the assembly takes the rows in fours.
func pvExpected32(acc []float32, accStride int, p []float32, pStride int, v []float32, nj, l, rows int) {
	r4 := rows &^ 3
	if level == simd.Generic || nj <= 0 || l%64 != 0 || l == 0 || r4 == 0 ||
		len(acc) < (r4-1)*accStride+l || len(p) < (r4-1)*pStride+nj || len(v) < nj*l {
		pvExpected32Generic(acc, accStride, p, pStride, v, nj, l, rows)
		return
	}
	if level == simd.AVX2 {
		pvExpected32AVX2(&acc[0], accStride, &p[0], pStride, &v[0], nj, l, r4)
	} else {
		pvExpected32AVX512(&acc[0], accStride, &p[0], pStride, &v[0], nj, l, r4)
	}
	if r4 < rows {
		pvExpected32Generic(acc[r4*accStride:], accStride, p[r4*pStride:], pStride, v, nj, l, rows-r4)
	}
}

// narrowAVX512 is narrowGeneric on n values, n%8 == 0 and n > 0:
//
//	for i := 0; i < n; i++ {
//		dst[i] = float32(src[i])
//		if a := math.Abs(src[i]); a < lo && a != 0 {
//			lo = a
//		}
//	}
//	return lo
//
//go:noescape
func narrowAVX512(dst *float32, src *float64, n int, lo float64) float64

// widenF32AVX512 is widenF32Generic on n values, n%8 == 0 and n > 0:
//
//	for i := 0; i < n; i++ {
//		dst[i] = float64(src[i])
//	}
//
//go:noescape
func widenF32AVX512(dst *float64, src *float32, n int)

// narrowAVX2 is narrowAVX512 in 256-bit vectors.
//
//go:noescape
func narrowAVX2(dst *float32, src *float64, n int, lo float64) float64

// widenF32AVX2 is widenF32AVX512 in 256-bit vectors.
//
//go:noescape
func widenF32AVX2(dst *float64, src *float32, n int)

func narrow(dst []float32, src []float64, lo float64) float64 {
	n := len(src) &^ 7
	if level == simd.Generic || n == 0 || len(dst) < len(src) {
		return narrowGeneric(dst, src, lo)
	}
	if level == simd.AVX2 {
		lo = narrowAVX2(&dst[0], &src[0], n, lo)
	} else {
		lo = narrowAVX512(&dst[0], &src[0], n, lo)
	}
	return narrowGeneric(dst[n:], src[n:], lo)
}

func widenF32(dst []float64, src []float32) {
	n := len(src) &^ 7
	if level == simd.Generic || n == 0 || len(dst) < len(src) {
		widenF32Generic(dst, src)
		return
	}
	if level == simd.AVX2 {
		widenF32AVX2(&dst[0], &src[0], n)
	} else {
		widenF32AVX512(&dst[0], &src[0], n)
	}
	widenF32Generic(dst[n:], src[n:])
}

// expVecAVX512 is expVecGeneric on n values, n%8 == 0 and n > 0, with
// expDef's operations lane by lane:
//
//	for i := 0; i < n; i++ {
//		dst[i] = expDef(src[i])
//	}
//
//go:noescape
func expVecAVX512(dst *float64, src *float64, n int)

// exp2fVecAVX512 is exp2fVecGeneric on n values, n%8 == 0 and n > 0,
//
//	for i := 0; i < n; i++ {
//		dst[i] = float64(splitk.Exp2F32(float32(src[i])))
//	}
//
// by arithmetic of its own that settles a lane only where its result is
// provably the correct rounding (Exp2F32's). It returns how many lanes it
// left unsettled; the caller then runs the loop above over all n.
//
//go:noescape
func exp2fVecAVX512(dst *float64, src *float64, n int) int

// expVecAVX2 is expVecAVX512 in 256-bit vectors.
//
//go:noescape
func expVecAVX2(dst *float64, src *float64, n int)

func expVec(dst, src []float64) {
	n := len(src) &^ 7
	if level == simd.Generic || n == 0 || len(dst) < len(src) {
		expVecGeneric(dst, src)
		return
	}
	if level == simd.AVX2 {
		expVecAVX2(&dst[0], &src[0], n)
	} else {
		expVecAVX512(&dst[0], &src[0], n)
	}
	expVecGeneric(dst[n:len(src)], src[n:])
}

// exp2fVecAVX2 is exp2fVecAVX512 in 256-bit vectors.
//
//go:noescape
func exp2fVecAVX2(dst *float64, src *float64, n int) int

func exp2fVec(dst, src []float64) {
	n := len(src) &^ 7
	if level == simd.Generic || n == 0 || len(dst) < len(src) {
		exp2fVecGeneric(dst, src)
		return
	}
	var unsettled int
	if level == simd.AVX2 {
		unsettled = exp2fVecAVX2(&dst[0], &src[0], n)
	} else {
		unsettled = exp2fVecAVX512(&dst[0], &src[0], n)
	}
	if unsettled > 0 {
		exp2fVecGeneric(dst[:n], src[:n])
	}
	exp2fVecGeneric(dst[n:len(src)], src[n:])
}
