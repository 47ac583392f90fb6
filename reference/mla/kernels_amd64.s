//go:build amd64 && !purego

#include "textflag.h"

// The AVX-512 twins of kernels.go's loops. Operand order is Go's: the
// destination last, VMULPD src2, src1, dst computes dst = src1 * src2.

// func scoresAVX512(qt *float64, stride int, k *float64, d int, nj int, sx *float64, sr *float64, round32 bool, fused bool)
//
// blockDot of sixteen query rows (two vectors of lanes of qt, [d][stride])
// against four cache rows (k, [nj][d]) at a time. Z0-Z15 hold the block
// sums: token t's even sum in Z(4t), Z(4t+1) (lanes 0-7, 8-15), its odd
// sum in Z(4t+2), Z(4t+3). sx and sr ([nj][stride]) carry Exact and
// Expected from block to block, so the positions are taken in chunks of
// 128 (eight blocks) for all tokens before the next chunk: the chunk of
// the sixteen rows' queries (16 KB) then stays in L1 while the tokens
// pass. stride%16 == 0, d%16 == 0, nj%4 == 0 and nj > 0.
//
// With fused, each product and its addition are one instruction: the
// same bits when every product q·k is exact in float64, which the caller
// has checked. The two inner loops differ in that alone.
TEXT ·scoresAVX512(SB), NOSPLIT, $32-58
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
	VPXORQ Z20, Z20, Z20
clear:
	VMOVUPD Z20, (R9)
	VMOVUPD Z20, 64(R9)
	VMOVUPD Z20, (R10)
	VMOVUPD Z20, 64(R10)
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
	LEAQ (AX)(DX*2), BX // BX: token j+2's; (BX)(DX*1) token j+3's
	MOVQ AX, R12
	ADDQ 24(SP), R12 // the chunk ends when AX gets here
	MOVQ 8(SP), R9
	IMULQ SI, R9
	ADDQ 0(SP), R9
	MOVQ R9, R10
	ADDQ sx+40(FP), R9 // R9: sx of token j, this lane group
	ADDQ sr+48(FP), R10 // R10: sr of token j
	MOVQ 16(SP), R11
	SHRQ $3, R11
	IMULQ SI, R11
	ADDQ qt+0(FP), R11
	ADDQ 0(SP), R11 // R11: qt at position i, this lane group
block:
	VPXORQ Z0, Z0, Z0
	VPXORQ Z1, Z1, Z1
	VPXORQ Z2, Z2, Z2
	VPXORQ Z3, Z3, Z3
	VPXORQ Z4, Z4, Z4
	VPXORQ Z5, Z5, Z5
	VPXORQ Z6, Z6, Z6
	VPXORQ Z7, Z7, Z7
	VPXORQ Z8, Z8, Z8
	VPXORQ Z9, Z9, Z9
	VPXORQ Z10, Z10, Z10
	VPXORQ Z11, Z11, Z11
	VPXORQ Z12, Z12, Z12
	VPXORQ Z13, Z13, Z13
	VPXORQ Z14, Z14, Z14
	VPXORQ Z15, Z15, Z15
	LEAQ 128(AX), R13 // end of this block of MMAK = 16 positions
	CMPB fused+57(FP), $0
	JNE  fusedpair
