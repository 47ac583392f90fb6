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
	"strconv"
	"strings"

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
		// Engines merge partials in the model dtype (vLLM merge_attn_states,
		// FlashInfer merge_states: bf16 or fp16) as well as fp32
		// (reference/CONTRACTS.md §8.2): each is read exactly, as a kernel
		// loading it into fp32 registers does.
		{Name: "partial_out", DTypes: partialDTypes, Rank: 3},
		{Name: "partial_lse", DTypes: partialDTypes, Rank: 2, Meaningful: []float64{math.Inf(-1)}}, // an empty split
	},
	Outputs: []TensorSpec{
		{Name: "out", DTypes: partialDTypes},
		{Name: "lse", DTypes: partialDTypes},
	},
	Params: []ParamSpec{
		{Name: "num_splits", Kind: ParamInt, Doc: "S; when given it must equal partial_out's split dimension (reference/CONTRACTS.md §3.6.1)"},
		{Name: "lse_base", Kind: ParamEnum, Default: "e", Allowed: []string{"e", "2"}, Doc: "the base the partial and combined lse are in (FlashMLA: e; FlashInfer: 2)"},
		{Name: "lse_empty", Kind: ParamString, Default: "-inf", Doc: "the lse of a row whose splits are all empty: -inf, +inf, or a finite number (FlashInfer's Triton merge_states starts its state at -5e4 and writes -50000)"},
		{Name: "empty_row", Kind: ParamEnum, Default: "zero", Allowed: emptyRowNames, Doc: "what a merge writes for a row whose splits are all empty: " +
			"zero (out 0, lse per lse_empty: the contract, vLLM 0.33.0's Triton merge_attn_states, FlashInfer's merge_states), " +
			"nan (out and lse NaN: SGLang's merge_state, which has no guard), " +
			"first_split (out copies split 0's partial, lse per lse_empty: vLLM's CUDA merge_attn_states copies prefix_output)"},
	},
}

// partialDTypes are the dtypes a merge's partials and results come in.
var partialDTypes = []tensor.DType{tensor.F32, tensor.BF16, tensor.F16}

// EmptyRow is what a merge writes for a row that has no state at all.
type EmptyRow int

const (
	// EmptyZero writes out 0 and the convention's empty lse.
	EmptyZero EmptyRow = iota
	// EmptyNaN writes NaN to out and lse: 0/0 left unguarded.
	EmptyNaN
	// EmptyFirstSplit copies split 0's partial to out, lse as EmptyZero.
	EmptyFirstSplit
)

var emptyRowNames = []string{"zero", "nan", "first_split"}

func (e EmptyRow) String() string { return emptyRowNames[e] }

func parseEmptyRow(s string) (EmptyRow, error) {
	for i, n := range emptyRowNames {
		if s == n {
			return EmptyRow(i), nil
		}
	}
	return 0, fmt.Errorf("parameter empty_row = %q: want one of %s", s, strings.Join(emptyRowNames, ", "))
}

// parseLSEEmpty reads lse_empty: the infinities reference/splitk knows, or
// a finite number, an engine's sentinel for "no state".
func parseLSEEmpty(s string) (float64, error) {
	if v, err := splitk.ParseEmpty(s); err == nil {
		return v, nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) {
		return 0, fmt.Errorf("parameter lse_empty = %q: want -inf, +inf or a finite number", s)
	}
	return v, nil
}

// Spec implements Kernel.
func (combine) Spec() *Spec { return &spec }

// CombineProblem is a validated splitk_combine: N rows of S splits of L
// values, and the convention their lse are written in. The CUDA launcher
// takes it as the reference does.
type CombineProblem struct {
	in Inputs
	// PartialOut [N, S, L] and PartialLSE [N, S] are the inputs, F32,
	// BF16 or F16.
	PartialOut, PartialLSE *tensor.Tensor
	N, S, L                int
	Convention             splitk.Convention
	// EmptyRow is what the merge under test writes for a row with no state.
	EmptyRow EmptyRow
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
	empty, err := parseLSEEmpty(in.Params.String("lse_empty", "-inf"))
	if err != nil {
		return nil, err
	}
	er, err := parseEmptyRow(in.Params.String("empty_row", "zero"))
	if err != nil {
		return nil, err
	}
	return &CombineProblem{in: in, PartialOut: po, PartialLSE: pl, N: n, S: s, L: l,
		Convention: splitk.Convention{Base: base, Empty: empty}, EmptyRow: er}, nil
}

// Reference implements Kernel.
func (combine) Reference(ctx context.Context, p Problem, prec Precision, outDTypes OutDTypes) ([]Output, error) {
	pr := p.(*CombineProblem)
	n, s, l := pr.N, pr.S, pr.L
	// The declared precision of each result is its own dtype.
	outDT, err := OutDType(outDTypes, "out", tensor.BF16, partialDTypes...)
	if err != nil {
		return nil, err
	}
	lseDT, err := OutDType(outDTypes, "lse", tensor.F32, partialDTypes...)
	if err != nil {
		return nil, err
	}
	lse := pr.PartialLSE.Float64s()
	// fp32 partials are read in place (a mapped capture's tensor is not
	// widened to float64: 268 MB more at 64 splits of 1024 rows); bf16 and
	// fp16 ones are widened to fp32, exactly, as the kernel's loads do.
	po := pr.PartialOut.Float32s()
	if po == nil {
		po = make([]float32, pr.PartialOut.Len())
		for i := range po {
			po[i] = float32(pr.PartialOut.Float64At(i))
		}
	}
	ex, xp, err := splitk.Combine(ctx, po, lse, n, s, l, pr.Convention, outDT, lseDT)
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
		if used[r] == 0 {
			writeEmptyRow(pr.EmptyRow, po[r*s*l:r*s*l+l], outDT, ex.Out[r*l:(r+1)*l], xp.Out[r*l:(r+1)*l], &ex.LSE[r], &xp.LSE[r])
		}
	}
	return []Output{
		{
			Name: "out", Shape: []int{n, l}, DType: outDT, Exact: Dense(ex.Out), Expected: Dense(xp.Out),
			Mode: Numeric, Reduction: s,
			Coords: Coords{Axes: []CoordKind{KindRow, KindLatent}, Derived: func(dst []Coord, idx []int) []Coord {
				return append(dst, Coord{Kind: KindSplitsUsed, Value: used[idx[0]]}, Coord{Kind: KindTile128, Value: idx[1] / 128})
			}},
		},
		{
			Name: "lse", Shape: []int{n}, DType: lseDT, Exact: Dense(ex.LSE), Expected: Dense(xp.LSE),
			Mode: Numeric, Reduction: s,
			Coords: Coords{Axes: []CoordKind{KindRow}, Derived: func(dst []Coord, idx []int) []Coord {
				return append(dst, Coord{Kind: KindSplitsUsed, Value: used[idx[0]]})
			}},
		},
	}, nil
}

// writeEmptyRow gives a row with no state the result the merge under test
// writes for it (reference/splitk gives EmptyZero's): first is split 0's
// partial, ex and xp the row's exact and expected out.
func writeEmptyRow(e EmptyRow, first []float32, outDT tensor.DType, ex, xp []float64, exLSE, xpLSE *float64) {
	switch e {
	case EmptyNaN:
		for i := range ex {
			ex[i], xp[i] = math.NaN(), math.NaN()
		}
		*exLSE, *xpLSE = math.NaN(), math.NaN()
	case EmptyFirstSplit:
		for i, v := range first {
			ex[i], xp[i] = float64(v), splitk.RoundTo(outDT, float64(v))
		}
	}
}
