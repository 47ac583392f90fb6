//go:build amd64 && !purego && !amd64.v3

#include "textflag.h"

// BC broadcasts bm's constant at byte offset off into register r.
#define BC(off, r) VBROADCASTSD ·bm+off(SB), r
#define BCI(off, r) VPBROADCASTQ ·bm+off(SB), r

// STEP is one step of Horner's rule, acc = acc*x + c, c being bm's
// constant at byte offset off (tmp is overwritten): the polynomials of
// log and sincos are a broadcast coefficient and a STEP a coefficient
// more, as Go writes them, (((c0*x)+c1)*x+c2)...
#define STEP(acc, x, off, tmp) \
	VMULPD  x, acc, acc \
	BC(off, tmp)        \
	VADDPD  tmp, acc, acc

// func boxMullerAVX2(u1, u2, c, s *float64, n int)
//
// Four pairs a pass, in two loops: rad into c, then the sines and cosines
// and the products; each step is the scalar code's, named beside it.
TEXT ·boxMullerAVX2(SB), NOSPLIT, $0-40
	MOVQ u1+0(FP), SI
	MOVQ u2+8(FP), DI
	MOVQ c+16(FP), DX
	MOVQ s+24(FP), R8
	MOVQ n+32(FP), CX

loop:
	// ---- log(u1), as log_amd64.s
	VMOVUPD (SI), Y0          // x
	BC(0, Y1)
	VANDPD  Y0, Y1, Y1        // the mantissa
	BC(8, Y3)
	VORPD   Y3, Y1, Y1        // f1 in [0.5, 1)
	VPSRLQ  $52, Y0, Y2       // the exponent field (x > 0)
	BCI(272, Y3)
	VPSUBQ  Y3, Y2, Y2        // ki
	BCI(16, Y3)
	VPADDQ  Y3, Y2, Y2
	BC(16, Y3)
	VSUBPD  Y3, Y2, Y2        // k = float64(ki)
	BC(24, Y3)
	VCMPPD  $5, Y1, Y3, Y3    // !(√2/2 < f1): CMPSD's nlt
	BC(32, Y4)
	VANDPD  Y4, Y3, Y3        // 1 or 0
	VSUBPD  Y3, Y2, Y2        // k -= it
	VADDPD  Y4, Y3, Y3        // 2 or 1
	VMULPD  Y3, Y1, Y1        // f1 *= it
	VSUBPD  Y4, Y1, Y1        // f = f1 - 1
	BC(40, Y5)
	VADDPD  Y1, Y5, Y5        // 2 + f
	VDIVPD  Y5, Y1, Y3        // s = f / (2 + f)
	VMULPD  Y3, Y3, Y4        // s2
	VMULPD  Y4, Y4, Y5        // s4
	BC(96, Y6)                // L7
	STEP(Y6, Y5, 80, Y7)      // *s4 + L5
	STEP(Y6, Y5, 64, Y7)      // *s4 + L3
	STEP(Y6, Y5, 48, Y7)      // *s4 + L1
	VMULPD  Y6, Y4, Y4        // t1 = s2*(...)
	BC(88, Y6)                // L6
	STEP(Y6, Y5, 72, Y7)      // *s4 + L4
	STEP(Y6, Y5, 56, Y7)      // *s4 + L2
	VMULPD  Y6, Y5, Y5        // t2 = s4*(...)
	VADDPD  Y5, Y4, Y4        // R = t1 + t2
	BC(8, Y6)
	VMULPD  Y1, Y6, Y6
	VMULPD  Y1, Y6, Y6        // hfsq = 0.5*f*f
	VADDPD  Y6, Y4, Y4        // hfsq + R
	VMULPD  Y4, Y3, Y3        // s*(hfsq+R)
	BC(112, Y7)
	VMULPD  Y2, Y7, Y7        // k*Ln2Lo
	VADDPD  Y7, Y3, Y3        // s*(hfsq+R) + k*Ln2Lo
	VSUBPD  Y3, Y6, Y6        // hfsq - (...)
	VSUBPD  Y1, Y6, Y6        // (...) - f
	BC(104, Y7)
	VMULPD  Y7, Y2, Y2        // k*Ln2Hi
	VSUBPD  Y6, Y2, Y2        // log(x)
	BC(120, Y7)
	VMULPD  Y7, Y2, Y2        // -2*log(x)
	VSQRTPD Y2, Y2            // rad
	VMOVUPD Y2, (DX)          // kept in c until the second loop
	ADDQ    $32, SI
	ADDQ    $32, DX
	SUBQ    $4, CX
	JNZ     loop

	// The second loop: two shorter chains of dependent operations let
	// the CPU overlap more passes than one long one.
	MOVQ c+16(FP), DX
	MOVQ n+32(FP), CX