pair:
	VMOVUPD (R11), Z16 // even position, lanes 0-7
	VMOVUPD 64(R11), Z17 // lanes 8-15
	VMOVUPD (R11)(SI*1), Z18 // odd position
	VMOVUPD 64(R11)(SI*1), Z19
	VMULPD.BCST (AX), Z16, Z20
	VMULPD.BCST (AX), Z17, Z21
	VMULPD.BCST 8(AX), Z18, Z22
	VMULPD.BCST 8(AX), Z19, Z23
	VADDPD Z20, Z0, Z0
	VADDPD Z21, Z1, Z1
	VADDPD Z22, Z2, Z2
	VADDPD Z23, Z3, Z3
	VMULPD.BCST (AX)(DX*1), Z16, Z24
	VMULPD.BCST (AX)(DX*1), Z17, Z25
	VMULPD.BCST 8(AX)(DX*1), Z18, Z26
	VMULPD.BCST 8(AX)(DX*1), Z19, Z27
	VADDPD Z24, Z4, Z4
	VADDPD Z25, Z5, Z5
	VADDPD Z26, Z6, Z6
	VADDPD Z27, Z7, Z7
	VMULPD.BCST (BX), Z16, Z20
	VMULPD.BCST (BX), Z17, Z21
	VMULPD.BCST 8(BX), Z18, Z22
	VMULPD.BCST 8(BX), Z19, Z23
	VADDPD Z20, Z8, Z8
	VADDPD Z21, Z9, Z9
	VADDPD Z22, Z10, Z10
	VADDPD Z23, Z11, Z11
	VMULPD.BCST (BX)(DX*1), Z16, Z24
	VMULPD.BCST (BX)(DX*1), Z17, Z25
	VMULPD.BCST 8(BX)(DX*1), Z18, Z26
	VMULPD.BCST 8(BX)(DX*1), Z19, Z27
	VADDPD Z24, Z12, Z12
	VADDPD Z25, Z13, Z13
	VADDPD Z26, Z14, Z14
	VADDPD Z27, Z15, Z15
	LEAQ (R11)(SI*2), R11
	ADDQ $16, AX
	ADDQ $16, BX
	CMPQ AX, R13
	JNE  pair
	JMP  blockend
fusedpair:
	VMOVUPD (R11), Z16 // even position, lanes 0-7
	VMOVUPD 64(R11), Z17 // lanes 8-15
	VMOVUPD (R11)(SI*1), Z18 // odd position
	VMOVUPD 64(R11)(SI*1), Z19
	VFMADD231PD.BCST (AX), Z16, Z0
	VFMADD231PD.BCST (AX), Z17, Z1
	VFMADD231PD.BCST 8(AX), Z18, Z2
	VFMADD231PD.BCST 8(AX), Z19, Z3
	VFMADD231PD.BCST (AX)(DX*1), Z16, Z4
	VFMADD231PD.BCST (AX)(DX*1), Z17, Z5
	VFMADD231PD.BCST 8(AX)(DX*1), Z18, Z6
	VFMADD231PD.BCST 8(AX)(DX*1), Z19, Z7
	VFMADD231PD.BCST (BX), Z16, Z8
	VFMADD231PD.BCST (BX), Z17, Z9
	VFMADD231PD.BCST 8(BX), Z18, Z10
	VFMADD231PD.BCST 8(BX), Z19, Z11
	VFMADD231PD.BCST (BX)(DX*1), Z16, Z12
	VFMADD231PD.BCST (BX)(DX*1), Z17, Z13
	VFMADD231PD.BCST 8(BX)(DX*1), Z18, Z14
	VFMADD231PD.BCST 8(BX)(DX*1), Z19, Z15
	LEAQ (R11)(SI*2), R11
	ADDQ $16, AX
	ADDQ $16, BX
	CMPQ AX, R13
	JNE  fusedpair
