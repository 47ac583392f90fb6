package nvfp4

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kcheck-dev/kcheck/reference/formats"
)

// block16 pads vals with zeros to one 16-element block.
func block16(vals ...float64) []float64 {
	b := make([]float64, BlockSize)
	copy(b, vals)
	return b
}

// Hand-computed quantizations of single blocks (reference/CONTRACTS.md §3.1). E4M3 codes:
// 1.0 = 0 0111 000 = 0x38, 1.125 = 0x39, 448 = 0x7E, 2^-9 = 0x01.
// E2M1 codes: 0,0.5,1,1.5,2,3,4,6 = 0..7, negatives +8.
func TestQuantizeByHand(t *testing.T) {
	tests := []struct {
		name  string
		x     []float64
		gs    float64
		scale uint8
		codes []uint8 // first len(codes) codes; the rest of the block is 0
	}{
		{"amax 6, gs 1: s = 6/6 = 1.0, codes are the values",
			block16(6, -6, 0, 0.5, 1, 1.5, 2, 3, 4, -0.5, -1, -1.5, -2, -3, -4),
			1, 0x38, []uint8{7, 15, 0, 1, 2, 3, 4, 5, 6, 9, 10, 11, 12, 13, 14}},
		{"gs 2, amax 3: s = 2*3/6 = 1; x*2 hits the E2M1 ties 0.25->0, 0.75->1, 2.5->2, 3.5->4, 5->4",
			block16(3, 0.25, 0.125, 0.375, 1.25, 1.75, 2.5, -0.125, -2.5),
			2, 0x38, []uint8{7, 1, 0, 2, 4, 6, 6, 8, 14}},
		{"gs 1, amax 7: 7/6 = 1.1667 rounds to 1.125 (0x39, not 1.25); 7/1.125 = 6.22 saturates to 6; 0.5625/1.125 = 0.5",
			block16(7, 0.5625, -1.6875),
			1, 0x39, []uint8{7, 1, 11}}, // 1.6875/1.125 = 1.5
		{"scale tie: 6.375/6 = 1.0625, halfway 1.0..1.125, rounds to even 1.0 (0x38); 6.375/1 saturates",
			block16(6.375, 1.25),
			1, 0x38, []uint8{7, 2}}, // 1.25 is an E2M1 tie: to even 1.0
		{"saturating scale: 1000*6/6 = 1000 > 448 gives 448 (0x7E); 6000/448 = 13.4 -> 6; 1000/448 = 2.23 -> 2",
			block16(6, 1),
			1000, 0x7E, []uint8{7, 4}},
		{"subnormal scale: amax 6*2^-9 gives s = 2^-9 (0x01); 3*2^-9 / 2^-9 = 3",
			block16(6*0x1p-9, 3*0x1p-9, -0x1p-10),
			1, 0x01, []uint8{7, 5, 9}}, // 2^-10/2^-9 = 0.5
		{"tiny block: 6*2^-10/6 = 2^-10 is half of E4M3's least subnormal, ties to even 0: s = 0, codes 0",
			block16(6*0x1p-10, -1*0x1p-10),
			1, 0x00, []uint8{0, 0}},
		{"zero block: s = 0, codes 0", block16(), 5, 0x00, nil},
	}
	for _, tc := range tests {
		for _, variant := range []struct {
			name string
			f    func(context.Context, []float64, int, int, float64) (*Quantized, error)
		}{{"exact", Quantize}, {"expected", QuantizeExpected}} {
			q, err := variant.f(context.Background(), tc.x, 1, BlockSize, tc.gs)
			if err != nil {
				t.Fatalf("%s %s: %v", variant.name, tc.name, err)
			}
			if q.Scales[0] != tc.scale {
				t.Errorf("%s %s: scale 0x%02X, want 0x%02X", variant.name, tc.name, q.Scales[0], tc.scale)
			}
			want := make([]uint8, BlockSize)
			copy(want, tc.codes)
			for j := range want {
				if q.Codes[j] != want[j] {
					t.Errorf("%s %s: code[%d] = %d, want %d", variant.name, tc.name, j, q.Codes[j], want[j])
				}
			}
		}
	}
}

