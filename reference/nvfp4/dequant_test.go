package nvfp4

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Hand-computed dequantizations of one 16-element row. Byte 0x72: low
// nibble 2 (element 0 = 1.0), high nibble 7 (element 1 = 6.0). Byte 0xB3:
// element 2 = code 3 (1.5), element 3 = code 0xB (-1.5). Byte 0x85: code 5
// (3.0) then code 8 (-0). E4M3 0x38 = 1.0, 0x3C = 0 0111 100 = 1.5,
// 0x39 = 1.125.
func TestDequantizeByHand(t *testing.T) {
	packed := []uint8{0x72, 0xB3, 0x85, 0, 0, 0, 0, 0}
	tests := []struct {
		name     string
		scale    uint8
		global   float64
		kind     GlobalKind
		out      tensor.DType
		exact    []float64 // first four elements
		expected []float64
	}{
		{"scale 1, global 2 (dequant): values times 2", 0x38, 2, Dequant, tensor.BF16,
			[]float64{2, 12, 3, -3, 6, 0}, []float64{2, 12, 3, -3, 6, 0}},
		{"scale 1, global 2 (quant): values over 2", 0x38, 2, Quant, tensor.BF16,
			[]float64{0.5, 3, 0.75, -0.75, 1.5, 0}, []float64{0.5, 3, 0.75, -0.75, 1.5, 0}},
		{"scale 1.5, global 3 (dequant): 1*1.5*3 = 4.5, 6*1.5*3 = 27, 1.5*1.5*3 = 6.75", 0x3C, 3, Dequant, tensor.F32,
			[]float64{4.5, 27, 6.75, -6.75, 13.5, 0}, []float64{4.5, 27, 6.75, -6.75, 13.5, 0}},
		// g = fp32(1/3) = 0.3333333432674408 (0x3EAAAAAB). Element 4: 3*1.125*g
		// = 1.1250000335276127 exactly in float64; fp32 rounds it to 1.125
		// (fp32 spacing there 2^-23 = 1.19e-7, the excess 3.4e-8 is under half).
		// Element 0: 1.125*g = 0.37500001117587090; fp32 spacing at 0.375 is
		// 2^-25 = 2.98e-8 and the excess 1.12e-8 is under half: 0.375.
		// Element 2: 1.6875*g = 0.5625000167638063, spacing 5.96e-8: 0.5625.
		{"scale 1.125, global fp32(1/3) (dequant): roundings", 0x39, float64(float32(1.0 / 3)), Dequant, tensor.BF16,
			[]float64{1.125 * 0.3333333432674408, 6.75 * 0.3333333432674408, 1.6875 * 0.3333333432674408, -1.6875 * 0.3333333432674408, 1.1250000335276127, 0},
			[]float64{0.375, 2.25, 0.5625, -0.5625, 1.125, 0}},
	}
	for _, tc := range tests {
		a := &Matrix{Rows: 1, K: 16, Packed: packed, Scales: []uint8{tc.scale}, Global: tc.global, Kind: tc.kind}
		ex, err := Dequantize(context.Background(), a)
		if err != nil {
			t.Fatal(err)
		}
		exp, err := DequantizeExpected(context.Background(), a, tc.out)
		if err != nil {
			t.Fatal(err)
		}
		for i := range tc.exact {
			if ex[i] != tc.exact[i] {
				t.Errorf("%s: exact[%d] = %.17g, want %.17g", tc.name, i, ex[i], tc.exact[i])
			}
			if exp[i] != tc.expected[i] {
				t.Errorf("%s: expected[%d] = %.17g, want %.17g", tc.name, i, exp[i], tc.expected[i])
			}
		}
		if !math.Signbit(ex[5]) {
			t.Errorf("%s: code 8 must dequantize to -0, got %v", tc.name, ex[5])
		}
	}
}

// The faults fixtures will plant (swapped nibbles, inverted global scale,
// swizzled scales read as linear) must each change the dequantized tensor,
// or the suite could not tell them from a correct kernel.
func TestFaultVariantsDiffer(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	rows, k := 130, 80 // 130 rows and 5 scale columns: both paddings in play
	x, gs := randomActivations(r, rows, k)
	q, err := Quantize(context.Background(), x, rows, k, gs)
	if err != nil {
		t.Fatal(err)
	}
	good := q.Matrix(gs)
	ref, err := Dequantize(context.Background(), good)
	if err != nil {
		t.Fatal(err)
	}

	swapped := *good
	swapped.Packed = append([]uint8(nil), good.Packed...)
	for i, b := range swapped.Packed {
		swapped.Packed[i] = b<<4 | b>>4
	}
	inverted := *good
	inverted.Kind = Dequant // gs used as a multiplier instead of a divisor
	sw, err := Swizzled128x4.FromLinear(good.Scales, rows, k/16)
	if err != nil {
		t.Fatal(err)
	}
	misread := *good
	misread.Scales = sw[:rows*k/16] // the swizzled bytes taken as row-major

	for _, f := range []struct {
		name string
		m    *Matrix
	}{{"swapped nibbles", &swapped}, {"inverted global", &inverted}, {"swizzled read as linear", &misread}} {
		got, err := Dequantize(context.Background(), f.m)
		if err != nil {
			t.Fatal(err)
		}
		n, nonzero := 0, 0
		for i := range ref {
			if ref[i] == 0 {
				continue // code 0 is 0 under any scale
			}
			nonzero++
			if got[i] != ref[i] {
				n++
			}
		}
		if frac := float64(n) / float64(nonzero); frac < 0.5 {
			t.Errorf("%s changes only %.1f%% of the nonzero elements", f.name, 100*frac)
		}
	}
}

