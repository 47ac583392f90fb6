package nvfp4

import (
	"context"
	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/nvfp4"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

func fp4Scalar(v float64, shape ...int) *tensor.Tensor {
	return tensor.FromFloat64s(tensor.F32, shape, []float64{v})
}

// fp4X returns bf16 activations [m, k] and their vLLM global scale 2688/amax.
func fp4X(r *rand.Rand, m, k int) (*tensor.Tensor, float64) {
	vals := make([]float64, m*k)
	amax := 0.0
	for i := range vals {
		vals[i] = formats.RoundBF16(r.NormFloat64() * math.Exp2(float64(r.IntN(8)-4)))
		amax = math.Max(amax, math.Abs(vals[i]))
	}
	return tensor.FromFloat64s(tensor.BF16, []int{m, k}, vals), float64(float32(2688 / amax))
}

func fp4Quantized(t *testing.T, m, k int, layout string) (Inputs, map[string]*tensor.Tensor) {
	t.Helper()
	x, gs := fp4X(rand.New(rand.NewPCG(uint64(m), uint64(k))), m, k)
	in := Inputs{Tensors: map[string]*tensor.Tensor{"x": x, "global_scale": fp4Scalar(gs)},
		Params: Params{"scale_layout": layout}}
	k4, _ := Lookup("nvfp4_quantize")
	out, err := Produce(context.Background(), k4, in, DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return in, out
}

func TestNVFP4AdapterErrors(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	x, gs := fp4X(r, 4, 32)
	qin := func(mod func(map[string]*tensor.Tensor), p Params) Inputs {
		ts := map[string]*tensor.Tensor{"x": x, "global_scale": fp4Scalar(gs)}
		if mod != nil {
			mod(ts)
		}
		return Inputs{Tensors: ts, Params: p}
	}
	_, q := fp4Quantized(t, 4, 32, "linear")
	din := func(mod func(map[string]*tensor.Tensor), p Params) Inputs {
		ts := map[string]*tensor.Tensor{"packed": q["packed"], "block_scale": q["block_scale"], "global_scale": fp4Scalar(gs)}
		if mod != nil {
			mod(ts)
		}
		return Inputs{Tensors: ts, Params: p}
	}
	gin := func(mod func(map[string]*tensor.Tensor)) Inputs {
		ts := map[string]*tensor.Tensor{
			"a_packed": q["packed"], "a_scale": q["block_scale"], "a_global": fp4Scalar(gs),
			"b_packed": q["packed"], "b_scale": q["block_scale"], "b_global": fp4Scalar(1, 1),
		}
		if mod != nil {
			mod(ts)
		}
		return Inputs{Tensors: ts, Params: Params{"a_global_kind": "quant"}}
	}
	tests := []struct {
		kernel string
		in     Inputs
		dtypes map[string]tensor.DType
		want   string
	}{
		{"nvfp4_quantize", qin(func(ts map[string]*tensor.Tensor) { delete(ts, "x") }, nil), nil,
			"tensor x is missing"},
		{"nvfp4_quantize", qin(func(ts map[string]*tensor.Tensor) { ts["x"] = tensor.New(tensor.F32, 4, 32) }, nil), nil,
			"tensor x has dtype F32; the contract wants BF16 or F16"},
		{"nvfp4_quantize", qin(func(ts map[string]*tensor.Tensor) { ts["x"] = tensor.New(tensor.BF16, 2, 40) }, nil), nil,
			"tensor x has K = 40, not a multiple of 16"},
		{"nvfp4_quantize", qin(func(ts map[string]*tensor.Tensor) { ts["x"] = tensor.New(tensor.BF16, 64) }, nil), nil,
			"tensor x has shape [64]; the contract wants [M, K]"},
		{"nvfp4_quantize", qin(func(ts map[string]*tensor.Tensor) { ts["global_scale"] = tensor.New(tensor.F32, 2) }, nil), nil,
			"tensor global_scale has shape [2]; the contract wants [] or [1]"},
		{"nvfp4_quantize", qin(func(ts map[string]*tensor.Tensor) { ts["global_scale"] = tensor.New(tensor.BF16) }, nil), nil,
			"tensor global_scale has dtype BF16"},
		{"nvfp4_quantize", qin(func(ts map[string]*tensor.Tensor) {
			ts["x"] = &tensor.Tensor{DType: tensor.BF16, Shape: []int{4, 32}, Data: make([]byte, 10)}
		}, nil), nil,
			"tensor x: shape [4 32] of BF16 needs 256 bytes, has 10"},
		{"nvfp4_quantize", qin(nil, Params{"scale_layout": "swizzled"}), nil,
			`parameter scale_layout = "swizzled"`},
		{"nvfp4_quantize", qin(nil, nil), map[string]tensor.DType{"block_scale": tensor.BF16},
			"output block_scale has dtype BF16"},
		{"nvfp4_quantize", qin(nil, nil), map[string]tensor.DType{"packed": tensor.I8},
			"output packed has dtype I8; the contract wants U8"},
		{"nvfp4_dequantize", din(func(ts map[string]*tensor.Tensor) { delete(ts, "block_scale") }, nil), nil,
			"tensor block_scale is missing"},
		{"nvfp4_dequantize", din(func(ts map[string]*tensor.Tensor) { ts["block_scale"] = tensor.New(tensor.BF16, 4, 2) }, nil), nil,
			"tensor block_scale has dtype BF16"},
		{"nvfp4_dequantize", din(func(ts map[string]*tensor.Tensor) { ts["packed"] = tensor.New(tensor.U8, 4, 20) }, nil), nil,
			"tensor packed has K = 40, not a multiple of 16"},
		{"nvfp4_dequantize", din(func(ts map[string]*tensor.Tensor) { ts["block_scale"] = tensor.New(tensor.F8E4M3, 4, 3) }, nil), nil,
			"tensor block_scale has shape [4 3]; with scale_layout = linear and packed [4 16] (K = 32) it must be [4, 2]"},
		{"nvfp4_dequantize", din(nil, Params{"scale_layout": "swizzled_128x4"}), nil,
			"tensor block_scale has shape [4 2]; with scale_layout = swizzled_128x4 and packed [4 16] (K = 32) it must be [128, 4] or [512]"},
		{"nvfp4_dequantize", din(nil, Params{"global_scale_kind": "inverse"}), nil,
			`parameter global_scale_kind = "inverse"`},
		{"nvfp4_dequantize", din(nil, nil), map[string]tensor.DType{"out": tensor.F8E4M3},
			"output out has dtype F8_E4M3"},
		{"nvfp4_gemm", gin(func(ts map[string]*tensor.Tensor) { delete(ts, "b_scale") }), nil,
			"tensor b_scale is missing"},
		{"nvfp4_gemm", gin(func(ts map[string]*tensor.Tensor) { ts["b_global"] = tensor.New(tensor.F32, 1, 2) }), nil,
			"tensor b_global has shape [1 2]"},
		{"nvfp4_gemm", gin(func(ts map[string]*tensor.Tensor) {
			ts["b_packed"] = tensor.New(tensor.U8, 3, 32)
			ts["b_scale"] = tensor.New(tensor.F8E4M3, 3, 4)
		}), nil, "tensor a_packed has K = 32 but b_packed has K = 64"},
		{"nvfp4_gemm", gin(func(ts map[string]*tensor.Tensor) { ts["a_packed"] = tensor.New(tensor.U8, 4, 4) }), nil,
			"tensor a_packed has K = 8, not a multiple of 16"},
	}
	for _, tc := range tests {
		k, err := Lookup(tc.kernel)
		if err != nil {
			t.Fatal(err)
		}
		_, err = Evaluate(context.Background(), k, tc.in, DefaultPrecision(), tc.dtypes)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want it to contain %q", tc.kernel, err, tc.want)
		}
	}
}

// NaN in the activations is data, not an error: the block's scale is NaN
// and every code of that block is acceptable.
func TestNVFP4QuantizeNaNInput(t *testing.T) {
	vals := make([]float64, 32)
	for i := range vals {
		vals[i] = float64(i%7) - 3
	}
	vals[20] = math.NaN()
	in := Inputs{Tensors: map[string]*tensor.Tensor{
		"x": tensor.FromFloat64s(tensor.BF16, []int{1, 32}, vals), "global_scale": fp4Scalar(1)}}
	k, _ := Lookup("nvfp4_quantize")
	outs, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil)
	if err != nil {
		t.Fatalf("NaN input rejected: %v", err)
	}
	scale := outs[1]
	if !math.IsNaN(scale.Exact.At(1)) || !math.IsNaN(scale.Expected.At(1)) || math.IsNaN(scale.Exact.At(0)) {
		t.Errorf("block scales %v / %v: want NaN in block 1 only", scale.Exact, scale.Expected)
	}
	if !outs[0].Equivalent(10, 0xFF) || outs[0].Equivalent(0, 0xFF) {
		t.Error("packed: any byte must be accepted in the NaN block (byte 10) and not in block 0")
	}
}

