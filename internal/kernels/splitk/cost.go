package splitk

import (
	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Cost implements Coster: the fp32 partials are read in place, or copied
// (4 bytes) when the file's data is not 4-byte aligned.
func (combine) Cost(s Shapes, p Params, c *Cost) {
	n, sp, l := s.Dim("partial_out", 0), s.Dim("partial_out", 1), s.Dim("partial_out", 2)
	c.Input("partial_out", []int64{n, sp, l}, 4)
	c.Input("partial_lse", []int64{n, sp}, 8)
	c.Output("out", n, l)
	c.Output("lse", n)
	c.Ops(MulSizes(n, sp, l, 2))
}

// Roofline implements Roofliner: every tensor once.
func (combine) Roofline(in Inputs, outs map[string]*tensor.Tensor) (int64, float64) {
	return StreamedBytes(in, outs), 0
}

// CaseContexts implements Contexter: no context.
func (combine) CaseContexts() bool { return false }
