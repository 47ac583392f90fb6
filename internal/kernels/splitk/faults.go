package splitk

import (
	"context"
	"math"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/faults"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Split-K faults (stage combine): the flash-decoding reduction.

var combineKernel = []string{"splitk_combine"}

// combineCase is a quick combine case: 2 requests x 4 heads, 4 splits of
// L = 64, some splits empty (the generator empties one in eight, and every
// split of the last row).
func combineCase() cases.Case {
	return cases.Case{Name: "trigger/splitk_combine", Kernel: "splitk_combine", Preset: "deepseek-v3", TP: 32,
		Batch: 2, Splits: 4, Latent: 64, Seed: 104}
}

// manyRows is the signature case: with the trigger's eight rows every row
// may use all four splits; 64 rows give rows with empty splits and rows
// without, which a split-count pattern needs.
func manyRows() *faults.Trigger {
	c := combineCase()
	c.Batch = 16
	return &faults.Trigger{Case: c}
}

// partialsOf reads partial_out [N, S, L] and partial_lse [N, S].
func partialsOf(in kernel.Inputs) (po, pl []float64, n, s, l int, ok bool) {
	pot, plt := in.Tensors["partial_out"], in.Tensors["partial_lse"]
	if pot == nil || plt == nil || len(pot.Shape) != 3 || plt.Len() != pot.Shape[0]*pot.Shape[1] {
		return nil, nil, 0, 0, 0, false
	}
	return pot.Float64s(), plt.Float64s(), pot.Shape[0], pot.Shape[1], pot.Shape[2], true
}

func init() {
	faults.Register(&faults.Fault{
		Name: "lse_base_mixed", Stage: kernel.StageCombine, Kernels: combineKernel,
		Needs:    "more than one split (S > 1) with partial lse that differ",
		BugClass: "LSE base mixed up: base-2 partial LSEs (FlashInfer, log2e-scaled kernels) combined as natural logs, or the reverse",
		Doc:      "The combine weighs split s by 2^(lse_s - max) where the partials are in base e (or e^(...) for base-2 partials), and reports the LSE in the wrong base.",
		Params: func(p kernel.Params) kernel.Params {
			if p.String("lse_base", "e") == "2" {
				p["lse_base"] = "e"
			} else {
				p["lse_base"] = "2"
			}
			return p
		},
		Trigger: &faults.Trigger{Case: combineCase()},
		Signatures: []faults.Expect{
			{On: manyRows(), Tensor: "out", Pattern: "split_count", Coord: kernel.KindSplitsUsed},
		},
	})
	faults.Register(&faults.Fault{
		Name: "empty_split_nan", Stage: kernel.StageCombine, Kernels: combineKernel,
		BugClass: "empty split turned into NaN: exp(-inf - (-inf)) where a split that saw no token is rescaled by its own running max",
		Doc: "A row with an empty split (lse -inf: context shorter than the split layout, or a causal row) comes out NaN, out " +
			"and lse, instead of being weighted 0.",
		Outputs: func(_ context.Context, in kernel.Inputs, out map[string]*tensor.Tensor) error {
			_, pl, n, s, l, ok := partialsOf(in)
			if !ok {
				return nil
			}
			o, lse := out["out"].Clone(), out["lse"].Clone()
			for r := 0; r < n; r++ {
				empty := false
				for k := 0; k < s; k++ {
					empty = empty || math.IsInf(pl[r*s+k], -1)
				}
				if !empty {
					continue
				}
				for j := 0; j < l; j++ {
					o.SetFloat64(r*l+j, math.NaN())
				}
				lse.SetFloat64(r, math.NaN())
			}
			out["out"], out["lse"] = o, lse
			return nil
		},
		Trigger: &faults.Trigger{Case: combineCase()},
		Signatures: []faults.Expect{
			{On: manyRows(), Tensor: "out", Pattern: "split_count", Coord: kernel.KindSplitsUsed},
		},
	})
	faults.Register(&faults.Fault{
		Name: "unweighted_average", Stage: kernel.StageCombine, Kernels: combineKernel,
		Needs:    "more than one split (S > 1) with partial lse that differ",
		BugClass: "split partials averaged with equal weights, ignoring their LSEs",
		Doc:      "out = mean of the non-empty splits' partial outputs instead of their softmax-weighted sum; the LSE is right, the output is not.",
		Outputs: func(_ context.Context, in kernel.Inputs, out map[string]*tensor.Tensor) error {
			po, pl, n, s, l, ok := partialsOf(in)
			if !ok {
				return nil
			}
			o := out["out"].Clone()
			for r := 0; r < n; r++ {
				used := 0
				sum := make([]float64, l)
				for k := 0; k < s; k++ {
					if math.IsInf(pl[r*s+k], -1) {
						continue
					}
					used++
					for j := range sum {
						sum[j] += po[(r*s+k)*l+j]
					}
				}
				for j, v := range sum {
					if used > 0 {
						v /= float64(used)
					}
					o.SetFloat64(r*l+j, v)
				}
			}
			out["out"] = o
			return nil
		},
		Trigger: &faults.Trigger{Case: combineCase()},
		Signatures: []faults.Expect{
			{On: manyRows(), Tensor: "out", Pattern: "split_count", Coord: kernel.KindSplitsUsed},
		},
	})
	faults.Register(&faults.Fault{
		Name: "stale_partial", Stage: kernel.StageCombine, Kernels: combineKernel,
		BugClass: "combine reads a split's partial before the attention kernel wrote it (missing dependency, double-buffer index slip): the workspace's previous content",
		Doc: "Split 0's partial output is read as the workspace held it before this step (zeros here, as on first use), while " +
			"its LSE is current: every row loses its first split's contribution but keeps its weight.",
		Inputs: func(in map[string]*tensor.Tensor, _ kernel.Params) (map[string]*tensor.Tensor, error) {
			po := in["partial_out"]
			if po == nil || len(po.Shape) != 3 {
				return in, nil
			}
			c := po.Clone()
			faults.PutAxis(c, 1, 0, tensor.New(po.DType, po.Shape[0], 1, po.Shape[2]))
			in["partial_out"] = c
			return in, nil
		},
		Trigger: &faults.Trigger{Case: combineCase()},
		Signatures: []faults.Expect{
			{On: manyRows(), Tensor: "out", Pattern: "split_count", Coord: kernel.KindSplitsUsed, Why: "split 0's partial reads as zeros: the rows that combine two or more splits fail, those with at most one are right here"},
		},
	})
}
