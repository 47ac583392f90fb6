//go:build amd64 && !purego

#include "textflag.h"

// The AVX2 twin of runGeneric's inner loop, for CPUs without AVX-512 (see
// gemm_amd64.go). Operand order is Go's: VFMADD231PS Y8, Y10, Y0 computes
// Y0 += Y10 * Y8.

// QUARTER computes one block's partial sums of four rows of the tile (a's
// rows at R11, R11+SI, R11+2·SI, R12) by sixteen of its columns (b's at
// R13, a row of the panel every 128 bytes), row i's eight-column halves in
// Y(2i) and Y(2i+1), then adds them to acc32 (R8) and, widened, to acc64
// (R9) at the quarter's first accumulator, off32 and off64 bytes in.
#define QUARTER(off32, off64) \
	VXORPS Y0, Y0, Y0; \
	VXORPS Y1, Y1, Y1; \
	VXORPS Y2, Y2, Y2; \
	VXORPS Y3, Y3, Y3; \
	VXORPS Y4, Y4, Y4; \
	VXORPS Y5, Y5, Y5; \
	VXORPS Y6, Y6, Y6; \
	VXORPS Y7, Y7, Y7; \
	POS(0); POS(1); POS(2); POS(3); POS(4); POS(5); POS(6); POS(7); \
	POS(8); POS(9); POS(10); POS(11); POS(12); POS(13); POS(14); POS(15); \
	ACCUMULATE(Y0, X0, off32, off64); \
	ACCUMULATE(Y1, X1, off32+32, off64+64); \
	ACCUMULATE(Y2, X2, off32+128, off64+256); \
	ACCUMULATE(Y3, X3, off32+160, off64+320); \
	ACCUMULATE(Y4, X4, off32+256, off64+512); \
	ACCUMULATE(Y5, X5, off32+288, off64+576); \
	ACCUMULATE(Y6, X6, off32+384, off64+768); \
	ACCUMULATE(Y7, X7, off32+416, off64+832)

// POS is QUARTER's work at position k of the block: b's sixteen values
// there, a's four (one a row) broadcast, eight fused multiply-adds.
#define POS(k) \
	VMOVUPS (k*128)(R13), Y8; \
	VMOVUPS (k*128+32)(R13), Y9; \
	VBROADCASTSS (k*4)(R11), Y10; \
	VFMADD231PS Y8, Y10, Y0; \
	VFMADD231PS Y9, Y10, Y1; \
	VBROADCASTSS (k*4)(R11)(SI*1), Y11; \
	VFMADD231PS Y8, Y11, Y2; \
	VFMADD231PS Y9, Y11, Y3; \
	VBROADCASTSS (k*4)(R11)(SI*2), Y12; \
	VFMADD231PS Y8, Y12, Y4; \
	VFMADD231PS Y9, Y12, Y5; \
	VBROADCASTSS (k*4)(R12), Y13; \
	VFMADD231PS Y8, Y13, Y6; \
	VFMADD231PS Y9, Y13, Y7

// ACCUMULATE adds eight partial sums (y, its low half x) to acc32 at off32
// in fp32 and, widened, to acc64 at off64 in float64, as runGeneric does.
#define ACCUMULATE(y, x, off32, off64) \
	VADDPS off32(R8), y, Y14; \
	VMOVUPS Y14, off32(R8); \
	VCVTPS2PD x, Y14; \
	VADDPD off64(R9), Y14, Y14; \
	VMOVUPD Y14, off64(R9); \
	VEXTRACTF128 $1, y, X15; \
	VCVTPS2PD X15, Y15; \
	VADDPD off64+32(R9), Y15, Y15; \
	VMOVUPD Y15, off64+32(R9)

// func gemmTileAVX2(a *float32, lda int, b *float32, nblk int, acc32 *float32, acc64 *float64)
//
// gemmTileAVX512's tile (eight rows of a, [8][lda], by the 32 columns of
// a panel of b, [16*nblk][32]) in four quarters of four rows by sixteen
// columns, sixteen registers not holding a whole tile's sums: each block's
// quarters in turn. Every product and partial sum of a block is exact in
// fp32 (see GEMM), so this order gives runGeneric's block sums, and they
// are added to acc32 and acc64 a block at a time in K order.
TEXT ·gemmTileAVX2(SB), NOSPLIT, $0-48
	MOVQ a+0(FP), AX
	MOVQ lda+8(FP), SI
	SHLQ $2, SI // SI: bytes from one row of a to the next
	LEAQ (SI)(SI*2), DX // DX: three rows
	MOVQ b+16(FP), DI
	MOVQ nblk+24(FP), CX
	MOVQ acc32+32(FP), R8
	MOVQ acc64+40(FP), R9
	TESTQ CX, CX
	JEQ  done

block:
	// rows 0-3, columns 0-15
	MOVQ AX, R11
	LEAQ (AX)(DX*1), R12
	MOVQ DI, R13
	QUARTER(0, 0)
	// rows 0-3, columns 16-31
	MOVQ AX, R11
	LEAQ (AX)(DX*1), R12
	LEAQ 64(DI), R13
	QUARTER(64, 128)
	// rows 4-7, columns 0-15
	LEAQ (AX)(SI*4), R11
	LEAQ (R11)(DX*1), R12
	MOVQ DI, R13
	QUARTER(512, 1024)
	// rows 4-7, columns 16-31
	LEAQ (AX)(SI*4), R11
	LEAQ (R11)(DX*1), R12
	LEAQ 64(DI), R13
	QUARTER(576, 1152)
	ADDQ $64, AX // the next block: sixteen positions of a
	ADDQ $2048, DI // and of the panel
	DECQ CX
	JNZ  block

done:
	VZEROUPPER
	RET
