package nvfp4

import (
	"context"

	"github.com/kcheck-dev/kcheck/reference/parallel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Dequantize returns the exact value of every element of a (reference/CONTRACTS.md §3.2),
// [Rows*K] row-major: e2m1(code) * e4m3(scale) * g for the dequant kind and
// e2m1(code) * e4m3(scale) / g for the quant kind, each with a single
// float64 rounding (the code-scale product is exact). A NaN scale gives NaN.
func Dequantize(ctx context.Context, a *Matrix) ([]float64, error) {
	if err := a.Check("matrix"); err != nil {
		return nil, err
	}
	out := make([]float64, a.Rows*a.K)
	g := a.Global
	err := a.eachBlock(ctx, func(b int, vals *[BlockSize]float64) {
		o := out[b*BlockSize : (b+1)*BlockSize]
		for j, v := range vals {
			if a.Kind == Quant {
				o[j] = v / g
			} else {
				o[j] = v * g
			}
		}
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// DequantizeExpected is what a dequantization kernel computing in fp32
// writes in dtype out: (e2m1(code) * e4m3(scale)) in fp32 (exact), then
// times the fp32 global scale for the dequant kind or divided by it for the
// quant kind (as vLLM's and FlashInfer's reference dequantizers do it,
// `x * sf / global_scale` in torch fp32), then rounded to out.
func DequantizeExpected(ctx context.Context, a *Matrix, out tensor.DType) ([]float64, error) {
	if err := a.Check("matrix"); err != nil {
		return nil, err
	}
	if err := checkOutDType(out); err != nil {
		return nil, err
	}
	g := float32(a.Global)
	res := make([]float64, a.Rows*a.K)
	err := a.eachBlock(ctx, func(b int, vals *[BlockSize]float64) {
		o := res[b*BlockSize : (b+1)*BlockSize]
		for j, v := range vals {
			bv := float32(v) // exact: see blockValues
			var f float32
			if a.Kind == Quant {
				f = float32(bv / g)
			} else {
				f = float32(bv * g)
			}
			o[j] = RoundTo(out, float64(f))
		}
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// eachBlock calls fn for every 16-element block b (row-major over the
// matrix) with the block's values e2m1(code)*e4m3(scale), exact in float64,
// the blocks shared out to GOMAXPROCS goroutines in runs of rows. fn writes
// only block b's outputs, so the result does not depend on the sharing.
// It stops between runs of rows once ctx is done, returning its error.
func (a *Matrix) eachBlock(ctx context.Context, fn func(b int, vals *[BlockSize]float64)) error {
	kb := a.K / BlockSize
	if kb == 0 || a.Rows == 0 {
		return ctx.Err()
	}
	rowsPer := max(1, (1<<16)/a.K)
	units := (a.Rows + rowsPer - 1) / rowsPer
	return parallel.Each(ctx, units, func(u int) {
		var vals [BlockSize]float64
		for r := u * rowsPer; r < min((u+1)*rowsPer, a.Rows); r++ {
			for b := r * kb; b < (r+1)*kb; b++ {
				s := ScaleValue(a.Scales[b])
				packed := a.Packed[b*BlockSize/2 : (b+1)*BlockSize/2]
				for j, p := range packed {
					vals[2*j] = e2m1Values[p&0xF] * s
					vals[2*j+1] = e2m1Values[p>>4] * s
				}
				fn(b, &vals)
			}
		}
	})
}
