//go:build amd64 && !purego

#include "textflag.h"

// The AVX2 twins of kernels.go's loops, for CPUs without AVX-512 (see
// kernels_amd64.go): the AVX-512 kernels' loops in 256-bit vectors and
// sixteen registers. Operand order is Go's: VFMADD231PD Y8, Y10, Y0
// computes Y0 += Y10 * Y8.

// func pvExactAVX2(acc *float64, accStride int, p *float64, pStride int, v *float64, vStride int, nj int, l int, rows int)
//
// pvExactGeneric: a strip of 8 latent columns at a time (its values stay
// in L1 while every row passes over them), four rows at a time in Y0-Y7
// (row r in Y(2r), Y(2r+1)) across the token loop, each product added
// with one rounding, as math.FMA does. nj >= 1, l%32 == 0, rows%4 == 0
// and rows > 0.
TEXT ·pvExactAVX2(SB), NOSPLIT, $8-72
	MOVQ accStride+8(FP), R12
	SHLQ $3, R12 // R12: bytes from one accumulator row to the next
	MOVQ pStride+24(FP), BX
	SHLQ $3, BX // BX: from one probability row to the next
	MOVQ vStride+40(FP), DX
	SHLQ $3, DX // DX: from one value row (token) to the next
	MOVQ l+56(FP), R13
	SHLQ $3, R13
	MOVQ acc+0(FP), DI // DI: row 0's accumulators, this strip
	ADDQ DI, R13 // the strips end when DI gets here
	MOVQ v+32(FP), R8 // R8: token 0's values, this strip
strip:
	MOVQ DI, R9 // R9: this group of four rows' accumulators
	MOVQ p+16(FP), R14 // R14: this group's probabilities
	MOVQ rows+64(FP), R10
	MOVQ R10, 0(SP) // rows left
group:
	LEAQ (R9)(R12*2), R11 // rows 2 and 3
	VMOVUPD (R9), Y0
	VMOVUPD 32(R9), Y1
	VMOVUPD (R9)(R12*1), Y2
	VMOVUPD 32(R9)(R12*1), Y3
	VMOVUPD (R11), Y4
	VMOVUPD 32(R11), Y5
	VMOVUPD (R11)(R12*1), Y6
	VMOVUPD 32(R11)(R12*1), Y7
	MOVQ R14, AX // row 0's probability of token j
	LEAQ (AX)(BX*2), CX // row 2's
	MOVQ R8, R10 // token j's values
	MOVQ nj+48(FP), SI
tok:
	VMOVUPD (R10), Y8
	VMOVUPD 32(R10), Y9
	VBROADCASTSD (AX), Y10
	VBROADCASTSD (AX)(BX*1), Y11
	VBROADCASTSD (CX), Y12
	VBROADCASTSD (CX)(BX*1), Y13
	VFMADD231PD Y8, Y10, Y0
	VFMADD231PD Y9, Y10, Y1
	VFMADD231PD Y8, Y11, Y2
	VFMADD231PD Y9, Y11, Y3
	VFMADD231PD Y8, Y12, Y4
	VFMADD231PD Y9, Y12, Y5
	VFMADD231PD Y8, Y13, Y6
	VFMADD231PD Y9, Y13, Y7
	ADDQ $8, AX
	ADDQ $8, CX
	ADDQ DX, R10
	DECQ SI
	JNZ  tok
	VMOVUPD Y0, (R9)
	VMOVUPD Y1, 32(R9)
	VMOVUPD Y2, (R9)(R12*1)
	VMOVUPD Y3, 32(R9)(R12*1)
	VMOVUPD Y4, (R11)
	VMOVUPD Y5, 32(R11)
	VMOVUPD Y6, (R11)(R12*1)
	VMOVUPD Y7, 32(R11)(R12*1)
	LEAQ (R11)(R12*2), R9 // the next four rows
	LEAQ (R14)(BX*4), R14
	SUBQ $4, 0(SP)
	JNZ  group
	ADDQ $64, DI
	ADDQ $64, R8
	CMPQ DI, R13
	JNE  strip
	VZEROUPPER
	RET

