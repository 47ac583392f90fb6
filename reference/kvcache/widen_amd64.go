//go:build amd64 && !purego

package kvcache

import "golang.org/x/sys/cpu"

// Cache rows are read once per block of tokens for every head of a decode,
// so widening bf16 to float64 is on the decode's path: on amd64 with
// AVX-512 it runs eight values an instruction (widen_amd64.s).

var useAVX512 = cpu.X86.HasAVX512F

// widenBF16AVX512 is widenBF16Generic on n values, n%8 == 0 and n > 0:
//
//	for j := 0; j < n; j++ {
//		dst[j] = float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*j:])) << 16))
//	}
//
//go:noescape
func widenBF16AVX512(dst *float64, src *byte, n int)

func widenBF16(dst []float64, src []byte) {
	n := len(dst) &^ 7
	if !useAVX512 || n == 0 || len(src) < 2*len(dst) {
		widenBF16Generic(dst, src)
		return
	}
	widenBF16AVX512(&dst[0], &src[0], n)
	widenBF16Generic(dst[n:], src[2*n:])
}
