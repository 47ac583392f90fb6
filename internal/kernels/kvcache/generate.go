package kvcache

import (
	"context"

	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/kernels/paged"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Defaults implements Generator.
func (*write) Defaults(c Case) Params { return paged.Defaults(c, true) }

// Defaults implements Generator.
func (*gather) Defaults(c Case) Params { return paged.Defaults(c, true) }

// Generate implements Generator: every request's tokens written over a
// cache of earlier content, one token in ten padded (slot -1, which the
// writer must skip).
func (*write) Generate(ctx context.Context, c Case, r *RNG) (map[string]*tensor.Tensor, error) {
	g := c.Geometry
	seqLens := g.SeqLenList()
	d := g.Latent + g.Rope
	pg := paged.NewPaging(r, seqLens, g.PageSize)
	before, err := paged.EmptyCache(ctx, r, g.KVCacheDType, pg.NB, g.PageSize, d, "random")
	if err != nil {
		return nil, err
	}
	var slots []int64
	for req, s := range seqLens {
		for t := 0; t < s; t++ {
			slot := pg.Slot(req, t, g.PageSize)
			if r.Intn(10) == 0 {
				slot = -1 // a padded token the writer must skip
			}
			slots = append(slots, slot)
		}
	}
	kvc, kpe, err := paged.Tokens(ctx, r, len(slots), g.Latent, g.Rope)
	if err != nil {
		return nil, err
	}
	md := paged.ModelDType(g.KVCacheDType)
	ts := map[string]*tensor.Tensor{
		"kv_c": tensor.FromFloat64s(md, []int{len(slots), g.Latent}, kvc), "k_pe": tensor.FromFloat64s(md, []int{len(slots), g.Rope}, kpe),
		"slot_mapping": tensor.FromInt64s(tensor.I64, []int{len(slots)}, slots), "cache_before": before,
	}
	if paged.HasKScale(g.KVCacheDType) {
		ts["k_scale"] = F32Scalar(paged.KScaleOf(kvc, kpe))
	}
	return ts, nil
}

// Generate implements Generator: a filled paged cache and its tables.
func (*gather) Generate(ctx context.Context, c Case, r *RNG) (map[string]*tensor.Tensor, error) {
	seqLens := c.Geometry.SeqLenList()
	cache, pg, ks, err := paged.Cache(ctx, r, c.Geometry, seqLens, c.Params)
	if err != nil {
		return nil, err
	}
	ts := paged.Tables(seqLens, pg)
	ts["cache"] = cache
	if paged.HasKScale(c.Geometry.KVCacheDType) {
		ts["k_scale"] = F32Scalar(ks)
	}
	return ts, nil
}

// PlanCost implements Generator.
func (*write) PlanCost(c Case, cost *Cost) Shapes {
	s, blocks, d := paged.PlanCost(c, cost)
	g := c.Geometry
	tokens, _ := g.SeqLens.Tokens(Saturated)
	s.Dims["cache_before"] = []int64{blocks, int64(g.PageSize), AddSizes(d, 80)}
	s.Dims["kv_c"] = []int64{tokens, int64(g.Latent)}
	s.Dims["k_pe"] = []int64{tokens, int64(g.Rope)}
	s.Dims["slot_mapping"] = []int64{tokens}
	return s
}

// PlanCost implements Generator.
func (*gather) PlanCost(c Case, cost *Cost) Shapes {
	s, blocks, d := paged.PlanCost(c, cost)
	s.Dims["cache"] = []int64{blocks, int64(c.Geometry.PageSize), d}
	return s
}