// The scale tie above: both 0x38 and 0x39 are correct, 0x3A is not; the
// E2M1 tie 1.25 accepts 1.0 and 1.5 but not 2.0.
func TestEquivalentAtTies(t *testing.T) {
	q, err := Quantize(context.Background(), block16(6.375, 1.25, 1.3, 0.25), 1, BlockSize, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		code uint8
		want bool
	}{{0x38, true}, {0x39, true}, {0x37, false}, {0x3A, false}} {
		if got := q.ScaleEquivalent(0, tc.code); got != tc.want {
			t.Errorf("scale 0x%02X equivalent = %v, want %v", tc.code, got, tc.want)
		}
	}
	if alt, ok := q.ScaleAlternative(0); !ok || alt != 0x39 {
		t.Errorf("ScaleAlternative = 0x%02X, %v; want 0x39, true", alt, ok)
	}
	// element 1: 1.25 exactly, tie of 1.0 (code 2) and 1.5 (code 3).
	// element 2: 1.3 is 0.05 from the tie: only code 3 (1.5).
	// element 3: 0.25, tie of 0 (code 0 or 8) and 0.5 (code 1).
	for _, tc := range []struct {
		i    int
		code uint8
		want bool
	}{
		{1, 2, true}, {1, 3, true}, {1, 4, false}, {1, 1, false}, {1, 10, false},
		{2, 3, true}, {2, 2, false},
		{3, 0, true}, {3, 8, true}, {3, 1, true}, {3, 9, false},
		{4, 8, true}, {4, 1, false}, // zero: -0 is the same value
	} {
		if got := q.CodeEquivalent(tc.i, tc.code); got != tc.want {
			t.Errorf("element %d (in %g): code %d equivalent = %v, want %v", tc.i, q.CodeIn[tc.i], tc.code, got, tc.want)
		}
	}
	if alt, ok := (&Quantized{ScaleIn: []float64{7.0 / 6}, Scales: []uint8{0x39}}).ScaleAlternative(0); ok {
		t.Errorf("7/6 is no tie, yet ScaleAlternative gave 0x%02X", alt)
	}
}

// Zero and NaN scales: any code dequantizes the same (0) or is undefined.
func TestEquivalentDegenerateBlocks(t *testing.T) {
	x := append(block16(1e-5, 2e-5), block16(1, math.NaN(), 3)...)
	q, err := Quantize(context.Background(), x, 1, 2*BlockSize, 1)
	if err != nil {
		t.Fatal(err)
	}
	if q.Scales[0] != 0 || !q.CodeEquivalent(0, 7) {
		t.Errorf("zero-scale block: scale 0x%02X, code 7 equivalent %v; want 0x00, true", q.Scales[0], q.CodeEquivalent(0, 7))
	}
	if !formats.E4M3FN.IsNaN(q.Scales[1]) || !q.BlockNaN[1] {
		t.Errorf("NaN block: scale 0x%02X BlockNaN %v; want a NaN code (NaN propagates to the scale)", q.Scales[1], q.BlockNaN[1])
	}
	if !q.ScaleEquivalent(1, 0x3C) || !q.CodeEquivalent(BlockSize, 5) {
		t.Error("a block with a NaN input must accept any scale and code")
	}
	if q.ScaleEquivalent(0, 0x01) {
		t.Error("zero block: scale 2^-9 accepted though 3e-5/6 is far from the 2^-10 tie")
	}
}