// func pvExpected32AVX2(acc *float32, accStride int, p *float32, pStride int, v *float32, nj int, l int, rows int)
//
// pvExpected32Generic, 16 latent columns a strip, the values [nj][l]. The
// fused multiply-add rounds once, as the generic loop's separate multiply
// (exact here, the caller checks) and add do. nj >= 1, l%64 == 0,
// rows%4 == 0 and rows > 0.
TEXT ·pvExpected32AVX2(SB), NOSPLIT, $8-64
	MOVQ accStride+8(FP), R12
	SHLQ $2, R12 // R12: bytes from one accumulator row to the next
	MOVQ pStride+24(FP), BX
	SHLQ $2, BX // BX: from one probability row to the next
	MOVQ l+48(FP), DX
	SHLQ $2, DX // DX: from one value row (token) to the next
	MOVQ l+48(FP), R13
	SHLQ $2, R13
	MOVQ acc+0(FP), DI // DI: row 0's accumulators, this strip
	ADDQ DI, R13 // the strips end when DI gets here
	MOVQ v+32(FP), R8 // R8: token 0's values, this strip
strip:
	MOVQ DI, R9 // R9: this group of four rows' accumulators
	MOVQ p+16(FP), R14 // R14: this group's probabilities
	MOVQ rows+56(FP), R10
	MOVQ R10, 0(SP) // rows left
group:
	LEAQ (R9)(R12*2), R11 // rows 2 and 3
	VMOVUPS (R9), Y0
	VMOVUPS 32(R9), Y1
	VMOVUPS (R9)(R12*1), Y2
	VMOVUPS 32(R9)(R12*1), Y3
	VMOVUPS (R11), Y4
	VMOVUPS 32(R11), Y5
	VMOVUPS (R11)(R12*1), Y6
	VMOVUPS 32(R11)(R12*1), Y7
	MOVQ R14, AX // row 0's probability of token j
	LEAQ (AX)(BX*2), CX // row 2's
	MOVQ R8, R10 // token j's values
	MOVQ nj+40(FP), SI
tok:
	VMOVUPS (R10), Y8
	VMOVUPS 32(R10), Y9
	VBROADCASTSS (AX), Y10
	VBROADCASTSS (AX)(BX*1), Y11
	VBROADCASTSS (CX), Y12
	VBROADCASTSS (CX)(BX*1), Y13
	VFMADD231PS Y8, Y10, Y0
	VFMADD231PS Y9, Y10, Y1
	VFMADD231PS Y8, Y11, Y2
	VFMADD231PS Y9, Y11, Y3
	VFMADD231PS Y8, Y12, Y4
	VFMADD231PS Y9, Y12, Y5
	VFMADD231PS Y8, Y13, Y6
	VFMADD231PS Y9, Y13, Y7
	ADDQ $4, AX
	ADDQ $4, CX
	ADDQ DX, R10
	DECQ SI
	JNZ  tok
	VMOVUPS Y0, (R9)
	VMOVUPS Y1, 32(R9)
	VMOVUPS Y2, (R9)(R12*1)
	VMOVUPS Y3, 32(R9)(R12*1)
	VMOVUPS Y4, (R11)
	VMOVUPS Y5, 32(R11)
	VMOVUPS Y6, (R11)(R12*1)
	VMOVUPS Y7, 32(R11)(R12*1)
	LEAQ (R11)(R12*2), R9 // the next four rows
	LEAQ (R14)(BX*4), R14
	SUBQ $4, 0(SP)
	JNZ  group
	ADDQ $64, DI
	ADDQ $64, R8
	CMPQ DI, R13
	JNE  strip
	VZEROUPPER
	RET

