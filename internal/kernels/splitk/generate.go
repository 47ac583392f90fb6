package splitk

import (
	"context"
	"math"

	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/kernels/paged"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// defaultSplits is S when a case gives none.
const defaultSplits = 4

// Defaults implements Generator: none beyond the case's.
func (combine) Defaults(Case) Params { return Params{} }

// Generate implements Generator: one row per (request, query, head), one
// split in eight empty (lse -inf, its partial zero), and the last row with
// no token at all.
func (combine) Generate(ctx context.Context, c Case, r *RNG) (map[string]*tensor.Tensor, error) {
	g := c.Geometry
	s := g.Splits
	if s == 0 {
		s = defaultSplits
	}
	n := g.Batch * g.SQ * g.Heads
	po := make([]float64, n*s*g.Latent)
	if err := Normals(ctx, r, po); err != nil {
		return nil, err
	}
	pl := make([]float64, n*s)
	for i := range pl {
		if err := Stopped(ctx, i); err != nil {
			return nil, err
		}
		pl[i] = 5 + 3*r.Normal()
		if r.Intn(8) == 0 {
			pl[i] = math.Inf(-1) // an empty split
		}
	}
	for j := 0; j < s; j++ { // the last row sees no token at all
		pl[(n-1)*s+j] = math.Inf(-1)
	}
	for j := 0; j < s*g.Latent; j++ {
		if math.IsInf(pl[(n-1)*s+j/g.Latent], -1) {
			po[(n-1)*s*g.Latent+j] = 0
		}
	}
	return map[string]*tensor.Tensor{
		"partial_out": tensor.FromFloat64s(tensor.F32, []int{n, s, g.Latent}, po),
		"partial_lse": tensor.FromFloat64s(tensor.F32, []int{n, s}, pl),
	}, nil
}

// PlanCost implements Generator. It counts the paged generators' terms
// too (tokens, cache, block table), which a combine case does not build:
// the estimate has always rounded up so, and its figures stay as they were.
func (combine) PlanCost(c Case, cost *Cost) Shapes {
	s, _, _ := paged.PlanCost(c, cost)
	g := c.Geometry
	sp := int64(max(g.Splits, defaultSplits))
	n := MulSizes(g.SeqLens.Count(), int64(g.SQ), int64(g.Heads))
	cost.Input("partial_out", []int64{n, sp, int64(g.Latent)}, 24)
	s.Dims["partial_out"] = []int64{n, sp, int64(g.Latent)}
	s.Dims["partial_lse"] = []int64{n, sp}
	return s
}