blockend:
	// b = s0 + s1, into Z(4t), Z(4t+1)
	VADDPD Z2, Z0, Z0
	VADDPD Z3, Z1, Z1
	VADDPD Z6, Z4, Z4
	VADDPD Z7, Z5, Z5
	VADDPD Z10, Z8, Z8
	VADDPD Z11, Z9, Z9
	VADDPD Z14, Z12, Z12
	VADDPD Z15, Z13, Z13
	// exact += b
	LEAQ (R9)(SI*2), CX
	VADDPD (R9), Z0, Z16
	VMOVUPD Z16, (R9)
	VADDPD 64(R9), Z1, Z16
	VMOVUPD Z16, 64(R9)
	VADDPD (R9)(SI*1), Z4, Z16
	VMOVUPD Z16, (R9)(SI*1)
	VADDPD 64(R9)(SI*1), Z5, Z16
	VMOVUPD Z16, 64(R9)(SI*1)
	VADDPD (CX), Z8, Z16
	VMOVUPD Z16, (CX)
	VADDPD 64(CX), Z9, Z16
	VMOVUPD Z16, 64(CX)
	VADDPD (CX)(SI*1), Z12, Z16
	VMOVUPD Z16, (CX)(SI*1)
	VADDPD 64(CX)(SI*1), Z13, Z16
	VMOVUPD Z16, 64(CX)(SI*1)
	// expected = round(expected + b)
	LEAQ (R10)(SI*2), DI
	VADDPD (R10), Z0, Z0
	VADDPD 64(R10), Z1, Z1
	VADDPD (R10)(SI*1), Z4, Z4
	VADDPD 64(R10)(SI*1), Z5, Z5
	VADDPD (DI), Z8, Z8
	VADDPD 64(DI), Z9, Z9
	VADDPD (DI)(SI*1), Z12, Z12
	VADDPD 64(DI)(SI*1), Z13, Z13
	CMPB round32+56(FP), $0
	JEQ  store
	VCVTPD2PS Z0, Y0
	VCVTPS2PD Y0, Z0
	VCVTPD2PS Z1, Y1
	VCVTPS2PD Y1, Z1
	VCVTPD2PS Z4, Y4
	VCVTPS2PD Y4, Z4
	VCVTPD2PS Z5, Y5
	VCVTPS2PD Y5, Z5
	VCVTPD2PS Z8, Y8
	VCVTPS2PD Y8, Z8
	VCVTPD2PS Z9, Y9
	VCVTPS2PD Y9, Z9
	VCVTPD2PS Z12, Y12
	VCVTPS2PD Y12, Z12
	VCVTPD2PS Z13, Y13
	VCVTPS2PD Y13, Z13
store:
	VMOVUPD Z0, (R10)
	VMOVUPD Z1, 64(R10)
	VMOVUPD Z4, (R10)(SI*1)
	VMOVUPD Z5, 64(R10)(SI*1)
	VMOVUPD Z8, (DI)
	VMOVUPD Z9, 64(DI)
	VMOVUPD Z12, (DI)(SI*1)
	VMOVUPD Z13, 64(DI)(SI*1)
	CMPQ AX, R12
	JNE  block
	MOVQ 8(SP), R12
	ADDQ $4, R12
	MOVQ R12, 8(SP)
	JMP  tokens
nextchunk:
	MOVQ 16(SP), R12
	ADDQ 24(SP), R12
	MOVQ R12, 16(SP)
	JMP  chunks
nextgroup:
	MOVQ 0(SP), R11
	ADDQ $128, R11
	MOVQ R11, 0(SP)
	JMP  groups
done:
	VZEROUPPER
	RET

// func pvExactAVX512(acc *float64, accStride int, p *float64, pStride int, v *float64, vStride int, nj int, l int, rows int)
//
// pvExactGeneric: a strip of 32 latent columns at a time (its values stay
// in L1 while every row passes over them), four rows at a time in Z0-Z15
// (row r in Z(4r)..Z(4r+3)) across the token loop, each product added with
// one rounding, as math.FMA does. nj >= 1, l%32 == 0, rows%4 == 0 and
// rows > 0.
TEXT ·pvExactAVX512(SB), NOSPLIT, $16-72
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
	MOVQ p+16(FP), AX
	MOVQ AX, 0(SP) // this group's probabilities
	MOVQ rows+64(FP), AX
	MOVQ AX, 8(SP) // rows left
