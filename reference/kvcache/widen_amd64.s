//go:build amd64 && !purego

#include "textflag.h"

// func widenBF16AVX512(dst *float64, src *byte, n int)
//
// widenBF16Generic for n values, n%8 == 0 and n > 0: each 16-bit code
// zero-extended and shifted into the top half of a float32, which widens
// to float64 exactly.
TEXT ·widenBF16AVX512(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
loop:
	VPMOVZXWD (SI), Y0
	VPSLLD    $16, Y0, Y0
	VCVTPS2PD Y0, Z1
	VMOVUPD   Z1, (DI)
	ADDQ      $16, SI
	ADDQ      $64, DI
	SUBQ      $8, CX
	JNZ       loop
	VZEROUPPER
	RET

// func widenBF16AVX2(dst *float64, src *byte, n int)
TEXT ·widenBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
loop2:
	VPMOVZXWD    (SI), Y0
	VPSLLD       $16, Y0, Y0
	VCVTPS2PD    X0, Y1
	VEXTRACTF128 $1, Y0, X2
	VCVTPS2PD    X2, Y3
	VMOVUPD      Y1, (DI)
	VMOVUPD      Y3, 32(DI)
	ADDQ         $16, SI
	ADDQ         $64, DI
	SUBQ         $8, CX
	JNZ          loop2
	VZEROUPPER
	RET