// The tie rules through the adapter. Block 0 of x is [6.375, 2.75, 1.25,
// ...]: gs*amax/6 = 1.0625 is the E4M3 midpoint of 1.0 (0x38) and 1.125
// (0x39). With the reference's scale 1.0: 6.375 -> 6 (code 7), 2.75 -> 3
// (code 5), 1.25 is an E2M1 tie -> 1.0 (code 2, even). With the other
// scale 1.125: 6.375/1.125 = 5.67 -> 6 (7), 2.75/1.125 = 2.44 -> 2 (code 4),
// 1.25/1.125 = 1.11 -> 1.0 (2). Block 1 is [3, 2.75, ...]: scale 3/6 = 0.5
// (0x30, no tie), 2.75/0.5 = 5.5 -> 6 (code 7).
func TestNVFP4QuantizeEquivalence(t *testing.T) {
	vals := make([]float64, 32)
	copy(vals, []float64{6.375, 2.75, 1.25})
	copy(vals[16:], []float64{3, 2.75})
	for _, layout := range []string{"linear", "swizzled_128x4"} {
		for _, sd := range []tensor.DType{tensor.F8E4M3, tensor.U8} {
			in := Inputs{Tensors: map[string]*tensor.Tensor{
				"x": tensor.FromFloat64s(tensor.BF16, []int{1, 32}, vals), "global_scale": fp4Scalar(1)},
				Params: Params{"scale_layout": layout}}
			k, _ := Lookup("nvfp4_quantize")
			outs, err := Evaluate(context.Background(), k, in, DefaultPrecision(), map[string]tensor.DType{"block_scale": sd})
			if err != nil {
				t.Fatal(err)
			}
			packed, scale := outs[0], outs[1]
			if packed.Expected.At(0) != 0x57 || packed.Expected.At(1) != 0x02 || packed.Expected.At(8) != 0x77 {
				t.Fatalf("packed bytes 0, 1, 8 = %#x %#x %#x; want 0x57 0x02 0x77", int(packed.Expected.At(0)), int(packed.Expected.At(1)), int(packed.Expected.At(8)))
			}
			for _, tc := range []struct {
				i    int
				b    float64
				want bool
				why  string
			}{
				{0, 0x47, true, "2.75 -> 2 is right under the other tie scale 1.125"},
				{0, 0x37, false, "code 3 (1.5) is no rounding of 2.75 under either scale"},
				{0, 0x75, false, "swapped nibbles"},
				{1, 0x03, true, "1.25 is an E2M1 tie: 1.5 is as good as 1.0"},
				{1, 0x04, false, "2.0 is not a neighbour of 1.25"},
				{1, 0x82, true, "-0 in the high nibble equals 0"},
				{8, 0x67, false, "block 1 has no scale tie: 2.75/0.5 = 5.5 is 6, not 4"},
			} {
				if got := packed.Equivalent(tc.i, tc.b); got != tc.want {
					t.Errorf("%s: packed byte %d = %#x equivalent %v, want %v (%s)", layout, tc.i, int(tc.b), got, tc.want, tc.why)
				}
			}
			val := func(c uint8) float64 {
				if sd == tensor.U8 {
					return float64(c)
				}
				return formats.E4M3FN.Decode(c)
			}
			b1 := 1 // block 1 (row 0, scale column 1): flat index 1 in both layouts (k%4 = 1)
			for _, tc := range []struct {
				i    int
				c    uint8
				want bool
			}{{0, 0x38, true}, {0, 0x39, true}, {0, 0x3A, false}, {b1, 0x30, true}, {b1, 0x31, false}} {
				if got := scale.Equivalent(tc.i, val(tc.c)); got != tc.want {
					t.Errorf("%s %s: scale %d = %#x equivalent %v, want %v", layout, sd, tc.i, tc.c, got, tc.want)
				}
			}
			if layout == "swizzled_128x4" {
				if len(scale.Shape) != 2 || scale.Shape[0] != 128 || scale.Shape[1] != 4 {
					t.Errorf("swizzled block_scale shape %v, want [128 4]", scale.Shape)
				}
				// Padding is zero by contract (reference/CONTRACTS.md §5): garbage there is a
				// fault a GEMM reading the padded tile would multiply by; -0
				// (E4M3 0x80) is the same value.
				if scale.Equivalent(2, val(0x55)) || scale.Expected.At(2) != 0 {
					t.Error("swizzled padding: expected 0 and garbage refused")
				}
				if sd != tensor.U8 && !scale.Equivalent(2, val(0x80)) {
					t.Error("swizzled padding: -0 refused")
				}
				// Storage [5, 0] of [128, 4] is byte 20 = 1*16 + 1*4 + 0:
				// scale row 1 + 32*1 = 33, column 0, padding (one row only).
				names := scale.Coords.Name([]int{5, 0})[2:]
				if names[0].Kind != KindRow || names[0].Value != 33 || names[1].Value != 0 || names[3].Value != 1 {
					t.Errorf("coords of swizzled byte 20: %v; want row 33, block16 0, padding 1", names)
				}
			}
		}
	}
}

