//go:build amd64 && !purego && !amd64.v3

package normal

import (
	"math"

	"github.com/kcheck-dev/kcheck/reference/internal/simd"
)

// level is the widest instruction set the CPU runs; tests set it to each
// of levels in turn.
var level, levels = simd.Best(), simd.Supported()

func useAsm() bool { return level >= simd.AVX2 }

// boxMullerAVX2 is boxMullerGeneric over n pairs, n%4 == 0 and n > 0, the
// pairs in BoxMuller's domain, four a pass: math.Log as log_amd64.s
// makes it (its Frexp by the exponent field, its f1 <= √2/2 test, its
// polynomial), the square root, and math.Sincos's reduction by Cody and
// Waite's three parts of π/4 and its two polynomials, in sin.go's order
// of operations, without fused multiply-adds.
//
//go:noescape
func boxMullerAVX2(u1, u2, c, s *float64, n int)

// bm holds the constants boxMullerAVX2 broadcasts, by its offsets (8
// bytes each): math's own, written as Go writes them.
var bm = [...]float64{
	math.Float64frombits(0x000FFFFFFFFFFFFF), // 0: the mantissa
	0.5,                                      // 8
	0x1.8p52,                                 // 16: an int64 below 2^51 added to its bits is it as a float64 plus 0x1.8p52
	7.07106781186547524401e-01,               // 24: √2/2
	1,                                        // 32
	2,                                        // 40
	6.666666666666735130e-01,                 // 48: L1
	3.999999999940941908e-01,                 // 56: L2
	2.857142874366239149e-01,                 // 64: L3
	2.222219843214978396e-01,                 // 72: L4
	1.818357216161805012e-01,                 // 80: L5
	1.531383769920937332e-01,                 // 88: L6
	1.479819860511658591e-01,                 // 96: L7
	6.93147180369123816490e-01,               // 104: Ln2Hi
	1.90821492927058770002e-10,               // 112: Ln2Lo
	-2,                                       // 120
	2 * math.Pi,                              // 128
	4 / math.Pi,                              // 136
	7.85398125648498535156e-1,                // 144: PI4A
	3.77489470793079817668e-8,                // 152: PI4B
	2.69515142907905952645e-15,               // 160: PI4C
	-1.13585365213876817300e-11,              // 168: _cos[0]
	2.08757008419747316778e-9,                // 176
	-2.75573141792967388112e-7,               // 184
	2.48015872888517045348e-5,                // 192
	-1.38888888888730564116e-3,               // 200
	4.16666666666665929218e-2,                // 208: _cos[5]
	1.58962301576546568060e-10,               // 216: _sin[0]
	-2.50507477628578072866e-8,               // 224
	2.75573136213857245213e-6,                // 232
	-1.98412698295895385996e-4,               // 240
	8.33333333332211858878e-3,                // 248
	-1.66666666666666307295e-1,               // 256: _sin[5]
	math.Float64frombits(1 << 63),            // 264: the sign
	math.Float64frombits(0x3FE),              // 272: the exponent of [0.5, 1), an integer
	math.Float64frombits(1),                  // 280: integers 1, 2 and 7
	math.Float64frombits(2),                  // 288
	math.Float64frombits(7),                  // 296
}
