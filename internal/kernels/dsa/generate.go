package dsa

import (
	"strconv"

	"context"

	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/kernels/paged"
	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// indexerHeads and indexerDim are DeepSeek-V3.2's lightning indexer: 64
// heads of 128 (a case's heads override the first).
const indexerHeads, indexerDim = 64, 128

// Defaults implements Generator: the page size and top-k (the cache is
// bf16 only).
func (*indexer) Defaults(c Case) Params {
	p := paged.Defaults(c, false)
	p["topk"] = strconv.Itoa(c.Geometry.TopK)
	return p
}

// Generate implements Generator.
func (*indexer) Generate(ctx context.Context, c Case, r *RNG) (map[string]*tensor.Tensor, error) {
	g := c.Geometry
	seqLens := g.SeqLenList()
	heads := indexerHeads
	if c.Heads > 0 {
		heads = c.Heads
	}
	pg := paged.NewPaging(r, seqLens, g.PageSize)
	k := tensor.New(tensor.BF16, pg.NB, g.PageSize, indexerDim)
	for i := 0; i < k.Len(); i++ {
		k.SetFloat64(i, r.Normal())
	}
	q := make([]float64, len(seqLens)*heads*indexerDim)
	for i := range q {
		q[i] = formats.RoundBF16(r.Normal())
	}
	w := make([]float64, len(seqLens)*heads)
	for i := range w {
		w[i] = r.Normal() * 0.1
	}
	ts := paged.Tables(seqLens, pg)
	ts["q"] = BF16([]int{len(seqLens), heads, indexerDim}, q)
	ts["k_cache"] = k
	ts["weights"] = tensor.FromFloat64s(tensor.F32, []int{len(seqLens), heads}, w)
	return ts, nil
}

// PlanCost implements Generator: the estimate takes at least the
// indexer's 64 heads, whatever the case's.
func (*indexer) PlanCost(c Case, cost *Cost) Shapes {
	s, blocks, _ := paged.PlanCost(c, cost)
	g := c.Geometry
	heads := max(int64(g.Heads), indexerHeads)
	s.Dims["q"] = []int64{g.SeqLens.Count(), heads, indexerDim}
	s.Dims["k_cache"] = []int64{blocks, int64(g.PageSize), indexerDim}
	cost.Input("k_cache", []int64{blocks, int64(g.PageSize), indexerDim}, 16)
	return s
}