// func scoresAVX2(qt *float64, stride int, k *float64, d int, nj int, sx *float64, sr *float64, round32 bool, fused bool)
//
// scoresAVX512's blockDot, eight query rows (two vectors of lanes of qt,
// laid out group by group, [stride/8][d][8]: see qtGroup) against two cache rows (k, [nj][d]) at a time: Y0-Y7 hold
// the block sums, token t's even sum in Y(4t), Y(4t+1) (lanes 0-3, 4-7),
// its odd sum in Y(4t+2), Y(4t+3); Y8-Y11 the even and odd positions'
// queries, Y12-Y15 a broadcast cache value and the products. The positions
// are taken in chunks of 128 for all tokens before the next chunk, as
// scoresAVX512 does, so the chunk of the eight rows' queries (8 KB,
// consecutive) stays in L1. stride%16 == 0, d%16 == 0, nj%4 == 0 and nj > 0.
TEXT ·scoresAVX2(SB), NOSPLIT, $32-58
	MOVQ stride+8(FP), SI
	SHLQ $3, SI // SI: bytes from one position of qt to the next, and one token of sx to the next
	MOVQ d+24(FP), DX
	SHLQ $3, DX // DX: bytes of a cache row
	MOVQ $0, 0(SP) // g: byte offset of the lane group
groups:
	MOVQ 0(SP), R11
	CMPQ R11, SI
	JGE  done
	// clear the group's columns of sx and sr
	MOVQ sx+40(FP), R9
	ADDQ R11, R9
	MOVQ sr+48(FP), R10
	ADDQ R11, R10
	MOVQ nj+32(FP), CX
	VXORPD Y12, Y12, Y12
clear:
	VMOVUPD Y12, (R9)
	VMOVUPD Y12, 32(R9)
	VMOVUPD Y12, (R10)
	VMOVUPD Y12, 32(R10)
	ADDQ SI, R9
	ADDQ SI, R10
	DECQ CX
	JNZ  clear
	MOVQ $0, 16(SP) // c0: byte offset of the chunk of positions in a cache row
chunks:
	MOVQ 16(SP), R12
	CMPQ R12, DX
	JGE  nextgroup
	MOVQ DX, R13
	SUBQ R12, R13
	MOVQ $1024, AX
	CMPQ R13, AX
	CMOVQGT AX, R13
	MOVQ R13, 24(SP) // the chunk's bytes: 128 positions or what is left
	MOVQ $0, 8(SP) // token j
tokens:
	MOVQ 8(SP), R12
	CMPQ R12, nj+32(FP)
	JGE  nextchunk
	MOVQ R12, AX
	IMULQ DX, AX
	ADDQ k+16(FP), AX
	ADDQ 16(SP), AX // AX: token j's row at position i; (AX)(DX*1) token j+1's
	MOVQ AX, R12
	ADDQ 24(SP), R12 // the chunk ends when AX gets here
	MOVQ 8(SP), R9
	IMULQ SI, R9
	ADDQ 0(SP), R9
	MOVQ R9, R10
	ADDQ sx+40(FP), R9 // R9: sx of token j, this lane group
	ADDQ sr+48(FP), R10 // R10: sr of token j
	MOVQ 0(SP), R11
	IMULQ d+24(FP), R11 // the group's rows: g/64 groups of d positions of 64 bytes
	MOVQ 16(SP), R13
	SHLQ $3, R13 // position i's 64 bytes
	ADDQ R13, R11
	ADDQ qt+0(FP), R11 // R11: qt at position i, this lane group
block:
	VXORPD Y0, Y0, Y0
	VXORPD Y1, Y1, Y1
	VXORPD Y2, Y2, Y2
	VXORPD Y3, Y3, Y3
	VXORPD Y4, Y4, Y4
	VXORPD Y5, Y5, Y5
	VXORPD Y6, Y6, Y6
	VXORPD Y7, Y7, Y7
	LEAQ 128(AX), R13 // end of this block of MMAK = 16 positions
	CMPB fused+57(FP), $0
	JNE  fusedpair