group:
	LEAQ (R9)(R12*2), R11 // rows 2 and 3
	VMOVUPD (R9), Z0
	VMOVUPD 64(R9), Z1
	VMOVUPD 128(R9), Z2
	VMOVUPD 192(R9), Z3
	VMOVUPD (R9)(R12*1), Z4
	VMOVUPD 64(R9)(R12*1), Z5
	VMOVUPD 128(R9)(R12*1), Z6
	VMOVUPD 192(R9)(R12*1), Z7
	VMOVUPD (R11), Z8
	VMOVUPD 64(R11), Z9
	VMOVUPD 128(R11), Z10
	VMOVUPD 192(R11), Z11
	VMOVUPD (R11)(R12*1), Z12
	VMOVUPD 64(R11)(R12*1), Z13
	VMOVUPD 128(R11)(R12*1), Z14
	VMOVUPD 192(R11)(R12*1), Z15
	MOVQ 0(SP), AX // row 0's probability of token j
	LEAQ (AX)(BX*2), CX // row 2's
	MOVQ R8, R10 // token j's values
	MOVQ nj+48(FP), SI
tok:
	VMOVUPD (R10), Z16
	VMOVUPD 64(R10), Z17
	VMOVUPD 128(R10), Z18
	VMOVUPD 192(R10), Z19
	VBROADCASTSD (AX), Z20
	VBROADCASTSD (AX)(BX*1), Z21
	VBROADCASTSD (CX), Z22
	VBROADCASTSD (CX)(BX*1), Z23
	VFMADD231PD Z16, Z20, Z0
	VFMADD231PD Z17, Z20, Z1
	VFMADD231PD Z18, Z20, Z2
	VFMADD231PD Z19, Z20, Z3
	VFMADD231PD Z16, Z21, Z4
	VFMADD231PD Z17, Z21, Z5
	VFMADD231PD Z18, Z21, Z6
	VFMADD231PD Z19, Z21, Z7
	VFMADD231PD Z16, Z22, Z8
	VFMADD231PD Z17, Z22, Z9
	VFMADD231PD Z18, Z22, Z10
	VFMADD231PD Z19, Z22, Z11
	VFMADD231PD Z16, Z23, Z12
	VFMADD231PD Z17, Z23, Z13
	VFMADD231PD Z18, Z23, Z14
	VFMADD231PD Z19, Z23, Z15
	ADDQ $8, AX
	ADDQ $8, CX
	ADDQ DX, R10
	DECQ SI
	JNZ  tok
	VMOVUPD Z0, (R9)
	VMOVUPD Z1, 64(R9)
	VMOVUPD Z2, 128(R9)
	VMOVUPD Z3, 192(R9)
	VMOVUPD Z4, (R9)(R12*1)
	VMOVUPD Z5, 64(R9)(R12*1)
	VMOVUPD Z6, 128(R9)(R12*1)
	VMOVUPD Z7, 192(R9)(R12*1)
	VMOVUPD Z8, (R11)
	VMOVUPD Z9, 64(R11)
	VMOVUPD Z10, 128(R11)
	VMOVUPD Z11, 192(R11)
	VMOVUPD Z12, (R11)(R12*1)
	VMOVUPD Z13, 64(R11)(R12*1)
	VMOVUPD Z14, 128(R11)(R12*1)
	VMOVUPD Z15, 192(R11)(R12*1)
	LEAQ (R11)(R12*2), R9 // the next four rows
	MOVQ 0(SP), AX
	LEAQ (AX)(BX*4), AX
	MOVQ AX, 0(SP)
	SUBQ $4, 8(SP)
	JNZ  group
	ADDQ $256, DI
	ADDQ $256, R8
	CMPQ DI, R13
	JNE  strip
	VZEROUPPER
	RET

