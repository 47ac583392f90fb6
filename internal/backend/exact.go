package backend

import (
	"context"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Exact is the exact chain: every kernel's EXACT reference answer (float64
// arithmetic, exact division and dequantization), rounded only to the
// dtype the contract stores it in. The distance between a run on the
// reference at kernel precision and a run on Exact is the noise floor of
// the simulation: what a correct kernel of the declared precision
// accumulates over the steps.
//
// Bitwise outputs (NVFP4 codes and scales, cache bytes) take the expected
// answer: they have no precision to lose, and their exact and expected
// answers differ only where a value lies on a rounding tie, which both
// break correctly. A tie broken the other way moves one FP4 code by a whole
// step, so letting the floor chain break ties differently would put a rare,
// large jump into the floor instead of the precision noise it measures.
type Exact struct{}

// Name implements Backend.
func (Exact) Name() string { return "exact" }

// InProcess implements InProcess.
func (Exact) InProcess() bool { return true }

// Run implements Backend.
func (Exact) Run(ctx context.Context, name string, in kernel.Inputs) (map[string]*tensor.Tensor, error) {
	k, err := kernel.Lookup(name)
	if err != nil {
		return nil, err
	}
	prec, err := kernel.PrecisionFrom(in.Params)
	if err != nil {
		return nil, err
	}
	outs, err := kernel.Evaluate(ctx, k, in, prec, nil)
	if err != nil {
		return nil, err
	}
	res := make(map[string]*tensor.Tensor, len(outs))
	for _, o := range outs {
		v := o.Exact
		if o.Mode == kernel.Bitwise {
			v = o.Expected
		}
		if res[o.Name], err = kernel.MaterializeContext(ctx, o.DType, o.Shape, v); err != nil {
			return nil, err
		}
	}
	return res, nil
}
