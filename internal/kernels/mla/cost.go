package mla

import (
	"fmt"

	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// attentionCost is what both decodes hold: q decoded, packed and
// transposed per request; each worker's block of cache rows (exact and as
// the expected kernel holds them), its values in float32, and per query
// row its accumulators and block probabilities (reference/mla's worker);
// out and lse. It returns B, s_q, H, D and L.
func attentionCost(s Shapes, p Params, c *Cost) (b, sq, h, d, l int64) {
	b, sq, h, d = s.Dim("q", 0), s.Dim("q", 1), s.Dim("q", 2), s.Dim("q", 3)
	l = d
	if d > 64 {
		l = d - 64
	}
	l = max(IntParam(p, "latent_dim", l), 1)
	c.Input("q", []int64{b, sq, h, d}, 32)
	const block = 64
	perWorker := AddSizes(MulSizes(block, d, 24), MulSizes(block, l, 4), MulSizes(h, sq, AddSizes(MulSizes(l, 16), MulSizes(d, 16), 2048)))
	c.Add(fmt.Sprintf("%d reference workers' buffers", Workers()), MulSizes(int64(Workers()), perWorker))
	c.Output("out", b, sq, h, l)
	c.Output("lse", b, h, sq)
	return b, sq, h, d, l
}

// Cost implements Coster: the attention, and the split-K partials when
// anything asks for them.
func (*decode) Cost(s Shapes, p Params, c *Cost) {
	b, sq, h, d, l := attentionCost(s, p, c)
	page := s.PageSize(p, "kv_cache")
	total, _ := s.Tokens(MulSizes(s.Dim("block_table", 1), page))
	splits := IntParam(p, "num_splits", 0)
	if po := s.Dims["partial_out"]; len(po) == 5 { // a capture's partials give S (reference/CONTRACTS.md §3.6.1)
		splits = max(splits, po[3])
	}
	if sb, ok := s.Dims["split_bounds"]; ok && len(sb) == 2 {
		splits = max(splits, sb[1]-1)
		c.Input("split_bounds", sb, 8)
	}
	passes := int64(2) // exact and expected
	if splits > 0 {
		c.Output("partial_out", b, sq, h, splits, l)
		c.Output("partial_lse", b, sq, h, splits)
		passes = 4
	}
	c.Ops(MulSizes(total, sq, h, d, passes))
}

// Cost implements Coster.
func (*sparseDecode) Cost(s Shapes, p Params, c *Cost) {
	b, sq, h, d, _ := attentionCost(s, p, c)
	topk := s.Dim("indices", 2)
	c.Input("indices", []int64{b, sq, topk}, 16)
	c.Ops(MulSizes(b, sq, h, topk, d, 2))
}

// CaseContexts implements Contexter: a case's seq_lens are the requests'
// contexts.
func (*decode) CaseContexts() bool { return true }

// CaseContexts implements Contexter: the indices choose the slots a
// query attends, not the case's seq_lens.
func (*sparseDecode) CaseContexts() bool { return false }

// Roofline implements Roofliner: the KV entries of every request's
// context, q and the outputs.
func (*decode) Roofline(in Inputs, outs map[string]*tensor.Tensor) (int64, float64) {
	var n int64
	cache, sl := in.Tensors["kv_cache"], in.Tensors["seq_lens"]
	if cache != nil && sl != nil && len(cache.Shape) == 3 {
		entry := int64(cache.Shape[2] * cache.DType.Size())
		for i := 0; i < sl.Len(); i++ {
			n += sl.Int64At(i) * entry
		}
		n += int64(len(in.Tensors["q"].Data))
	}
	for _, t := range outs {
		n += int64(len(t.Data))
	}
	return n, 0
}

// Roofline implements Roofliner: every tensor once.
func (*sparseDecode) Roofline(in Inputs, outs map[string]*tensor.Tensor) (int64, float64) {
	return StreamedBytes(in, outs), 0
}