pair:
	VMOVUPD (R11), Y8 // even position, lanes 0-3
	VMOVUPD 32(R11), Y9 // lanes 4-7
	VMOVUPD 64(R11), Y10 // odd position
	VMOVUPD 96(R11), Y11
	VBROADCASTSD (AX), Y12
	VMULPD Y12, Y8, Y13
	VMULPD Y12, Y9, Y12
	VADDPD Y13, Y0, Y0
	VADDPD Y12, Y1, Y1
	VBROADCASTSD 8(AX), Y14
	VMULPD Y14, Y10, Y15
	VMULPD Y14, Y11, Y14
	VADDPD Y15, Y2, Y2
	VADDPD Y14, Y3, Y3
	VBROADCASTSD (AX)(DX*1), Y12
	VMULPD Y12, Y8, Y13
	VMULPD Y12, Y9, Y12
	VADDPD Y13, Y4, Y4
	VADDPD Y12, Y5, Y5
	VBROADCASTSD 8(AX)(DX*1), Y14
	VMULPD Y14, Y10, Y15
	VMULPD Y14, Y11, Y14
	VADDPD Y15, Y6, Y6
	VADDPD Y14, Y7, Y7
	ADDQ $128, R11
	ADDQ $16, AX
	CMPQ AX, R13
	JNE  pair
	JMP  blockend
fusedpair:
	VMOVUPD (R11), Y8 // even position, lanes 0-3
	VMOVUPD 32(R11), Y9 // lanes 4-7
	VMOVUPD 64(R11), Y10 // odd position
	VMOVUPD 96(R11), Y11
	VBROADCASTSD (AX), Y12
	VBROADCASTSD 8(AX), Y13
	VBROADCASTSD (AX)(DX*1), Y14
	VBROADCASTSD 8(AX)(DX*1), Y15
	VFMADD231PD Y12, Y8, Y0
	VFMADD231PD Y12, Y9, Y1
	VFMADD231PD Y13, Y10, Y2
	VFMADD231PD Y13, Y11, Y3
	VFMADD231PD Y14, Y8, Y4
	VFMADD231PD Y14, Y9, Y5
	VFMADD231PD Y15, Y10, Y6
	VFMADD231PD Y15, Y11, Y7
	ADDQ $128, R11
	ADDQ $16, AX
	CMPQ AX, R13
	JNE  fusedpair
blockend:
	// b = s0 + s1, into Y(4t), Y(4t+1)
	VADDPD Y2, Y0, Y0
	VADDPD Y3, Y1, Y1
	VADDPD Y6, Y4, Y4
	VADDPD Y7, Y5, Y5
	// exact += b
	VADDPD (R9), Y0, Y12
	VMOVUPD Y12, (R9)
	VADDPD 32(R9), Y1, Y12
	VMOVUPD Y12, 32(R9)
	VADDPD (R9)(SI*1), Y4, Y12
	VMOVUPD Y12, (R9)(SI*1)
	VADDPD 32(R9)(SI*1), Y5, Y12
	VMOVUPD Y12, 32(R9)(SI*1)
	// expected = round(expected + b)
	VADDPD (R10), Y0, Y0
	VADDPD 32(R10), Y1, Y1
	VADDPD (R10)(SI*1), Y4, Y4
	VADDPD 32(R10)(SI*1), Y5, Y5
	CMPB round32+56(FP), $0
	JEQ  store
	VCVTPD2PSY Y0, X0
	VCVTPS2PD X0, Y0
	VCVTPD2PSY Y1, X1
	VCVTPS2PD X1, Y1
	VCVTPD2PSY Y4, X4
	VCVTPS2PD X4, Y4
	VCVTPD2PSY Y5, X5
	VCVTPS2PD X5, Y5
store:
	VMOVUPD Y0, (R10)
	VMOVUPD Y1, 32(R10)
	VMOVUPD Y4, (R10)(SI*1)
	VMOVUPD Y5, 32(R10)(SI*1)
	CMPQ AX, R12
	JNE  block
	MOVQ 8(SP), R12
	ADDQ $2, R12
	MOVQ R12, 8(SP)
	JMP  tokens
