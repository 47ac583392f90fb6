package nvfp4

import (
	"context"
	"math/rand/v2"
	"testing"

	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/kernel/kerneltest"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// TestValidate: every shape, value and parameter check of the three
// kernels is Validate's; only the output dtypes, which the call alone
// knows, are Reference's.
func TestValidate(t *testing.T) {
	x, gs := fp4X(rand.New(rand.NewPCG(1, 2)), 4, 32)
	_, q := fp4Quantized(t, 4, 32, "linear")
	with := func(ts map[string]*tensor.Tensor, p Params, edit func(map[string]*tensor.Tensor)) Inputs {
		c := map[string]*tensor.Tensor{}
		for k, v := range ts {
			c[k] = v
		}
		if edit != nil {
			edit(c)
		}
		if p == nil {
			p = Params{}
		}
		return Inputs{Tensors: c, Params: p}
	}
	quant := map[string]*tensor.Tensor{"x": x, "global_scale": fp4Scalar(gs)}
	deq := map[string]*tensor.Tensor{"packed": q["packed"], "block_scale": q["block_scale"], "global_scale": fp4Scalar(gs)}
	gemm := map[string]*tensor.Tensor{"a_packed": q["packed"], "a_scale": q["block_scale"], "a_global": fp4Scalar(gs),
		"b_packed": q["packed"], "b_scale": q["block_scale"], "b_global": fp4Scalar(1, 1)}
	for _, c := range []struct {
		kernel, name string
		in           Inputs
		want         string
	}{
		{"nvfp4_quantize", "x rank", with(quant, nil, func(ts map[string]*tensor.Tensor) { ts["x"] = tensor.New(tensor.BF16, 64) }),
			"tensor x has shape [64]; the contract wants [M, K]"},
		{"nvfp4_quantize", "x K", with(quant, nil, func(ts map[string]*tensor.Tensor) { ts["x"] = tensor.New(tensor.BF16, 2, 40) }),
			"tensor x has K = 40, not a multiple of 16"},
		{"nvfp4_quantize", "x bytes", with(quant, nil, func(ts map[string]*tensor.Tensor) {
			ts["x"] = &tensor.Tensor{DType: tensor.BF16, Shape: []int{4, 32}, Data: make([]byte, 10)}
		}), "tensor x: shape [4 32] of BF16 needs 256 bytes, has 10"},
		{"nvfp4_quantize", "global shape", with(quant, nil, func(ts map[string]*tensor.Tensor) { ts["global_scale"] = tensor.New(tensor.F32, 2) }),
			"tensor global_scale has shape [2]; the contract wants [] or [1]"},
		{"nvfp4_quantize", "layout", with(quant, Params{"scale_layout": "swizzled"}, nil),
			`parameter scale_layout = "swizzled": want one of linear, swizzled_128x4, swizzled_8x4`},
		{"nvfp4_dequantize", "kind", with(deq, Params{"global_scale_kind": "inverse"}, nil),
			`parameter global_scale_kind = "inverse": want one of dequant, quant`},
		{"nvfp4_dequantize", "packed K", with(deq, nil, func(ts map[string]*tensor.Tensor) { ts["packed"] = tensor.New(tensor.U8, 4, 20) }),
			"tensor packed has K = 40, not a multiple of 16"},
		{"nvfp4_dequantize", "linear scales", with(deq, nil, func(ts map[string]*tensor.Tensor) { ts["block_scale"] = tensor.New(tensor.F8E4M3, 4, 3) }),
			"tensor block_scale has shape [4 3]; with scale_layout = linear and packed [4 16] (K = 32) it must be [4, 2]"},
		{"nvfp4_dequantize", "swizzled scales", with(deq, Params{"scale_layout": "swizzled_128x4"}, nil),
			"tensor block_scale has shape [4 2]; with scale_layout = swizzled_128x4 and packed [4 16] (K = 32) it must be [128, 4] or [512] (rows padded to 128, scale columns to 4)"},
		{"nvfp4_gemm", "b_global shape", with(gemm, nil, func(ts map[string]*tensor.Tensor) { ts["b_global"] = tensor.New(tensor.F32, 1, 2) }),
			"tensor b_global has shape [1 2]; the contract wants [] or [1]"},
		{"nvfp4_gemm", "K differs", with(gemm, nil, func(ts map[string]*tensor.Tensor) {
			ts["b_packed"] = tensor.New(tensor.U8, 3, 32)
			ts["b_scale"] = tensor.New(tensor.F8E4M3, 3, 4)
		}), "tensor a_packed has K = 32 but b_packed has K = 64"},
		{"nvfp4_gemm", "b kind", with(gemm, Params{"b_global_kind": "x"}, nil),
			`parameter b_global_kind = "x": want one of dequant, quant`},
	} {
		kerneltest.RefusedByValidate(t, c.kernel, c.name, c.in, c.want)
	}

	// An output dtype the contract does not allow is the reference's to
	// refuse: Validate has no output to look at.
	for _, c := range []struct {
		kernel string
		in     Inputs
		out    OutDTypes
		want   string
	}{
		{"nvfp4_quantize", with(quant, nil, nil), OutDTypes{"packed": tensor.I8}, "output packed has dtype I8; the contract wants U8"},
		{"nvfp4_dequantize", with(deq, nil, nil), OutDTypes{"out": tensor.F8E4M3}, "output out has dtype F8_E4M3; the contract wants [BF16 F16 F32]"},
	} {
		k, _ := Lookup(c.kernel)
		p, err := Validate(k, c.in)
		if err != nil {
			t.Fatalf("%s: Validate: %v", c.kernel, err)
		}
		if _, err := k.Reference(context.Background(), p, DefaultPrecision(), c.out); err == nil || err.Error() != c.want {
			t.Errorf("%s: Reference: %v, want %q", c.kernel, err, c.want)
		}
	}
}