func TestDequantizeRejects(t *testing.T) {
	a := &Matrix{Rows: 2, K: 40, Packed: make([]uint8, 40), Scales: make([]uint8, 5)}
	if _, err := Dequantize(context.Background(), a); err == nil || err.Error() != "matrix has K = 40, not a multiple of 16" {
		t.Errorf("K = 40: %v", err)
	}
	b := &Matrix{Rows: 1, K: 16, Packed: make([]uint8, 8), Scales: make([]uint8, 1)}
	if _, err := DequantizeExpected(context.Background(), b, tensor.I32); err == nil {
		t.Error("I32 output accepted")
	}
}

func TestPackUnpack(t *testing.T) {
	// Elements 0..3 = codes 1, 2, 15, 8: bytes 0x21 and 0x8F.
	p := Pack([]uint8{1, 2, 15, 8})
	if len(p) != 2 || p[0] != 0x21 || p[1] != 0x8F {
		t.Fatalf("Pack = % X, want 21 8F", p)
	}
	u := Unpack(p)
	for i, want := range []uint8{1, 2, 15, 8} {
		if u[i] != want || CodeAt(p, i) != want {
			t.Errorf("element %d: Unpack %d CodeAt %d, want %d", i, u[i], CodeAt(p, i), want)
		}
	}
	if p := Pack([]uint8{5}); len(p) != 1 || p[0] != 0x05 {
		t.Errorf("odd Pack = % X, want 05", p)
	}
}

func TestParseGlobalKind(t *testing.T) {
	for _, s := range []string{"dequant", "quant"} {
		k, err := ParseGlobalKind(s)
		if err != nil || k.String() != s {
			t.Errorf("ParseGlobalKind(%q) = %v, %v", s, k, err)
		}
	}
	if _, err := ParseGlobalKind("inverse"); err == nil {
		t.Error("ParseGlobalKind accepted \"inverse\"")
	}
}

// A CodeTable's lookups, from any element on and of any length, are each
// element's value computed alone from its codes by the definition, both
// tables and both kinds; and the whole-matrix dequantizers agree with them.
func TestCodeTableValuesMatchTheDefinition(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	rows, k := 7, 48
	a := &Matrix{Rows: rows, K: k, Packed: make([]uint8, rows*k/2), Scales: make([]uint8, rows*k/BlockSize), Global: 0.0123}
	for i := range a.Packed {
		a.Packed[i] = uint8(r.Uint32())
	}
	for i := range a.Scales {
		if a.Scales[i] = uint8(r.Uint32()); a.Scales[i]&0x7F == 0x7F {
			a.Scales[i]-- // NaN-free: 0x7F and 0xFF are E4M3FN's NaNs
		}
	}
	for _, kind := range []GlobalKind{Dequant, Quant} {
		a.Kind = kind
		g := a.Global
		exact := func(i int) float64 {
			v := CodeValue(CodeAt(a.Packed, i)) * ScaleValue(a.Scales[i/BlockSize])
			if kind == Quant {
				return v / g
			}
			return v * g
		}
		expected := func(i int) float64 {
			v := float32(CodeValue(CodeAt(a.Packed, i)) * ScaleValue(a.Scales[i/BlockSize]))
			if kind == Quant {
				return RoundTo(tensor.F16, float64(v/float32(g)))
			}
			return RoundTo(tensor.F16, float64(v*float32(g)))
		}
		xt, err := ExactTable(a)
		if err != nil {
			t.Fatal(err)
		}
		et, err := ExpectedTable(a, tensor.F16)
		if err != nil {
			t.Fatal(err)
		}
		xs, err := Dequantize(context.Background(), a)
		if err != nil {
			t.Fatal(err)
		}
		es, err := DequantizeExpected(context.Background(), a, tensor.F16)
		if err != nil {
			t.Fatal(err)
		}
		for _, run := range [][2]int{{0, rows * k}, {1, 30}, {15, 2}, {47, 3}, {rows*k - 1, 1}, {100, 0}} {
			lo, n := run[0], run[1]
			xv, ev := make([]float64, n), make([]float64, n)
			xt.Values(a, lo, xv)
			et.Values(a, lo, ev)
			for q := range n {
				i := lo + q
				if math.Float64bits(xv[q]) != math.Float64bits(exact(i)) || math.Float64bits(xs[i]) != math.Float64bits(exact(i)) {
					t.Fatalf("kind %d, run %v: exact element %d is %v (Values) and %v (Dequantize); its codes give %v", kind, run, i, xv[q], xs[i], exact(i))
				}
				if math.Float64bits(ev[q]) != math.Float64bits(expected(i)) || math.Float64bits(es[i]) != math.Float64bits(expected(i)) {
					t.Fatalf("kind %d, run %v: expected element %d is %v (Values) and %v (DequantizeExpected); its codes give %v", kind, run, i, ev[q], es[i], expected(i))
				}
			}
		}
	}
}
