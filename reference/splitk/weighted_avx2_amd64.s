//go:build amd64 && !purego

#include "textflag.h"

// The AVX2 twins of weighted_amd64.s, for CPUs without AVX-512: the same
// loops, four columns a vector, sixteen columns an iteration. Y0 holds
// the split's weight w, Y1 its fp32 weight cs.

// EXACT4 adds w·x to ex at off for the four values in x: ex + w*x.
#define EXACT4(x, t, off) \
	VMULPD  Y0, x, t; \
	VADDPD  off(DI), t, t; \
	VMOVUPD t, off(DI)

// EXPECTED4 sets xp at off to fp32(xp + cs*v) for the four fp32 values in
// v (widened): the fp32 fused multiply-add, cs*v being exact in float64.
#define EXPECTED4(v, t, off) \
	VMULPD     Y1, v, t; \
	VADDPD     off(R9), t, t; \
	VCVTPD2PSY t, X15; \
	VCVTPS2PD  X15, t; \
	VMOVUPD    t, off(R9)

// NARROW4 sets v to fp32(x), widened back.
#define NARROW4(x, v) \
	VCVTPD2PSY x, X15; \
	VCVTPS2PD  X15, v

// func weightedSumAVX2(ex *float64, xp *float64, o *float64, l int, splits *int, n int, w *float64, cw *float64, cols int)
//
// weightedSumAVX512 in 256-bit vectors: weightedSumGeneric on columns
// [0, cols), cols%32 == 0 and > 0, n > 0, in its order.
TEXT ·weightedSumAVX2(SB), NOSPLIT, $0-72
	MOVQ l+24(FP), DX
	SHLQ $3, DX // DX: bytes of one split's partial
	MOVQ splits+32(FP), SI
	MOVQ w+48(FP), BX
	MOVQ cw+56(FP), CX
	MOVQ n+40(FP), R11
split:
	MOVQ (SI), AX
	IMULQ DX, AX
	ADDQ o+16(FP), AX // this split's partial
	VBROADCASTSD (BX), Y0 // w
	VBROADCASTSD (CX), Y1 // cs
	MOVQ ex+0(FP), DI
	MOVQ xp+8(FP), R9
	MOVQ cols+64(FP), R13
	SHLQ $3, R13
	ADDQ DI, R13 // the strips end when DI gets here
strip:
	VMOVUPD (AX), Y8
	VMOVUPD 32(AX), Y9
	VMOVUPD 64(AX), Y10
	VMOVUPD 96(AX), Y11
	EXACT4(Y8, Y12, 0)
	EXACT4(Y9, Y13, 32)
	EXACT4(Y10, Y14, 64)
	EXACT4(Y11, Y12, 96)
	NARROW4(Y8, Y8)
	NARROW4(Y9, Y9)
	NARROW4(Y10, Y10)
	NARROW4(Y11, Y11)
	EXPECTED4(Y8, Y12, 0)
	EXPECTED4(Y9, Y13, 32)
	EXPECTED4(Y10, Y14, 64)
	EXPECTED4(Y11, Y12, 96)
	ADDQ $128, AX
	ADDQ $128, DI
	ADDQ $128, R9
	CMPQ DI, R13
	JNE  strip
	ADDQ $8, SI
	ADDQ $8, BX
	ADDQ $8, CX
	DECQ R11
	JNZ  split
	VZEROUPPER
	RET

// func weightedSum32AVX2(ex *float64, xp *float64, o *float32, l int, splits *int, n int, w *float64, cw *float64, cols int)
//
// weightedSum32AVX512 in 256-bit vectors: the fp32 partials widen exactly
// as they load, and fp32(x) is x.
TEXT ·weightedSum32AVX2(SB), NOSPLIT, $0-72
	MOVQ l+24(FP), DX
	SHLQ $2, DX // DX: bytes of one split's partial
	MOVQ splits+32(FP), SI
	MOVQ w+48(FP), BX
	MOVQ cw+56(FP), CX
	MOVQ n+40(FP), R11
split32:
	MOVQ (SI), AX
	IMULQ DX, AX
	ADDQ o+16(FP), AX // this split's partial
	VBROADCASTSD (BX), Y0 // w
	VBROADCASTSD (CX), Y1 // cs
	MOVQ ex+0(FP), DI
	MOVQ xp+8(FP), R9
	MOVQ cols+64(FP), R13
	SHLQ $3, R13
	ADDQ DI, R13 // the strips end when DI gets here
strip32:
	VCVTPS2PD (AX), Y8
	VCVTPS2PD 16(AX), Y9
	VCVTPS2PD 32(AX), Y10
	VCVTPS2PD 48(AX), Y11
	EXACT4(Y8, Y12, 0)
	EXACT4(Y9, Y13, 32)
	EXACT4(Y10, Y14, 64)
	EXACT4(Y11, Y12, 96)
	EXPECTED4(Y8, Y12, 0)
	EXPECTED4(Y9, Y13, 32)
	EXPECTED4(Y10, Y14, 64)
	EXPECTED4(Y11, Y12, 96)
	ADDQ $64, AX
	ADDQ $128, DI
	ADDQ $128, R9
	CMPQ DI, R13
	JNE  strip32
	ADDQ $8, SI
	ADDQ $8, BX
	ADDQ $8, CX
	DECQ R11
	JNZ  split32
	VZEROUPPER
	RET
