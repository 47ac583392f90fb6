//go:build amd64 && !purego

#include "textflag.h"

// func weightedSumAVX512(ex *float64, xp *float64, o *float64, l int, splits *int, n int, w *float64, cw *float64, cols int)
//
// weightedSumGeneric on columns [0, cols), cols%32 == 0 and > 0, n > 0,
// in its order: split by split, each split's partial read front to back
// (the row's partials stream from memory in address order, which the
// prefetchers follow; ex and xp stay in L1), 32 columns an iteration.
TEXT ·weightedSumAVX512(SB), NOSPLIT, $0-72
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
	VBROADCASTSD (BX), Z30 // w
	VBROADCASTSD (CX), Z31 // cs
	MOVQ ex+0(FP), DI
	MOVQ xp+8(FP), R9
	MOVQ cols+64(FP), R13
	SHLQ $3, R13
	ADDQ DI, R13 // the strips end when DI gets here
strip:
	VMOVUPD (AX), Z8
	VMOVUPD 64(AX), Z9
	VMOVUPD 128(AX), Z10
	VMOVUPD 192(AX), Z11
	VMULPD Z30, Z8, Z12
	VADDPD (DI), Z12, Z12 // ex + w*x
	VMOVUPD Z12, (DI)
	VMULPD Z30, Z9, Z13
	VADDPD 64(DI), Z13, Z13 // ex + w*x
	VMOVUPD Z13, 64(DI)
	VMULPD Z30, Z10, Z14
	VADDPD 128(DI), Z14, Z14 // ex + w*x
	VMOVUPD Z14, 128(DI)
	VMULPD Z30, Z11, Z15
	VADDPD 192(DI), Z15, Z15 // ex + w*x
	VMOVUPD Z15, 192(DI)
	VCVTPD2PS Z8, Y16
	VCVTPS2PD Y16, Z16 // fp32(x)
	VMULPD Z31, Z16, Z16
	VADDPD (R9), Z16, Z16
	VCVTPD2PS Z16, Y16
	VCVTPS2PD Y16, Z16 // fp32(xp + cs*fp32(x))
	VMOVUPD Z16, (R9)
	VCVTPD2PS Z9, Y17
	VCVTPS2PD Y17, Z17 // fp32(x)
	VMULPD Z31, Z17, Z17
	VADDPD 64(R9), Z17, Z17
	VCVTPD2PS Z17, Y17
	VCVTPS2PD Y17, Z17 // fp32(xp + cs*fp32(x))
	VMOVUPD Z17, 64(R9)
	VCVTPD2PS Z10, Y18
	VCVTPS2PD Y18, Z18 // fp32(x)
	VMULPD Z31, Z18, Z18
	VADDPD 128(R9), Z18, Z18
	VCVTPD2PS Z18, Y18
	VCVTPS2PD Y18, Z18 // fp32(xp + cs*fp32(x))
	VMOVUPD Z18, 128(R9)
	VCVTPD2PS Z11, Y19
	VCVTPS2PD Y19, Z19 // fp32(x)
	VMULPD Z31, Z19, Z19
	VADDPD 192(R9), Z19, Z19
	VCVTPD2PS Z19, Y19
	VCVTPS2PD Y19, Z19 // fp32(xp + cs*fp32(x))
	VMOVUPD Z19, 192(R9)
	ADDQ $256, AX
	ADDQ $256, DI
	ADDQ $256, R9
	CMPQ DI, R13
	JNE  strip
	ADDQ $8, SI
	ADDQ $8, BX
	ADDQ $8, CX
	DECQ R11
	JNZ  split
	VZEROUPPER
	RET

// func weightedSum32AVX512(ex *float64, xp *float64, o *float32, l int, splits *int, n int, w *float64, cw *float64, cols int)
//
// weightedSum32Generic as weightedSumAVX512 does weightedSumGeneric: the
// fp32 partials widen exactly as they load, and fp32(x) is x.
TEXT ·weightedSum32AVX512(SB), NOSPLIT, $0-72
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
	VBROADCASTSD (BX), Z30 // w
	VBROADCASTSD (CX), Z31 // cs
	MOVQ ex+0(FP), DI
	MOVQ xp+8(FP), R9
	MOVQ cols+64(FP), R13
	SHLQ $3, R13
	ADDQ DI, R13 // the strips end when DI gets here
strip32:
	VCVTPS2PD (AX), Z8
	VCVTPS2PD 32(AX), Z9
	VCVTPS2PD 64(AX), Z10
	VCVTPS2PD 96(AX), Z11
	VMULPD Z30, Z8, Z12
	VADDPD (DI), Z12, Z12 // ex + w*x
	VMOVUPD Z12, (DI)
	VMULPD Z30, Z9, Z13
	VADDPD 64(DI), Z13, Z13 // ex + w*x
	VMOVUPD Z13, 64(DI)
	VMULPD Z30, Z10, Z14
	VADDPD 128(DI), Z14, Z14 // ex + w*x
	VMOVUPD Z14, 128(DI)
	VMULPD Z30, Z11, Z15
	VADDPD 192(DI), Z15, Z15 // ex + w*x
	VMOVUPD Z15, 192(DI)
	VMULPD Z31, Z8, Z16
	VADDPD (R9), Z16, Z16
	VCVTPD2PS Z16, Y16
	VCVTPS2PD Y16, Z16 // fp32(xp + cs*x)
	VMOVUPD Z16, (R9)
	VMULPD Z31, Z9, Z17
	VADDPD 64(R9), Z17, Z17
	VCVTPD2PS Z17, Y17
	VCVTPS2PD Y17, Z17 // fp32(xp + cs*x)
	VMOVUPD Z17, 64(R9)
	VMULPD Z31, Z10, Z18
	VADDPD 128(R9), Z18, Z18
	VCVTPD2PS Z18, Y18
	VCVTPS2PD Y18, Z18 // fp32(xp + cs*x)
	VMOVUPD Z18, 128(R9)
	VMULPD Z31, Z11, Z19
	VADDPD 192(R9), Z19, Z19
	VCVTPD2PS Z19, Y19
	VCVTPS2PD Y19, Z19 // fp32(xp + cs*x)
	VMOVUPD Z19, 192(R9)
	ADDQ $128, AX
	ADDQ $256, DI
	ADDQ $256, R9
	CMPQ DI, R13
	JNE  strip32
	ADDQ $8, SI
	ADDQ $8, BX
	ADDQ $8, CX
	DECQ R11
	JNZ  split32
	VZEROUPPER
	RET
