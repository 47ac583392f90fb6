package nvfp4

import (
	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Cost implements Coster: x decoded (8), codes (1), their inputs (8),
// packed and scales out.
func (*quantize) Cost(s Shapes, p Params, c *Cost) {
	m, k := s.Dim("x", 0), s.Dim("x", 1)
	c.Input("x", []int64{m, k}, 24)
	c.Output("packed", m, k/2+1)
	c.Output("block_scale", m+128, k/16+4)
	c.Ops(MulSizes(m, k, 16))
}

// Cost implements Coster.
func (*dequantize) Cost(s Shapes, p Params, c *Cost) {
	m, k := s.Dim("packed", 0), MulSizes(s.Dim("packed", 1), 2)
	c.Input("packed", []int64{m, k}, 16)
	c.LazyOutput("out", 8, m, k) // read from the codes (codeValues), stored at most as F64
	c.Ops(MulSizes(m, k))
}

// Cost implements Coster: both operands dequantized, in float32 and
// float64.
func (*gemm) Cost(s Shapes, p Params, c *Cost) {
	m, n, k := s.Dim("a_packed", 0), s.Dim("b_packed", 0), MulSizes(s.Dim("a_packed", 1), 2)
	c.Input("a_packed", []int64{m, k}, 24)
	c.Input("b_packed", []int64{n, k}, 24)
	c.Output("out", m, n)
	c.Ops(MulSizes(m, n, k, 2))
}

// Roofline implements Roofliner: every tensor once.
func (*quantize) Roofline(in Inputs, outs map[string]*tensor.Tensor) (int64, float64) {
	return StreamedBytes(in, outs), 0
}

// Roofline implements Roofliner: every tensor once.
func (*dequantize) Roofline(in Inputs, outs map[string]*tensor.Tensor) (int64, float64) {
	return StreamedBytes(in, outs), 0
}

// Roofline implements Roofliner: every tensor once, and 2·M·N·K flops.
func (*gemm) Roofline(in Inputs, outs map[string]*tensor.Tensor) (int64, float64) {
	a, b := in.Tensors["a_packed"], in.Tensors["b_packed"]
	return StreamedBytes(in, outs), 2 * float64(a.Shape[0]) * float64(b.Shape[0]) * float64(2*a.Shape[1])
}

// CaseContexts implements Contexter: no context.
func (*quantize) CaseContexts() bool { return false }

// CaseContexts implements Contexter: no context.
func (*dequantize) CaseContexts() bool { return false }

// CaseContexts implements Contexter: no context.
func (*gemm) CaseContexts() bool { return false }