// Produce (the reference backend) and the adapters agree with each other:
// quantize, then dequantize with the quant-kind global, recovers x within
// NVFP4's resolution; and the GEMM of the quantized x with itself is the
// dequantized product.
func TestNVFP4ProduceChain(t *testing.T) {
	for _, layout := range nvfp4.Layouts {
		in, q := fp4Quantized(t, 130, 80, layout)
		want := map[string][2]int{"linear": {130, 5}, "swizzled_128x4": {256, 8}, "swizzled_8x4": {136, 8}}[layout]
		if sh := q["block_scale"].Shape; len(sh) != 2 || sh[0] != want[0] || sh[1] != want[1] {
			t.Fatalf("%s scale shape %v, want %v", layout, sh, want)
		}
		gs := in.Tensors["global_scale"]
		dk, _ := Lookup("nvfp4_dequantize")
		din := Inputs{Tensors: map[string]*tensor.Tensor{"packed": q["packed"], "block_scale": q["block_scale"], "global_scale": gs},
			Params: Params{"scale_layout": layout, "global_scale_kind": "quant"}}
		d, err := Produce(context.Background(), dk, din, DefaultPrecision(), map[string]tensor.DType{"out": tensor.F32})
		if err != nil {
			t.Fatal(err)
		}
		x := in.Tensors["x"]
		var num, den float64
		for i := 0; i < x.Len(); i++ {
			e := x.Float64At(i) - d["out"].Float64At(i)
			num += e * e
			den += x.Float64At(i) * x.Float64At(i)
		}
		// NVFP4's SQNR on Gaussian-like data is about 20 dB (E2M1 has 3
		// magnitude bits); below 15 dB something is wrong.
		if sqnr := 10 * math.Log10(den/num); sqnr < 15 {
			t.Errorf("%s: quantize->dequantize SQNR %.1f dB", layout, sqnr)
		}

		gk, _ := Lookup("nvfp4_gemm")
		gin := Inputs{Tensors: map[string]*tensor.Tensor{
			"a_packed": q["packed"], "a_scale": q["block_scale"], "a_global": gs,
			"b_packed": q["packed"], "b_scale": q["block_scale"], "b_global": gs},
			Params: Params{"scale_layout": layout, "a_global_kind": "quant", "b_global_kind": "quant"}}
		outs, err := Evaluate(context.Background(), gk, gin, DefaultPrecision(), nil)
		if err != nil {
			t.Fatal(err)
		}
		o := outs[0]
		if o.Shape[0] != 130 || o.Shape[1] != 130 || o.Reduction != 80 || o.DType != tensor.BF16 {
			t.Fatalf("gemm output %v %v reduction %d", o.Shape, o.DType, o.Reduction)
		}
		deq := d["out"]
		for _, ij := range [][2]int{{0, 0}, {5, 129}, {129, 7}} {
			want := 0.0
			for c := 0; c < 80; c++ {
				want += deq.Float64At(ij[0]*80+c) * deq.Float64At(ij[1]*80+c)
			}
			if got := o.Exact.At(ij[0]*130 + ij[1]); math.Abs(got-want) > 1e-5*math.Abs(want) {
				t.Errorf("%s: gemm[%d,%d] = %g, dequantized dot %g", layout, ij[0], ij[1], got, want)
			}
		}
		if c := o.Coords.Name([]int{129, 7}); c[2].Kind != KindTile128 || c[2].Value != 1 {
			t.Errorf("gemm coords %v", c)
		}
	}
}

