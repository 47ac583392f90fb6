package transfer

import (
	"context"
	"strconv"

	. "github.com/kcheck-dev/kcheck/internal/kernel"
	_ "github.com/kcheck-dev/kcheck/internal/kernels/kvcache" // the prefill cache is written through kv_cache_write
	"github.com/kcheck-dev/kcheck/internal/kernels/paged"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Defaults implements Generator: the decode side's page size and layout
// (the prefill side's default to them).
func (kernelTransfer) Defaults(c Case) Params { return paged.Defaults(c, true) }

// sourceGeometry is the prefill side of case c: its layout and page size
// (src_kv_cache_dtype, src_page_size), the decode side's where the case
// gives none.
func sourceGeometry(c Case) Geometry {
	g := c.Geometry
	g.KVCacheDType = c.Params.String("src_kv_cache_dtype", g.KVCacheDType)
	if n, err := c.Params.Int("src_page_size", g.PageSize); err == nil && n > 0 {
		g.PageSize = n
	}
	return g
}

// Generate implements Generator: the prefill cache filled through the one
// writer the checker trusts (in its own shuffled block order), a decode
// cache of earlier content that must be kept (in another order), and the
// requests' lengths. Where both sides are fp8_e4m3 they share the
// k_scale, as two nodes of one checkpoint do.
func (kernelTransfer) Generate(ctx context.Context, c Case, r *RNG) (map[string]*tensor.Tensor, error) {
	seqLens := c.Geometry.SeqLenList()
	sg := sourceGeometry(c)
	sp := Params{}
	for k, v := range c.Params {
		sp[k] = v
	}
	sp["ds_mla_scale"] = c.Params.String("src_ds_mla_scale", c.Params.String("ds_mla_scale", "amax"))
	src, spg, ks, err := paged.Cache(ctx, r, sg, seqLens, sp)
	if err != nil {
		return nil, err
	}
	g := c.Geometry
	dpg := paged.NewPaging(r, seqLens, g.PageSize)
	before, err := paged.EmptyCache(ctx, r, g.KVCacheDType, dpg.NB, g.PageSize, g.Latent+g.Rope, "random")
	if err != nil {
		return nil, err
	}
	st, dt := paged.Tables(seqLens, spg), paged.Tables(seqLens, dpg)
	ts := map[string]*tensor.Tensor{
		"src_cache": src, "src_block_table": st["block_table"],
		"dst_cache_before": before, "dst_block_table": dt["block_table"], "seq_lens": st["seq_lens"],
	}
	if sg.KVCacheDType == "fp8_e4m3" {
		ts["src_k_scale"] = F32Scalar(ks)
	}
	if g.KVCacheDType == "fp8_e4m3" {
		ts["dst_k_scale"] = F32Scalar(ks)
	}
	return ts, nil
}

// PlanCost implements Generator: the source cache as the paged generators
// build it, the decode cache and both tables.
func (kernelTransfer) PlanCost(c Case, cost *Cost) Shapes {
	s, blocks, d := paged.PlanCost(c, cost)
	g := c.Geometry
	sg := sourceGeometry(c)
	srcBlocks, srcMost := g.SeqLens.Blocks(int64(sg.PageSize))
	s.Dims["dst_block_table"] = s.Dims["block_table"]
	delete(s.Dims, "block_table")
	s.Dims["src_block_table"] = []int64{g.SeqLens.Count(), max(srcMost, 1)}
	s.Dims["src_cache"] = []int64{AddSizes(srcBlocks, 2), int64(sg.PageSize), AddSizes(d, 80)}
	s.Dims["dst_cache_before"] = []int64{blocks, int64(g.PageSize), AddSizes(d, 80)}
	cost.Input("src cache", s.Dims["src_cache"], 2*4)
	cost.Input("src_block_table "+strconv.Itoa(sg.PageSize), s.Dims["src_block_table"], 16)
	return s
}
