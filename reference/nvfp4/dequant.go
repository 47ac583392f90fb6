package nvfp4

import (
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Dequantize returns the exact value of every element of a (spec 3.2),
// [Rows*K] row-major: e2m1(code) * e4m3(scale) * g for the dequant kind and
// e2m1(code) * e4m3(scale) / g for the quant kind, each with a single
// float64 rounding (the code-scale product is exact). A NaN scale gives NaN.
func Dequantize(a *Matrix) ([]float64, error) {
	if err := a.Check("matrix"); err != nil {
		return nil, err
	}
	v := a.blockValues()
	out := make([]float64, len(v))
	for i, bv := range v {
		if a.Kind == Quant {
			out[i] = float64(bv) / a.Global
		} else {
			out[i] = float64(bv) * a.Global
		}
	}
	return out, nil
}

// DequantizeExpected is what a dequantization kernel computing in fp32
// writes in dtype out: (e2m1(code) * e4m3(scale)) in fp32 (exact), then
// times the fp32 global scale for the dequant kind or divided by it for the
// quant kind (as vLLM's and FlashInfer's reference dequantizers do it,
// `x * sf / global_scale` in torch fp32), then rounded to out.
func DequantizeExpected(a *Matrix, out tensor.DType) ([]float64, error) {
	if err := a.Check("matrix"); err != nil {
		return nil, err
	}
	if err := checkOutDType(out); err != nil {
		return nil, err
	}
	g := float32(a.Global)
	v := a.blockValues()
	res := make([]float64, len(v))
	for i, bv := range v {
		var f float32
		if a.Kind == Quant {
			f = float32(bv / g)
		} else {
			f = float32(bv * g)
		}
		res[i] = RoundTo(out, float64(f))
	}
	return res, nil
}