loop2:
	// ---- sincos(2π·u2), as sin.go for 0 <= x < 2π
	VMOVUPD (DX), Y2          // rad
	VMOVUPD (DI), Y8
	BC(128, Y7)
	VMULPD  Y7, Y8, Y8        // x = 2π·u2
	BC(136, Y7)
	VMULPD  Y7, Y8, Y9        // x*(4/π)
	VCVTTPD2DQY Y9, X10       // j = uint64(...), below 8
	VPMOVZXDQ X10, Y10
	BCI(280, Y11)
	VPAND   Y11, Y10, Y11     // j&1
	VPADDQ  Y11, Y10, Y10     // an odd j (and y) one up
	BCI(16, Y11)
	VPADDQ  Y10, Y11, Y11
	BC(16, Y12)
	VSUBPD  Y12, Y11, Y11     // y = float64(j)
	BCI(296, Y12)
	VPAND   Y12, Y10, Y10     // j &= 7
	BC(144, Y12)
	VMULPD  Y11, Y12, Y12
	VSUBPD  Y12, Y8, Y8       // x - y*PI4A
	BC(152, Y12)
	VMULPD  Y11, Y12, Y12
	VSUBPD  Y12, Y8, Y8       // - y*PI4B
	BC(160, Y12)
	VMULPD  Y11, Y12, Y12
	VSUBPD  Y12, Y8, Y8       // z = ... - y*PI4C
	VMULPD  Y8, Y8, Y9        // zz
	BC(168, Y12)              // _cos[0]
	STEP(Y12, Y9, 176, Y13)
	STEP(Y12, Y9, 184, Y13)
	STEP(Y12, Y9, 192, Y13)
	STEP(Y12, Y9, 200, Y13)
	STEP(Y12, Y9, 208, Y13)   // the cos polynomial
	VMULPD  Y9, Y9, Y13       // zz*zz
	VMULPD  Y12, Y13, Y12     // zz*zz*(...)
	BC(8, Y13)
	VMULPD  Y9, Y13, Y13      // 0.5*zz
	BC(32, Y14)
	VSUBPD  Y13, Y14, Y14     // 1 - 0.5*zz
	VADDPD  Y12, Y14, Y12     // cos
	BC(216, Y13)              // _sin[0]
	STEP(Y13, Y9, 224, Y14)
	STEP(Y13, Y9, 232, Y14)
	STEP(Y13, Y9, 240, Y14)
	STEP(Y13, Y9, 248, Y14)
	STEP(Y13, Y9, 256, Y14)   // the sin polynomial
	VMULPD  Y9, Y8, Y14       // z*zz
	VMULPD  Y13, Y14, Y13     // z*zz*(...)
	VADDPD  Y13, Y8, Y13      // sin
	// j is 0, 2, 4 or 6: 2 and 6 swap sin and cos; 4 and 6 negate sin;
	// 2 and 4 negate cos.
	BCI(288, Y14)
	VPAND   Y14, Y10, Y15
	VPCMPEQQ Y14, Y15, Y15    // the swap
	VBLENDVPD Y15, Y12, Y13, Y14 // sin out
	VBLENDVPD Y15, Y13, Y12, Y12 // cos out
	BCI(264, Y11)
	VPSLLQ  $61, Y10, Y15     // bit 2 to the sign
	VPAND   Y11, Y15, Y13
	VXORPD  Y13, Y14, Y14     // sin's sign
	VPSLLQ  $62, Y10, Y13     // bit 1 to the sign
	VPXOR   Y15, Y13, Y13
	VPAND   Y11, Y13, Y13
	VXORPD  Y13, Y12, Y12     // cos's sign

	VMULPD  Y12, Y2, Y12      // rad*cos
	VMULPD  Y14, Y2, Y14      // rad*sin
	VMOVUPD Y12, (DX)
	VMOVUPD Y14, (R8)
	ADDQ    $32, DI
	ADDQ    $32, DX
	ADDQ    $32, R8
	SUBQ    $4, CX
	JNZ     loop2
	VZEROUPPER
	RET