// func pvExpected32AVX512(acc *float32, accStride int, p *float32, pStride int, v *float32, nj int, l int, rows int)
//
// pvExpected32Generic, 64 latent columns a strip, the values [nj][l]. The
// fused multiply-add rounds once, as the generic loop's separate multiply
// (exact here, the caller checks) and add do. nj >= 1, l%64 == 0,
// rows%4 == 0 and rows > 0.
TEXT ·pvExpected32AVX512(SB), NOSPLIT, $16-64
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
	MOVQ p+16(FP), AX
	MOVQ AX, 0(SP) // this group's probabilities
	MOVQ rows+56(FP), AX
	MOVQ AX, 8(SP) // rows left
group:
	LEAQ (R9)(R12*2), R11 // rows 2 and 3
	VMOVUPS (R9), Z0
	VMOVUPS 64(R9), Z1
	VMOVUPS 128(R9), Z2
	VMOVUPS 192(R9), Z3
	VMOVUPS (R9)(R12*1), Z4
	VMOVUPS 64(R9)(R12*1), Z5
	VMOVUPS 128(R9)(R12*1), Z6
	VMOVUPS 192(R9)(R12*1), Z7
	VMOVUPS (R11), Z8
	VMOVUPS 64(R11), Z9
	VMOVUPS 128(R11), Z10
	VMOVUPS 192(R11), Z11
	VMOVUPS (R11)(R12*1), Z12
	VMOVUPS 64(R11)(R12*1), Z13
	VMOVUPS 128(R11)(R12*1), Z14
	VMOVUPS 192(R11)(R12*1), Z15
	MOVQ 0(SP), AX // row 0's probability of token j
	LEAQ (AX)(BX*2), CX // row 2's
	MOVQ R8, R10 // token j's values
	MOVQ nj+40(FP), SI
tok:
	VMOVUPS (R10), Z16
	VMOVUPS 64(R10), Z17
	VMOVUPS 128(R10), Z18
	VMOVUPS 192(R10), Z19
	VBROADCASTSS (AX), Z20
	VBROADCASTSS (AX)(BX*1), Z21
	VBROADCASTSS (CX), Z22
	VBROADCASTSS (CX)(BX*1), Z23
	VFMADD231PS Z16, Z20, Z0
	VFMADD231PS Z17, Z20, Z1
	VFMADD231PS Z18, Z20, Z2
	VFMADD231PS Z19, Z20, Z3
	VFMADD231PS Z16, Z21, Z4
	VFMADD231PS Z17, Z21, Z5
	VFMADD231PS Z18, Z21, Z6
	VFMADD231PS Z19, Z21, Z7
	VFMADD231PS Z16, Z22, Z8
	VFMADD231PS Z17, Z22, Z9
	VFMADD231PS Z18, Z22, Z10
	VFMADD231PS Z19, Z22, Z11
	VFMADD231PS Z16, Z23, Z12
	VFMADD231PS Z17, Z23, Z13
	VFMADD231PS Z18, Z23, Z14
	VFMADD231PS Z19, Z23, Z15
	ADDQ $4, AX
	ADDQ $4, CX
	ADDQ DX, R10
	DECQ SI
	JNZ  tok
	VMOVUPS Z0, (R9)
	VMOVUPS Z1, 64(R9)
	VMOVUPS Z2, 128(R9)
	VMOVUPS Z3, 192(R9)
	VMOVUPS Z4, (R9)(R12*1)
	VMOVUPS Z5, 64(R9)(R12*1)
	VMOVUPS Z6, 128(R9)(R12*1)
	VMOVUPS Z7, 192(R9)(R12*1)
	VMOVUPS Z8, (R11)
	VMOVUPS Z9, 64(R11)
	VMOVUPS Z10, 128(R11)
	VMOVUPS Z11, 192(R11)
	VMOVUPS Z12, (R11)(R12*1)
	VMOVUPS Z13, 64(R11)(R12*1)
	VMOVUPS Z14, 128(R11)(R12*1)
	VMOVUPS Z15, 192(R11)(R12*1)
	LEAQ (R11)(R12*2), R9 // the next four rows
	MOVQ 0(SP), AX
	LEAQ (AX)(BX*4), AX
	MOVQ AX, 0(SP)
	SUBQ $4, 8(SP)
	JNZ  group
	ADDQ $256, DI
	ADDQ $256, R8
	CMPQ DI, R13
	JNE  strip
	VZEROUPPER
	RET