// roundQuotient must decide on the exact value when the float64 quotient
// lands on a midpoint: (3.75 + 2^-60)/3 is just above 1.25, so it rounds up
// to 1.5, though 3.75/3 == 1.25 in float64 would tie to even 1.0.
func TestRoundQuotientExactAtTies(t *testing.T) {
	tests := []struct {
		hi, lo, den float64
		want        uint8
	}{
		{3.75, 0, 3, 2},           // exactly 1.25: to even, 1.0
		{3.75, 0x1p-60, 3, 3},     // above: 1.5
		{3.75, -0x1p-60, 3, 2},    // below: 1.0
		{-3.75, -0x1p-60, 3, 11},  // -1.25-: -1.5
		{-3.75, 0x1p-60, 3, 10},   // -1.25+: -1.0
		{5 * 3, 0x1p-50, 3, 7},    // just above 5: 6
		{5 * 3, 0, 3, 6},          // 5 exactly: to even 4
		{0.75 * 7, 0x1p-55, 7, 2}, // above 0.75: 1.0
		{0.75 * 7, -0x1p-55, 7, 1},
	}
	for _, tc := range tests {
		if got, _ := roundQuotient(formats.E2M1, tc.hi, tc.lo, tc.den); got != tc.want {
			t.Errorf("roundQuotient(%g + %g, /%g) = %d, want %d", tc.hi, tc.lo, tc.den, got, tc.want)
		}
	}
	// E4M3: 1.0625*6 = 6.375 plus or minus a hair.
	if got, _ := roundQuotient(formats.E4M3FN, 6.375, 0x1p-58, 6); got != 0x39 {
		t.Errorf("E4M3 just above the 1.0625 tie: 0x%02X, want 0x39", got)
	}
}

// randomActivations returns bf16 values with a spread of magnitudes per
// block, some blocks with exact ties planted, and the vLLM-style global scale.
func randomActivations(r *rand.Rand, rows, k int) ([]float64, float64) {
	x := make([]float64, rows*k)
	for i := range x {
		mag := math.Exp2(float64(r.IntN(12) - 6))
		x[i] = formats.RoundBF16(r.NormFloat64() * mag)
	}
	amax := 0.0
	for _, v := range x {
		amax = math.Max(amax, math.Abs(v))
	}
	return x, float64(float32(448 * 6 / amax))
}

// The fp32 emulation of the engines' kernels may differ from the exact
// quantizer only at ties; on random data it must differ somewhere (or the
// classification is untested) and never elsewhere.
func TestExpectedDiffersOnlyAtTies(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	rows, k := 64, 256
	diffs := 0
	for trial := 0; trial < 4; trial++ {
		x, gs := randomActivations(r, rows, k)
		if trial%2 == 1 {
			gs = float64(float32(gs * 3)) // a gs whose reciprocal is inexact
		}
		ex, err := Quantize(context.Background(), x, rows, k, gs)
		if err != nil {
			t.Fatal(err)
		}
		fp, err := QuantizeExpected(context.Background(), x, rows, k, gs)
		if err != nil {
			t.Fatal(err)
		}
		for b := range ex.Scales {
			if fp.Scales[b] != ex.Scales[b] {
				diffs++
				if !ex.ScaleEquivalent(b, fp.Scales[b]) {
					t.Errorf("trial %d block %d: fp32 scale 0x%02X, exact 0x%02X (in %g) not at a tie", trial, b, fp.Scales[b], ex.Scales[b], ex.ScaleIn[b])
				}
				continue
			}
			for j := 0; j < BlockSize; j++ {
				i := b*BlockSize + j
				if CodeValue(fp.Codes[i]) != CodeValue(ex.Codes[i]) {
					diffs++
					if !ex.CodeEquivalent(i, fp.Codes[i]) {
						t.Errorf("trial %d element %d: fp32 code %d, exact %d (in %.17g) not at a tie", trial, i, fp.Codes[i], ex.Codes[i], ex.CodeIn[i])
					}
				}
			}
		}
	}
	if diffs == 0 {
		t.Error("the fp32 emulation never differed from the exact quantizer; the tie classification went unexercised")
	}
	t.Logf("%d differences, all at ties", diffs)
}

