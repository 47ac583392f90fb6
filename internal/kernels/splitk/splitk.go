// Package splitk is the splitk_combine kernel (reference/CONTRACTS.md §3.8): its contract,
// its validated problem, its reference over reference/splitk, and what the
// tools ask of it (cost, case inputs, slicing, roofline).
//
// The family is written in the framework's vocabulary, dot-imported: its
// code reads as it did inside internal/kernel, where it was born.
package splitk

import (
	"context"
	"fmt"
	"math"

	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/splitk"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// splitk_combine: the contract tensors adapted to reference/splitk. out [N, L] is named row, latent; lse [N] row. Derived:
// splits_used, the number of non-empty splits of the row (a combine that
// mishandles empty splits errs exactly where it is below S), and tile128 for
// out (latent / 128).

func init() { Register(combine{}) }

// combine is splitk_combine.
type combine struct{}

var spec = Spec{
	Name:    "splitk_combine",
	Stage:   StageCombine,
	Summary: "flash-decoding split-K reduction of partial outputs and lse",
	Inputs: []TensorSpec{
		{Name: "partial_out", DTypes: []tensor.DType{tensor.F32}, Rank: 3},
		{Name: "partial_lse", DTypes: []tensor.DType{tensor.F32}, Rank: 2, Meaningful: []float64{math.Inf(-1)}}, // an empty split
	},
	Outputs: []TensorSpec{
		{Name: "out", DTypes: []tensor.DType{tensor.BF16, tensor.F32}},
		{Name: "lse", DTypes: []tensor.DType{tensor.F32}},
	},
	Params: []ParamSpec{
		{Name: "num_splits", Kind: ParamInt, Doc: "S; when given it must equal partial_out's split dimension (reference/CONTRACTS.md §3.6.1)"},
		{Name: "lse_base", Kind: ParamEnum, Default: "e", Allowed: []string{"e", "2"}, Doc: "the base the partial and combined lse are in (FlashMLA: e; FlashInfer: 2)"},
		{Name: "lse_empty", Kind: ParamEnum, Default: "-inf", Allowed: []string{"-inf", "+inf", "inf"}, Doc: "how an empty split's lse is marked"},
	},
}

// Spec implements Kernel.
func (combine) Spec() *Spec { return &spec }

// CombineProblem is a validated splitk_combine: N rows of S splits of L
// values, and the convention their lse are written in. The CUDA launcher
// takes it as the reference does.
type CombineProblem struct {
	in Inputs
	// PartialOut [N, S, L] and PartialLSE [N, S] are the inputs, F32.
	PartialOut, PartialLSE *tensor.Tensor
	N, S, L                int
	Convention             splitk.Convention
}

// Inputs implements Problem.
func (p *CombineProblem) Inputs() Inputs { return p.in }

// Validate implements Kernel.
func (combine) Validate(in Inputs) (Problem, error) {
	po := in.Tensors["partial_out"]
	pl := in.Tensors["partial_lse"]
	if err := CheckShape("partial_out", po, -1, -1, -1); err != nil {
		return nil, err
	}
	n, s, l := po.Shape[0], po.Shape[1], po.Shape[2]
	if len(pl.Shape) != 2 || pl.Shape[0] != n || pl.Shape[1] != s {
		return nil, fmt.Errorf("tensor partial_lse has shape %v but partial_out [N, S, L] = %v needs [%d, %d] (one lse a split)", pl.Shape, po.Shape, n, s)
	}
	if s < 1 {
		return nil, fmt.Errorf("tensor partial_out has shape %v: no split to combine (S = 0)", po.Shape)
	}
	// S is partial_out's split dimension; a num_splits parameter, when a
	// capture carries one, must say the same (reference/CONTRACTS.md §3.6.1).
	if ns, err := in.Params.Int("num_splits", s); err != nil {
		return nil, err
	} else if ns != s {
		return nil, fmt.Errorf("parameter num_splits = %d but tensor partial_out has S = %d splits (shape %v)", ns, s, po.Shape)
	}
	base, err := splitk.ParseBase(in.Params.String("lse_base", "e"))
	if err != nil {
		return nil, err
	}
	empty, err := splitk.ParseEmpty(in.Params.String("lse_empty", "-inf"))
	if err != nil {
		return nil, err
	}
	return &CombineProblem{in: in, PartialOut: po, PartialLSE: pl, N: n, S: s, L: l, Convention: splitk.Convention{Base: base, Empty: empty}}, nil
}

// Reference implements Kernel.
func (combine) Reference(ctx context.Context, p Problem, prec Precision, outDTypes OutDTypes) ([]Output, error) {
	pr := p.(*CombineProblem)
	n, s, l := pr.N, pr.S, pr.L
	outDT, err := OutDType(outDTypes, "out", tensor.BF16, tensor.BF16, tensor.F32)
	if err != nil {
		return nil, err
	}
	lseDT, err := OutDType(outDTypes, "lse", tensor.F32, tensor.F32)
	if err != nil {
		return nil, err
	}
	lse := pr.PartialLSE.Float64s()
	// the partials are read as fp32, in place (a mapped capture's tensor
	// is not widened to float64: 268 MB more at 64 splits of 1024 rows)
	ex, xp, err := splitk.Combine(ctx, pr.PartialOut.Float32s(), lse, n, s, l, pr.Convention, outDT, lseDT)
	if err != nil {
		return nil, err
	}
	used := make([]int, n)
	for r := 0; r < n; r++ {
		for k := 0; k < s; k++ {
			if !math.IsInf(lse[r*s+k], -1) {
				used[r]++
			}
		}
	}
	return []Output{
		{
			Name: "out", Shape: []int{n, l}, DType: outDT, Exact: Dense(ex.Out), Expected: Dense(xp.Out),
			Mode: Numeric, Reduction: s,
			Coords: Coords{Axes: []CoordKind{KindRow, KindLatent}, Derived: func(idx []int) []Coord {
				return []Coord{{Kind: KindSplitsUsed, Value: used[idx[0]]}, {Kind: KindTile128, Value: idx[1] / 128}}
			}},
		},
		{
			Name: "lse", Shape: []int{n}, DType: lseDT, Exact: Dense(ex.LSE), Expected: Dense(xp.LSE),
			Mode: Numeric, Reduction: s,
			Coords: Coords{Axes: []CoordKind{KindRow}, Derived: func(idx []int) []Coord {
				return []Coord{{Kind: KindSplitsUsed, Value: used[idx[0]]}}
			}},
		},
	}, nil
}
