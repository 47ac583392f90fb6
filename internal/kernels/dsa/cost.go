package dsa

import (
	"fmt"

	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Cost implements Coster: the scores and their bound, the top-k and one
// request's candidates.
func (*indexer) Cost(s Shapes, p Params, c *Cost) {
	b := s.Dim("q", 0)
	page := s.PageSize(p, "k_cache")
	total, longest := s.Tokens(MulSizes(s.Dim("block_table", 1), page))
	width := max(IntParam(p, "max_seq", -1), longest)
	if width < 0 {
		width = 0
	}
	c.Output("scores", b, width)
	c.Add(fmt.Sprintf("scores bound [%d, %d]", b, width), MulSizes(b, width, 8))
	topk := IntParam(p, "topk", s.Dim("topk_indices", 1))
	c.Output("topk_indices", b, topk)
	c.Input("top-k candidates of one request", []int64{longest}, 8)
	c.Ops(MulSizes(total, s.Dim("q", 1), s.Dim("q", 2)))
}

// CaseContexts implements Contexter: a case's seq_lens are the requests'
// contexts the indexer scores.
func (*indexer) CaseContexts() bool { return true }

// Roofline implements Roofliner: every tensor once.
func (*indexer) Roofline(in Inputs, outs map[string]*tensor.Tensor) (int64, float64) {
	return StreamedBytes(in, outs), 0
}
