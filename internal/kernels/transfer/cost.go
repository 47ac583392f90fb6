package transfer

import (
	"fmt"

	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Cost implements Coster. dst_cache_after is dst_cache_before with the
// moved entries computed on demand from the source (kvcache.Transfer): no
// copy of either cache but the stored output, in the cache's dtype (2 bytes
// at most), and that once more for each suspect the signature reads. Per
// token: its move (24 bytes) in the routing and in each of the four
// suspects; per table entry, the two validated tables (4 bytes each); per
// source slot, the read map of the notes on NaN (1 byte).
func (kernelTransfer) Cost(s Shapes, p Params, c *Cost) {
	d := s.Dims["dst_cache_before"]
	c.LazyOutput("dst_cache_after", 2, d...)
	capacity := MulSizes(s.Dim("dst_block_table", 1), s.PageSize(p, "dst_cache_before"))
	tokens, _ := s.Tokens(capacity)
	if whole, _ := p.Bool("whole_pages", false); whole {
		tokens = AddSizes(tokens, MulSizes(s.SeqLens.Count(), s.PageSize(p, "dst_cache_before")))
	}
	c.Add(fmt.Sprintf("the moves of %d tokens, and of the four suspects'", tokens), MulSizes(tokens, 5*24))
	c.Input("src_block_table", s.Dims["src_block_table"], 4)
	c.Input("dst_block_table", s.Dims["dst_block_table"], 4)
	c.Add("src_cache read map", MulSizes(s.Dim("src_cache", 0), s.Dim("src_cache", 1)))
	c.Add("signature statistics of dst_cache_after", MulSizes(AddSizes(s.Dim("dst_cache_before", 0), s.Dim("dst_cache_before", 1), s.Dim("dst_cache_before", 2), tokens, 8), CoordStatBytes))
	c.Ops(MulSizes(tokens, AddSizes(s.Dim("dst_cache_before", 2), 1)))
}

// CaseContexts implements Contexter: a case's seq_lens are the tokens each
// request sends.
func (kernelTransfer) CaseContexts() bool { return true }

// Roofline implements Roofliner: a transfer must read each sent entry once
// and write it once, not the caches around them.
func (kernelTransfer) Roofline(in Inputs, outs map[string]*tensor.Tensor) (int64, float64) {
	src, dst, sl := in.Tensors["src_cache"], in.Tensors["dst_cache_before"], in.Tensors["seq_lens"]
	if src == nil || dst == nil || sl == nil || len(src.Shape) != 3 || len(dst.Shape) != 3 {
		return StreamedBytes(in, outs), 0
	}
	var tokens int64
	for i := 0; i < sl.Len(); i++ {
		tokens += max(sl.Int64At(i), 0)
	}
	entry := int64(src.Shape[2]*src.DType.Size() + dst.Shape[2]*dst.DType.Size())
	return tokens * entry, 0
}
