//go:build amd64 && !purego

package kvcache

import "github.com/kcheck-dev/kcheck/reference/internal/simd"

// Cache rows are read once per block of tokens for every head of a decode,
// so widening bf16 to float64 is on the decode's path: on amd64 with
// AVX-512 it runs eight values an instruction, with AVX2 four
// (widen_amd64.s).

// level is the widest instruction set the CPU runs; tests set it to each
// of levels in turn.
var level, levels = simd.Best(), simd.Supported()

// widenBF16AVX512 is widenBF16Generic on n values, n%8 == 0 and n > 0:
//
//	for j := 0; j < n; j++ {
//		dst[j] = float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*j:])) << 16))
//	}
//
//go:noescape
func widenBF16AVX512(dst *float64, src *byte, n int)

// widenBF16AVX2 is widenBF16AVX512 in 256-bit vectors.
//
//go:noescape
func widenBF16AVX2(dst *float64, src *byte, n int)

func widenBF16(dst []float64, src []byte) {
	n := len(dst) &^ 7
	if level == simd.Generic || n == 0 || len(src) < 2*len(dst) {
		widenBF16Generic(dst, src)
		return
	}
	if level == simd.AVX2 {
		widenBF16AVX2(&dst[0], &src[0], n)
	} else {
		widenBF16AVX512(&dst[0], &src[0], n)
	}
	widenBF16Generic(dst[n:], src[2*n:])
}