nextchunk:
	MOVQ 16(SP), R12
	ADDQ 24(SP), R12
	MOVQ R12, 16(SP)
	JMP  chunks
nextgroup:
	MOVQ 0(SP), R11
	ADDQ $64, R11
	MOVQ R11, 0(SP)
	JMP  groups
done:
	VZEROUPPER
	RET

// func narrowAVX2(dst *float32, src *float64, n int, lo float64) float64
//
// narrowAVX512 in 256-bit vectors, eight values a pass: without mask
// registers, a lane's minimum is taken where its value is nonzero by a
// blend. A minimum does not depend on order, so two running minima are
// kept and reduced at the end; a NaN is never taken (VMINPD returns its
// second operand, the minimum so far, when either is NaN).
TEXT ·narrowAVX2(SB), NOSPLIT, $0-40
	MOVQ         dst+0(FP), DI
	MOVQ         src+8(FP), SI
	MOVQ         n+16(FP), CX
	VBROADCASTSD lo+24(FP), Y2
	VMOVAPD      Y2, Y7
	VXORPD       Y3, Y3, Y3
	MOVQ         $0x7FFFFFFFFFFFFFFF, AX
	MOVQ         AX, X4
	VPBROADCASTQ X4, Y4
narrowloop:
	VMOVUPD    (SI), Y0
	VMOVUPD    32(SI), Y8
	VCVTPD2PSY Y0, X1
	VCVTPD2PSY Y8, X9
	VMOVUPS    X1, (DI)
	VMOVUPS    X9, 16(DI)
	VANDPD     Y4, Y0, Y0
	VANDPD     Y4, Y8, Y8
	VCMPPD     $4, Y3, Y0, Y5
	VCMPPD     $4, Y3, Y8, Y10
	VMINPD     Y2, Y0, Y6
	VMINPD     Y7, Y8, Y11
	VBLENDVPD  Y5, Y6, Y2, Y2
	VBLENDVPD  Y10, Y11, Y7, Y7
	ADDQ       $64, SI
	ADDQ       $32, DI
	SUBQ       $8, CX
	JNZ        narrowloop
	VMINPD       Y7, Y2, Y2
	VEXTRACTF128 $1, Y2, X5
	VMINPD       X5, X2, X2
	VPERMILPD    $1, X2, X5
	VMINPD       X5, X2, X2
	MOVSD        X2, ret+32(FP)
	VZEROUPPER
	RET

// func widenF32AVX2(dst *float64, src *float32, n int)
//
// widenF32Generic for n values, n%8 == 0 and n > 0.
TEXT ·widenF32AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
widenloop:
	VCVTPS2PD (SI), Y0
	VCVTPS2PD 16(SI), Y1
	VMOVUPD   Y0, (DI)
	VMOVUPD   Y1, 32(DI)
	ADDQ      $32, SI
	ADDQ      $64, DI
	SUBQ      $8, CX
	JNZ       widenloop
	VZEROUPPER
	RET

// func expVecAVX2(dst *float64, src *float64, n int)
//
// expVecAVX512 in 256-bit vectors, four values a pass, expDef's operations
// lane by lane. Sixteen registers hold the constants but not the Taylor
// coefficients too: each is broadcast from expTaylor as its step comes.
TEXT ·expVecAVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVQ $0x3ff71547652b82fe, AX
	MOVQ AX, X8
	VPBROADCASTQ X8, Y8 // log2e
	MOVQ $0x4338000000000000, AX
	MOVQ AX, X9
	VPBROADCASTQ X9, Y9 // the magic 0x1.8p52
	MOVQ $0x3fe62e42fefa39ef, AX
	MOVQ AX, X10
	VPBROADCASTQ X10, Y10 // ln2hi
	MOVQ $0x3c7abc9e3b39803f, AX
	MOVQ AX, X11
	VPBROADCASTQ X11, Y11 // ln2lo
	MOVQ $0x3ff0000000000000, AX
	MOVQ AX, X12
	VPBROADCASTQ X12, Y12 // 1023<<52
	MOVQ $0x4086280000000000, AX
	MOVQ AX, X13
	VPBROADCASTQ X13, Y13 // 709
	MOVQ $0xc086200000000000, AX
	MOVQ AX, X14
	VPBROADCASTQ X14, Y14 // -708
	MOVQ $0x7ff0000000000000, AX
	MOVQ AX, X15
	VPBROADCASTQ X15, Y15 // +Inf
	VXORPD Y6, Y6, Y6