// Codes the engines write with their approximate reciprocals (the fp32
// emulation) and the exact-division codes are both accepted, everywhere.
// With vLLM's gs = 2688/amax, x*gs/s often lands within an ulp of an E2M1
// midpoint (gs is nearly a ratio of small numbers), so the two differ on
// a few elements of any real-sized tensor; the test needs some.
func TestNVFP4QuantizeExactIsEquivalent(t *testing.T) {
	k, _ := Lookup("nvfp4_quantize")
	differ := map[string]int{}
	for _, shape := range [][2]int{{64, 256}, {128, 512}, {96, 1024}} {
		in, _ := fp4Quantized(t, shape[0], shape[1], "swizzled_128x4")
		outs, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range outs {
			for i := 0; i < o.Exact.Len(); i++ {
				if o.Exact.At(i) != o.Expected.At(i) {
					differ[o.Name]++
					if !o.Equivalent(i, o.Exact.At(i)) {
						t.Errorf("%v %s[%d]: exact %v not equivalent to expected %v", shape, o.Name, i, o.Exact.At(i), o.Expected.At(i))
					}
				}
			}
		}
	}
	if differ["packed"] == 0 {
		t.Error("exact and fp32 codes never differed: the equivalence went untested")
	}
	t.Logf("elements where exact and fp32 differ: %v", differ)
}