// Dequantizing a quantization gives x back within the rounding of each
// step: |x*gs/s - e2m1| <= half the E2M1 spacing at that value (0.25 below
// 2, 0.5 below 4, 1 up to 6), or the overshoot past 6 when the scale rounded
// down, which E4M3's 2^-4 relative rounding bounds by 6*2^-4 = 0.375.
func TestDequantizeQuantizeErrorBound(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	rows, k := 32, 512
	x, gs := randomActivations(r, rows, k)
	q, err := Quantize(context.Background(), x, rows, k, gs)
	if err != nil {
		t.Fatal(err)
	}
	deq, err := Dequantize(context.Background(), q.Matrix(gs))
	if err != nil {
		t.Fatal(err)
	}
	worst := 0.0
	for i, v := range x {
		s := ScaleValue(q.Scales[i/BlockSize])
		if s == 0 {
			if deq[i] != 0 {
				t.Fatalf("element %d: zero scale but dequantized %g", i, deq[i])
			}
			continue
		}
		if s < 0x1p-6 { // subnormal scales round by more than 2^-4
			continue
		}
		y := math.Abs(v * gs / s)
		half := 0.25
		switch {
		case y > 4:
			half = 1
		case y > 2:
			half = 0.5
		}
		bound := math.Max(half, y-6) * s / gs
		if y > 6*(1+0x1p-4) {
			t.Fatalf("element %d: x*gs/s = %g exceeds 6*(1+2^-4)", i, y)
		}
		e := math.Abs(v - deq[i])
		if e > bound*(1+1e-12) {
			t.Fatalf("element %d: |x - deq| = %g > bound %g (x %g, deq %g, s %g)", i, e, bound, v, deq[i], s)
		}
		if bound > 0 {
			worst = math.Max(worst, e/bound)
		}
	}
	t.Logf("worst error / bound = %.3f", worst)
}

func TestQuantizeRejectsBadShapes(t *testing.T) {
	if _, err := Quantize(context.Background(), make([]float64, 40), 1, 40, 1); err == nil || err.Error() != "x has K = 40, not a multiple of 16" {
		t.Errorf("K = 40: err = %v", err)
	}
	if _, err := QuantizeExpected(context.Background(), make([]float64, 10), 1, 16, 1); err == nil {
		t.Error("short x accepted")
	}
}

func TestQuantizeBlockWithOtherScale(t *testing.T) {
	// With scale 1.125 (0x39) instead of 1.0, 1.25/1.125 = 1.111 -> 1.0 and
	// 6.375/1.125 = 5.67 -> 6.
	codes := make([]uint8, BlockSize)
	QuantizeBlock(block16(6.375, 1.25, -4.5), 1, 0x39, codes, nil)
	want := []uint8{7, 2, 14} // -4.5/1.125 = -4
	for j, w := range want {
		if codes[j] != w {
			t.Errorf("code[%d] = %d, want %d", j, codes[j], w)
		}
	}
}

// TestExpectedCodesAreExpecteds: QuantizeExpectedCodes gives
// QuantizeExpected's codes, scales and NaN blocks, leaving out only the
// pre-rounding values, on activations with a NaN block, a zero block, a
// block whose scale underflows to 0 and infinities.
func TestExpectedCodesAreExpecteds(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	rows, k := 16, 128
	for trial := range 3 {
		x, gs := randomActivations(r, rows, k)
		x[3] = math.NaN()
		for j := range BlockSize {
			x[BlockSize+j] = 0
			x[2*BlockSize+j] = 0x1p-40 * float64(j)
		}
		x[5*BlockSize] = math.Inf(1)
		x[7*BlockSize+1] = math.Inf(-1)
		if trial == 2 {
			gs = float64(float32(gs * 3))
		}
		want, err := QuantizeExpected(context.Background(), x, rows, k, gs)
		if err != nil {
			t.Fatal(err)
		}
		got, err := QuantizeExpectedCodes(context.Background(), x, rows, k, gs)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(Quantized{Rows: want.Rows, K: want.K, Codes: want.Codes, Scales: want.Scales, BlockNaN: want.BlockNaN}, *got); diff != "" {
			t.Fatalf("trial %d: codes-only quantization differs (-QuantizeExpected +QuantizeExpectedCodes):\n%s", trial, diff)
		}
	}
	if _, err := QuantizeExpectedCodes(context.Background(), make([]float64, 10), 1, 16, 1); err == nil {
		t.Error("10 values for a [1, 16] x: no error")
	}
}