exploop2:
	VMOVUPD (SI), Y0
	VMULPD Y8, Y0, Y1
	VADDPD Y9, Y1, Y1 // t = x*log2e + magic
	VSUBPD Y9, Y1, Y2 // n
	VMOVAPD Y0, Y3
	VFNMADD231PD Y10, Y2, Y3 // r = x - n*ln2hi
	VFNMADD231PD Y11, Y2, Y3 // r -= n*ln2lo
	VBROADCASTSD ·expTaylor+0(SB), Y4
	VBROADCASTSD ·expTaylor+8(SB), Y7
	VFMADD213PD Y7, Y3, Y4
	VBROADCASTSD ·expTaylor+16(SB), Y7
	VFMADD213PD Y7, Y3, Y4
	VBROADCASTSD ·expTaylor+24(SB), Y7
	VFMADD213PD Y7, Y3, Y4
	VBROADCASTSD ·expTaylor+32(SB), Y7
	VFMADD213PD Y7, Y3, Y4
	VBROADCASTSD ·expTaylor+40(SB), Y7
	VFMADD213PD Y7, Y3, Y4
	VBROADCASTSD ·expTaylor+48(SB), Y7
	VFMADD213PD Y7, Y3, Y4
	VBROADCASTSD ·expTaylor+56(SB), Y7
	VFMADD213PD Y7, Y3, Y4
	VBROADCASTSD ·expTaylor+64(SB), Y7
	VFMADD213PD Y7, Y3, Y4
	VBROADCASTSD ·expTaylor+72(SB), Y7
	VFMADD213PD Y7, Y3, Y4
	VBROADCASTSD ·expTaylor+80(SB), Y7
	VFMADD213PD Y7, Y3, Y4
	VBROADCASTSD ·expTaylor+88(SB), Y7
	VFMADD213PD Y7, Y3, Y4
	VBROADCASTSD ·expTaylor+96(SB), Y7
	VFMADD213PD Y7, Y3, Y4
	VBROADCASTSD ·expTaylor+104(SB), Y7
	VFMADD213PD Y7, Y3, Y4
	VPSLLQ $52, Y1, Y5
	VPADDQ Y12, Y5, Y5 // 2^n
	VMULPD Y5, Y4, Y4
	VCMPPD $0x1e, Y13, Y0, Y7 // x > 709
	VBLENDVPD Y7, Y15, Y4, Y4
	VCMPPD $0x11, Y14, Y0, Y7 // x < -708
	VBLENDVPD Y7, Y6, Y4, Y4
	VMOVUPD Y4, (DI)
	ADDQ $32, SI
	ADDQ $32, DI
	SUBQ $4, CX
	JNZ  exploop2
	VZEROUPPER
	RET