// func narrowAVX512(dst *float32, src *float64, n int, lo float64) float64
//
// narrowGeneric for n values, n%8 == 0 and n > 0. The running minimum is
// kept per lane and reduced at the end: a minimum does not depend on order.
// VMINPD's operands are ordered so that a NaN |x| keeps the running value,
// as the generic comparison does.
TEXT ·narrowAVX512(SB), NOSPLIT, $0-40
	MOVQ         dst+0(FP), DI
	MOVQ         src+8(FP), SI
	MOVQ         n+16(FP), CX
	VBROADCASTSD lo+24(FP), Z2
	VPXORQ       Z3, Z3, Z3
	MOVQ         $0x7FFFFFFFFFFFFFFF, AX
	VPBROADCASTQ AX, Z4
narrowloop:
	VMOVUPD   (SI), Z0
	VCVTPD2PS Z0, Y1
	VMOVUPS   Y1, (DI)
	VPANDQ    Z4, Z0, Z0
	VCMPPD    $4, Z3, Z0, K1
	VMINPD    Z2, Z0, K1, Z2
	ADDQ      $64, SI
	ADDQ      $32, DI
	SUBQ      $8, CX
	JNZ       narrowloop
	VEXTRACTF64X4 $1, Z2, Y5
	VMINPD        Y5, Y2, Y2
	VEXTRACTF128  $1, Y2, X5
	VMINPD        X5, X2, X2
	VPERMILPD     $1, X2, X5
	VMINPD        X5, X2, X2
	MOVSD         X2, ret+32(FP)
	VZEROUPPER
	RET

