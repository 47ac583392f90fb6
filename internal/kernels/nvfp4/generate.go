package nvfp4

import (
	"context"

	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/nvfp4"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// The default sizes of a case that gives none: M rows (tokens) of K, and N
// weight rows for the GEMM.
const defaultM, defaultK, defaultN = 32, 256, 64

// shape is the case's M and K.
func shape(c Case) (m, k int) {
	m, k = c.M, c.K
	if m == 0 {
		m = defaultM
	}
	if k == 0 {
		k = defaultK
	}
	return m, k
}

// activations returns bf16-representable values like a layer's: normal
// with a few outlier channels (the reason per-block scales exist); ctx's
// error once it is done.
func activations(ctx context.Context, r *RNG, n, cols int) ([]float64, error) {
	v := make([]float64, n)
	if err := Normals(ctx, r, v); err != nil {
		return nil, err
	}
	for i, x := range v {
		if (i%cols)%97 == 13 {
			x *= 20 // an outlier channel
		}
		v[i] = formats.RoundBF16(x)
	}
	return v, nil
}

// quantized makes packed codes and block scales the way an engine would:
// what Produce stores of the nvfp4_quantize reference on x (bf16 values,
// as activations and the weights make them) and its global scale, which is
// the reference's expected side alone. The exact side, and the judge of
// ties beside it, only a check needs: they were two thirds of the
// generation of a weight-sized GEMM case (issue 17).
func quantized(ctx context.Context, x []float64, rows, k int, layout string) (packed, scale *tensor.Tensor, gs float64, err error) {
	gs = float64(float32(448 * 6 / AbsMax(x))) // as its F32 global_scale holds it
	lay, err := nvfp4.ParseLayout(layout)
	if err != nil {
		return nil, nil, 0, err
	}
	q, err := nvfp4.QuantizeExpectedCodes(ctx, x, rows, k, gs)
	if err != nil {
		return nil, nil, 0, err
	}
	codes, shape, err := laidOut(q.Scales, rows, k/nvfp4.BlockSize, lay)
	if err != nil {
		return nil, nil, 0, err
	}
	// Produce stores the scales from their values, as a backend's output.
	vals := make(Dense, len(codes))
	for i, c := range codes {
		vals[i] = formats.E4M3FN.Decode(c)
	}
	if scale, err = MaterializeContext(ctx, tensor.F8E4M3, shape, vals); err != nil {
		return nil, nil, 0, err
	}
	packed = tensor.New(tensor.U8, rows, k/2)
	copy(packed.Data, q.Packed())
	return packed, scale, gs, nil
}

// globalFor expresses a quant-direction global scale gs in the direction
// the case declares.
func globalFor(gs float64, kind string) float64 {
	if kind == "quant" {
		return gs
	}
	return 1 / gs
}

// Defaults implements Generator: none beyond the case's.
func (*quantize) Defaults(Case) Params { return Params{} }

// Defaults implements Generator: none beyond the case's.
func (*dequantize) Defaults(Case) Params { return Params{} }

// Defaults implements Generator: none beyond the case's.
func (*gemm) Defaults(Case) Params { return Params{} }

// Generate implements Generator.
func (*quantize) Generate(ctx context.Context, c Case, r *RNG) (map[string]*tensor.Tensor, error) {
	m, k := shape(c)
	x, err := activations(ctx, r, m*k, k)
	if err != nil {
		return nil, err
	}
	return map[string]*tensor.Tensor{"x": BF16([]int{m, k}, x), "global_scale": F32Scalar(448 * 6 / AbsMax(x))}, nil
}

// Generate implements Generator: activations quantized by the reference.
func (*dequantize) Generate(ctx context.Context, c Case, r *RNG) (map[string]*tensor.Tensor, error) {
	m, k := shape(c)
	x, err := activations(ctx, r, m*k, k)
	if err != nil {
		return nil, err
	}
	packed, scale, gs, err := quantized(ctx, x, m, k, c.Params.String("scale_layout", "linear"))
	if err != nil {
		return nil, err
	}
	return map[string]*tensor.Tensor{"packed": packed, "block_scale": scale,
		"global_scale": F32Scalar(globalFor(gs, c.Params.String("global_scale_kind", "dequant")))}, nil
}

// Generate implements Generator: activations and init-like weights, both
// quantized by the reference.
func (*gemm) Generate(ctx context.Context, c Case, r *RNG) (map[string]*tensor.Tensor, error) {
	m, k := shape(c)
	n := c.N
	if n == 0 {
		n = defaultN
	}
	a, err := activations(ctx, r, m*k, k)
	if err != nil {
		return nil, err
	}
	w := make([]float64, n*k)
	if err := Normals(ctx, r, w); err != nil {
		return nil, err
	}
	for i, x := range w {
		w[i] = formats.RoundBF16(x * 0.02) // init-like weights
	}
	layout := c.Params.String("scale_layout", "linear")
	ap, as, ags, err := quantized(ctx, a, m, k, layout)
	if err != nil {
		return nil, err
	}
	bp, bs, bgs, err := quantized(ctx, w, n, k, layout)
	if err != nil {
		return nil, err
	}
	return map[string]*tensor.Tensor{
		"a_packed": ap, "a_scale": as, "a_global": F32Scalar(globalFor(ags, c.Params.String("a_global_kind", "dequant"))),
		"b_packed": bp, "b_scale": bs, "b_global": F32Scalar(globalFor(bgs, c.Params.String("b_global_kind", "dequant"))),
	}, nil
}

// planCost is what the three generators build, estimated alike (generated
// float64, bf16, quantized), with the shapes every one of them reads.
func planCost(c Case, cost *Cost, gemm bool) Shapes {
	m, k, n := int64(c.M), int64(c.K), int64(c.N)
	if m == 0 {
		m = defaultM
	}
	if k == 0 {
		k = defaultK
	}
	if n == 0 {
		n = defaultN
	}
	s := NewShapes()
	cost.Input("x", []int64{m, k}, 48)
	s.Dims["x"] = []int64{m, k}
	s.Dims["packed"] = []int64{m, k / 2}
	s.Dims["a_packed"] = []int64{m, k / 2}
	s.Dims["b_packed"] = []int64{n, k / 2}
	if gemm {
		cost.Input("b", []int64{n, k}, 48)
	}
	return s
}

// PlanCost implements Generator.
func (*quantize) PlanCost(c Case, cost *Cost) Shapes { return planCost(c, cost, false) }

// PlanCost implements Generator.
func (*dequantize) PlanCost(c Case, cost *Cost) Shapes { return planCost(c, cost, false) }

// PlanCost implements Generator.
func (*gemm) PlanCost(c Case, cost *Cost) Shapes { return planCost(c, cost, true) }