// exp2fAVX2Consts are exp2fVecAVX512's constants, four lanes each, for
// memory operands: sixteen registers do not hold them all beside the
// work. In order: the magic 0x1.8p52, ln2, 1023<<52, -149, 127, 1+2^-48,
// 1-2^-48 (rounded to float64: the neighbours of y), -150, 2^-149.
DATA exp2fAVX2Consts<>+0(SB)/8, $0x4338000000000000
DATA exp2fAVX2Consts<>+8(SB)/8, $0x4338000000000000
DATA exp2fAVX2Consts<>+16(SB)/8, $0x4338000000000000
DATA exp2fAVX2Consts<>+24(SB)/8, $0x4338000000000000
DATA exp2fAVX2Consts<>+32(SB)/8, $0x3fe62e42fefa39ef
DATA exp2fAVX2Consts<>+40(SB)/8, $0x3fe62e42fefa39ef
DATA exp2fAVX2Consts<>+48(SB)/8, $0x3fe62e42fefa39ef
DATA exp2fAVX2Consts<>+56(SB)/8, $0x3fe62e42fefa39ef
DATA exp2fAVX2Consts<>+64(SB)/8, $0x3ff0000000000000
DATA exp2fAVX2Consts<>+72(SB)/8, $0x3ff0000000000000
DATA exp2fAVX2Consts<>+80(SB)/8, $0x3ff0000000000000
DATA exp2fAVX2Consts<>+88(SB)/8, $0x3ff0000000000000
DATA exp2fAVX2Consts<>+96(SB)/8, $0xc062a00000000000
DATA exp2fAVX2Consts<>+104(SB)/8, $0xc062a00000000000
DATA exp2fAVX2Consts<>+112(SB)/8, $0xc062a00000000000
DATA exp2fAVX2Consts<>+120(SB)/8, $0xc062a00000000000
DATA exp2fAVX2Consts<>+128(SB)/8, $0x405fc00000000000
DATA exp2fAVX2Consts<>+136(SB)/8, $0x405fc00000000000
DATA exp2fAVX2Consts<>+144(SB)/8, $0x405fc00000000000
DATA exp2fAVX2Consts<>+152(SB)/8, $0x405fc00000000000
DATA exp2fAVX2Consts<>+160(SB)/8, $0x3ff0000000000010
DATA exp2fAVX2Consts<>+168(SB)/8, $0x3ff0000000000010
DATA exp2fAVX2Consts<>+176(SB)/8, $0x3ff0000000000010
DATA exp2fAVX2Consts<>+184(SB)/8, $0x3ff0000000000010
DATA exp2fAVX2Consts<>+192(SB)/8, $0x3fefffffffffffe0
DATA exp2fAVX2Consts<>+200(SB)/8, $0x3fefffffffffffe0
DATA exp2fAVX2Consts<>+208(SB)/8, $0x3fefffffffffffe0
DATA exp2fAVX2Consts<>+216(SB)/8, $0x3fefffffffffffe0
DATA exp2fAVX2Consts<>+224(SB)/8, $0xc062c00000000000
DATA exp2fAVX2Consts<>+232(SB)/8, $0xc062c00000000000
DATA exp2fAVX2Consts<>+240(SB)/8, $0xc062c00000000000
DATA exp2fAVX2Consts<>+248(SB)/8, $0xc062c00000000000
DATA exp2fAVX2Consts<>+256(SB)/8, $0x36a0000000000000
DATA exp2fAVX2Consts<>+264(SB)/8, $0x36a0000000000000
DATA exp2fAVX2Consts<>+272(SB)/8, $0x36a0000000000000
DATA exp2fAVX2Consts<>+280(SB)/8, $0x36a0000000000000
GLOBL exp2fAVX2Consts<>(SB), RODATA|NOPTR, $288

// func exp2fVecAVX2(dst *float64, src *float64, n int) int
//
// exp2fVecAVX512 in 256-bit vectors, four values a pass: the same
// arithmetic and the same test of whether a lane's rounding is settled,
// its masks vectors (a compare's all-ones lanes) where AVX-512 has mask
// registers. It returns how many lanes it could not settle.
TEXT ·exp2fVecAVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	XORQ R8, R8
	VXORPD Y12, Y12, Y12
