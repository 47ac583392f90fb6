package mla

import (
	"context"
	"strconv"

	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/kernels/paged"
	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// attentionDefaults are what both decodes state: the page size, cache
// dtype and softmax scale, and causal for a multi-token query.
func attentionDefaults(c Case) Params {
	p := paged.Defaults(c, true)
	p["softmax_scale"] = strconv.FormatFloat(c.Geometry.SoftmaxScale, 'g', -1, 64)
	if c.Geometry.SQ > 1 {
		p["causal"] = "true"
	}
	return p
}

// Defaults implements Generator: num_splits when the case asks for
// split-K partials.
func (*decode) Defaults(c Case) Params {
	p := attentionDefaults(c)
	if c.Geometry.Splits > 0 {
		p["num_splits"] = strconv.Itoa(c.Geometry.Splits)
	}
	return p
}

// Defaults implements Generator.
func (*sparseDecode) Defaults(c Case) Params {
	p := attentionDefaults(c)
	p["topk"] = strconv.Itoa(c.Geometry.TopK)
	return p
}

// generate builds the cache, tables and queries of a decode.
func generate(ctx context.Context, c Case, r *RNG, seqLens []int) (map[string]*tensor.Tensor, paged.Paging, error) {
	g := c.Geometry
	cache, pg, ks, err := paged.Cache(ctx, r, g, seqLens, c.Params)
	if err != nil {
		return nil, pg, err
	}
	ts := paged.Tables(seqLens, pg)
	ts["kv_cache"] = cache
	if paged.HasKScale(g.KVCacheDType) {
		ts["k_scale"] = F32Scalar(ks)
	}
	d := g.Latent + g.Rope
	q := make([]float64, g.Batch*g.SQ*g.Heads*d)
	if err := Normals(ctx, r, q); err != nil {
		return nil, pg, err
	}
	for i, x := range q {
		q[i] = formats.RoundBF16(x)
	}
	// An fp16 cache is an fp16 model's, whose query is fp16 too (the
	// values drawn as bf16 are fp16 values but for the rare subnormal).
	ts["q"] = tensor.FromFloat64s(paged.ModelDType(g.KVCacheDType), []int{g.Batch, g.SQ, g.Heads, d}, q)
	return ts, pg, nil
}

// Generate implements Generator.
func (*decode) Generate(ctx context.Context, c Case, r *RNG) (map[string]*tensor.Tensor, error) {
	ts, _, err := generate(ctx, c, r, c.Geometry.SeqLenList())
	return ts, err
}

// Generate implements Generator: each query attends a random selection of
// its request's tokens, padded with -1 past the context.
func (*sparseDecode) Generate(ctx context.Context, c Case, r *RNG) (map[string]*tensor.Tensor, error) {
	g := c.Geometry
	seqLens := g.SeqLenList()
	ts, pg, err := generate(ctx, c, r, seqLens)
	if err != nil {
		return nil, err
	}
	topk := g.TopK
	idx := make([]int64, g.Batch*g.SQ*topk)
	for req, s := range seqLens {
		for i := 0; i < g.SQ; i++ {
			if err := ctx.Err(); err != nil { // a row is a permutation of its context
				return nil, err
			}
			row := idx[(req*g.SQ+i)*topk:][:topk]
			picked := r.Perm(s)
			for j := range row {
				if j < len(picked) {
					row[j] = pg.Slot(req, picked[j], g.PageSize)
				} else {
					row[j] = -1
				}
			}
		}
	}
	ts["indices"] = tensor.FromInt64s(tensor.I32, []int{g.Batch, g.SQ, topk}, idx)
	delete(ts, "seq_lens")
	return ts, nil
}

// planCost is what both decodes' generators build.
func planCost(c Case, cost *Cost) Shapes {
	s, blocks, d := paged.PlanCost(c, cost)
	g := c.Geometry
	b := g.SeqLens.Count()
	s.Dims["q"] = []int64{b, int64(g.SQ), int64(g.Heads), d}
	s.Dims["kv_cache"] = []int64{blocks, int64(g.PageSize), d}
	return s
}

// PlanCost implements Generator.
func (*decode) PlanCost(c Case, cost *Cost) Shapes { return planCost(c, cost) }

// PlanCost implements Generator: a case that gives no top-k is estimated
// at the largest preset's, 2048 (the default is 64), and one permutation
// of the context is made per query row.
func (*sparseDecode) PlanCost(c Case, cost *Cost) Shapes {
	s := planCost(c, cost)
	g := c.Geometry
	b := g.SeqLens.Count()
	topk := int64(c.TopK)
	if topk <= 0 {
		topk = 2048
	}
	s.Dims["indices"] = []int64{b, int64(g.SQ), topk}
	_, longest := s.Tokens(Saturated)
	cost.Input("index permutation of one query", []int64{longest}, 8)
	cost.Input("indices", []int64{b, int64(g.SQ), topk}, 16)
	return s
}