func TestNVFP4DequantizeByHand(t *testing.T) {
	// Row 0: bytes 0x72 (1.0, 6.0), rest 0; scale 0x3C (1.5); global 2
	// (dequant): 1*1.5*2 = 3, 6*1.5*2 = 18.
	packed := tensor.New(tensor.U8, 1, 8)
	packed.Data[0] = 0x72
	scale := tensor.New(tensor.U8, 1, 1)
	scale.Data[0] = 0x3C
	in := Inputs{Tensors: map[string]*tensor.Tensor{"packed": packed, "block_scale": scale, "global_scale": fp4Scalar(2)}}
	k, _ := Lookup("nvfp4_dequantize")
	outs, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	o := outs[0]
	if o.Exact.At(0) != 3 || o.Exact.At(1) != 18 || o.Expected.At(1) != 18 || o.DType != tensor.BF16 || o.Mode != Numeric {
		t.Errorf("dequant: %v %v %v %v", Float64s(o.Exact)[:2], Float64s(o.Expected)[:2], o.DType, o.Mode)
	}
	c := o.Coords.Name([]int{0, 1})
	if len(c) != 5 || c[4].Kind != KindNibble || c[4].Value != 1 || c[2].Kind != KindScaleBlock {
		t.Errorf("coords %v", c)
	}
}