exp2floop2:
	VMOVUPD (SI), Y0
	VCVTPD2PSY Y0, X0
	VCVTPS2PD X0, Y0 // x = fp32(x)
	VADDPD exp2fAVX2Consts<>+0(SB), Y0, Y1
	VSUBPD exp2fAVX2Consts<>+0(SB), Y1, Y2 // n = round(x)
	VSUBPD Y2, Y0, Y3 // f = x - n, exact
	VMULPD exp2fAVX2Consts<>+32(SB), Y3, Y3 // u = f*ln2
	VBROADCASTSD ·expTaylor+0(SB), Y4
	VBROADCASTSD ·expTaylor+8(SB), Y8
	VFMADD213PD Y8, Y3, Y4
	VBROADCASTSD ·expTaylor+16(SB), Y8
	VFMADD213PD Y8, Y3, Y4
	VBROADCASTSD ·expTaylor+24(SB), Y8
	VFMADD213PD Y8, Y3, Y4
	VBROADCASTSD ·expTaylor+32(SB), Y8
	VFMADD213PD Y8, Y3, Y4
	VBROADCASTSD ·expTaylor+40(SB), Y8
	VFMADD213PD Y8, Y3, Y4
	VBROADCASTSD ·expTaylor+48(SB), Y8
	VFMADD213PD Y8, Y3, Y4
	VBROADCASTSD ·expTaylor+56(SB), Y8
	VFMADD213PD Y8, Y3, Y4
	VBROADCASTSD ·expTaylor+64(SB), Y8
	VFMADD213PD Y8, Y3, Y4
	VBROADCASTSD ·expTaylor+72(SB), Y8
	VFMADD213PD Y8, Y3, Y4
	VBROADCASTSD ·expTaylor+80(SB), Y8
	VFMADD213PD Y8, Y3, Y4
	VBROADCASTSD ·expTaylor+88(SB), Y8
	VFMADD213PD Y8, Y3, Y4
	VBROADCASTSD ·expTaylor+96(SB), Y8
	VFMADD213PD Y8, Y3, Y4
	VBROADCASTSD ·expTaylor+104(SB), Y8
	VFMADD213PD Y8, Y3, Y4
	VPSLLQ $52, Y1, Y5
	VPADDQ exp2fAVX2Consts<>+64(SB), Y5, Y5 // 2^n
	VMULPD Y5, Y4, Y4 // y
	VCVTPD2PSY Y4, X6
	VMULPD exp2fAVX2Consts<>+160(SB), Y4, Y7
	VCVTPD2PSY Y7, X7
	VMULPD exp2fAVX2Consts<>+192(SB), Y4, Y5
	VCVTPD2PSY Y5, X5
	VPCMPEQD X7, X6, X7
	VPCMPEQD X5, X6, X5
	VPAND X5, X7, X7
	VPMOVSXDQ X7, Y7 // both neighbours round as y does, in the value's 64-bit lane
	VCMPPD $0x1d, exp2fAVX2Consts<>+96(SB), Y0, Y9 // x >= -149
	VANDPD Y9, Y7, Y7
	VCMPPD $0x12, exp2fAVX2Consts<>+128(SB), Y0, Y9 // x <= 127
	VANDPD Y9, Y7, Y7 // settled by the polynomial
	VCVTPS2PD X6, Y6
	VCMPPD $0x11, exp2fAVX2Consts<>+96(SB), Y0, Y10 // x < -149
	VCMPPD $0x1e, exp2fAVX2Consts<>+224(SB), Y0, Y11 // x > -150
	VANDPD Y10, Y11, Y11
	VBLENDVPD Y10, Y12, Y6, Y6 // 0 below -149
	VBLENDVPD Y11, exp2fAVX2Consts<>+256(SB), Y6, Y6 // 2^-149 between -150 and -149
	VMOVUPD Y6, (DI)
	VORPD Y10, Y7, Y7
	VMOVMSKPD Y7, AX
	XORL $0xf, AX
	POPCNTL AX, AX
	ADDQ AX, R8
	ADDQ $32, SI
	ADDQ $32, DI
	SUBQ $4, CX
	JNZ  exp2floop2
	MOVQ R8, ret+24(FP)
	VZEROUPPER
	RET