// func widenF32AVX512(dst *float64, src *float32, n int)
//
// dst[i] = float64(src[i]) for n values, n%8 == 0 and n > 0.
TEXT ·widenF32AVX512(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
widenloop:
	VCVTPS2PD (SI), Z0
	VMOVUPD   Z0, (DI)
	ADDQ      $32, SI
	ADDQ      $64, DI
	SUBQ      $8, CX
	JNZ       widenloop
	VZEROUPPER
	RET

// func expVecAVX512(dst *float64, src *float64, n int)
//
// expVecGeneric on n values, n%8 == 0 and n > 0: expDef's operations
// lane by lane (VFNMADD231PD is math.FMA(-n, c, r), VFMADD213PD is
// math.FMA(p, r, c)), then the two range ends blended in.
TEXT ·expVecAVX512(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVQ $0x3ff71547652b82fe, AX
	VPBROADCASTQ AX, Z31
	MOVQ $0x4338000000000000, AX
	VPBROADCASTQ AX, Z30
	MOVQ $0x3fe62e42fefa39ef, AX
	VPBROADCASTQ AX, Z29
	MOVQ $0x3c7abc9e3b39803f, AX
	VPBROADCASTQ AX, Z28
	MOVQ $0x3ff0000000000000, AX // 1023<<52
	VPBROADCASTQ AX, Z27
	MOVQ $0x4086280000000000, AX
	VPBROADCASTQ AX, Z26
	MOVQ $0xc086200000000000, AX
	VPBROADCASTQ AX, Z25
	MOVQ $0x7ff0000000000000, AX // +Inf
	VPBROADCASTQ AX, Z24
	// the Taylor coefficients 1/13! .. 1/0! of expTaylor (kernels.go)
	VBROADCASTSD ·expTaylor+0(SB), Z10
	VBROADCASTSD ·expTaylor+8(SB), Z11
	VBROADCASTSD ·expTaylor+16(SB), Z12
	VBROADCASTSD ·expTaylor+24(SB), Z13
	VBROADCASTSD ·expTaylor+32(SB), Z14
	VBROADCASTSD ·expTaylor+40(SB), Z15
	VBROADCASTSD ·expTaylor+48(SB), Z16
	VBROADCASTSD ·expTaylor+56(SB), Z17
	VBROADCASTSD ·expTaylor+64(SB), Z18
	VBROADCASTSD ·expTaylor+72(SB), Z19
	VBROADCASTSD ·expTaylor+80(SB), Z20
	VBROADCASTSD ·expTaylor+88(SB), Z21
	VBROADCASTSD ·expTaylor+96(SB), Z22
	VBROADCASTSD ·expTaylor+104(SB), Z23
	VPXORQ Z6, Z6, Z6
exploop:
	VMOVUPD (SI), Z0
	VMULPD Z31, Z0, Z1
	VADDPD Z30, Z1, Z1 // t = x*log2e + magic
	VSUBPD Z30, Z1, Z2 // n
	VMOVAPD Z0, Z3
	VFNMADD231PD Z29, Z2, Z3 // r = x - n*ln2hi
	VFNMADD231PD Z28, Z2, Z3 // r -= n*ln2lo
	VMOVAPD Z10, Z4
	VFMADD213PD Z11, Z3, Z4
	VFMADD213PD Z12, Z3, Z4
	VFMADD213PD Z13, Z3, Z4
	VFMADD213PD Z14, Z3, Z4
	VFMADD213PD Z15, Z3, Z4
	VFMADD213PD Z16, Z3, Z4
	VFMADD213PD Z17, Z3, Z4
	VFMADD213PD Z18, Z3, Z4
	VFMADD213PD Z19, Z3, Z4
	VFMADD213PD Z20, Z3, Z4
	VFMADD213PD Z21, Z3, Z4
	VFMADD213PD Z22, Z3, Z4
	VFMADD213PD Z23, Z3, Z4
	VPSLLQ $52, Z1, Z5
	VPADDQ Z27, Z5, Z5 // 2^n
	VMULPD Z5, Z4, Z4
	VCMPPD $0x1e, Z26, Z0, K1 // x > 709
	VMOVAPD Z24, K1, Z4
	VCMPPD $0x11, Z25, Z0, K2 // x < -708
	VMOVAPD Z6, K2, Z4
	VMOVUPD Z4, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	SUBQ $8, CX
	JNZ  exploop
	VZEROUPPER
	RET

// func exp2fVecAVX512(dst *float64, src *float64, n int) int
//
// exp2fVecGeneric on n values, n%8 == 0 and n > 0, by its own arithmetic:
// x rounded to fp32, 2^x = 2^n·e^(f·ln2) with |f| <= 1/2 (degree-13
// Taylor polynomial, within 2^-50), rounded to fp32 when its neighbours
// at a relative 2^-48 round the same way: then it is the correct rounding,
// and so Exp2F32's (see there). Arguments below -149 give 0 or 2^-149 as
// correct rounding does. It returns how many lanes it could not settle
// (a rounding too close to call, NaN, or past 127); the caller then takes
// the definition.
TEXT ·exp2fVecAVX512(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	XORQ R8, R8
	MOVQ $0x4338000000000000, AX
	VPBROADCASTQ AX, Z30
	MOVQ $0x3fe62e42fefa39ef, AX
	VPBROADCASTQ AX, Z29
	MOVQ $0x3ff0000000000000, AX // 1023<<52
	VPBROADCASTQ AX, Z27
	MOVQ $0xc062a00000000000, AX
	VPBROADCASTQ AX, Z26
	MOVQ $0x405fc00000000000, AX
	VPBROADCASTQ AX, Z25
	MOVQ $0x3ff0000000000010, AX
	VPBROADCASTQ AX, Z24
	MOVQ $0x3fefffffffffffe0, AX
	VPBROADCASTQ AX, Z28
	MOVQ $0xc062c00000000000, AX
	VPBROADCASTQ AX, Z31
	MOVQ $0x36a0000000000000, AX
	VPBROADCASTQ AX, Z9
	// the Taylor coefficients 1/13! .. 1/0! of expTaylor (kernels.go)
	VBROADCASTSD ·expTaylor+0(SB), Z10
	VBROADCASTSD ·expTaylor+8(SB), Z11
	VBROADCASTSD ·expTaylor+16(SB), Z12
	VBROADCASTSD ·expTaylor+24(SB), Z13
	VBROADCASTSD ·expTaylor+32(SB), Z14
	VBROADCASTSD ·expTaylor+40(SB), Z15
	VBROADCASTSD ·expTaylor+48(SB), Z16
	VBROADCASTSD ·expTaylor+56(SB), Z17
	VBROADCASTSD ·expTaylor+64(SB), Z18
	VBROADCASTSD ·expTaylor+72(SB), Z19
	VBROADCASTSD ·expTaylor+80(SB), Z20
	VBROADCASTSD ·expTaylor+88(SB), Z21
	VBROADCASTSD ·expTaylor+96(SB), Z22
	VBROADCASTSD ·expTaylor+104(SB), Z23
	VPXORQ Z8, Z8, Z8
exp2floop:
	VMOVUPD (SI), Z0
	VCVTPD2PS Z0, Y0
	VCVTPS2PD Y0, Z0 // x = fp32(x)
	VADDPD Z30, Z0, Z1
	VSUBPD Z30, Z1, Z2 // n = round(x)
	VSUBPD Z2, Z0, Z3 // f = x - n, exact
	VMULPD Z29, Z3, Z3 // u = f*ln2
	VMOVAPD Z10, Z4
	VFMADD213PD Z11, Z3, Z4
	VFMADD213PD Z12, Z3, Z4
	VFMADD213PD Z13, Z3, Z4
	VFMADD213PD Z14, Z3, Z4
	VFMADD213PD Z15, Z3, Z4
	VFMADD213PD Z16, Z3, Z4
	VFMADD213PD Z17, Z3, Z4
	VFMADD213PD Z18, Z3, Z4
	VFMADD213PD Z19, Z3, Z4
	VFMADD213PD Z20, Z3, Z4
	VFMADD213PD Z21, Z3, Z4
	VFMADD213PD Z22, Z3, Z4
	VFMADD213PD Z23, Z3, Z4
	VPSLLQ $52, Z1, Z5
	VPADDQ Z27, Z5, Z5 // 2^n
	VMULPD Z5, Z4, Z4 // y
	VCVTPD2PS Z4, Y6
	VMULPD Z24, Z4, Z7
	VCVTPD2PS Z7, Y7
	VMULPD Z28, Z4, Z5
	VCVTPD2PS Z5, Y5
	VPCMPEQD Y7, Y6, K1
	VPCMPEQD Y5, Y6, K2
	KANDW K2, K1, K1
	VCMPPD $0x1d, Z26, Z0, K3 // x >= -149
	VCMPPD $0x12, Z25, Z0, K4 // x <= 127
	KANDW K3, K1, K1
	KANDW K4, K1, K1 // settled by the polynomial
	VCVTPS2PD Y6, Z6
	VCMPPD $0x11, Z26, Z0, K5 // x < -149
	VCMPPD $0x1e, Z31, Z0, K6 // x > -150
	KANDW K5, K6, K6
	VMOVAPD Z8, K5, Z6
	VMOVAPD Z9, K6, Z6
	VMOVUPD Z6, (DI)
	KORW K5, K1, K1
	KMOVW K1, AX
	NOTL AX
	ANDL $0xff, AX
	POPCNTL AX, AX
	ADDQ AX, R8
	ADDQ $64, SI
	ADDQ $64, DI
	SUBQ $8, CX
	JNZ  exp2floop
	MOVQ R8, ret+24(FP)
	VZEROUPPER
	RET
