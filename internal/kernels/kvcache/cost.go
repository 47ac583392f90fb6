package kvcache

import (
	"fmt"

	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Cost implements Coster. cache_after is cache_before with the written
// entries computed on demand from their tokens (kvcache.Overlay): no copy
// of the cache but the stored output, in the cache's dtype (2 bytes at
// most).
func (*write) Cost(s Shapes, p Params, c *Cost) {
	d := s.Dims["cache_before"]
	c.LazyOutput("cache_after", 2, d...)
	t := s.Dim("kv_c", 0)
	c.Input("kv_c", []int64{t, AddSizes(s.Dim("kv_c", 1), s.Dim("k_pe", 1))}, 16)
	// the duplicate check's map (64), the overlay's slot list (16) and
	// fp8_ds_mla's tile amaxes (32), per token
	c.Input("slot_mapping", []int64{s.Numel("slot_mapping")}, 64+16+32)
	// the signature's statistics: per block, page offset, column and token
	c.Add("signature statistics of cache_after", MulSizes(AddSizes(s.Dim("cache_before", 0), s.Dim("cache_before", 1), s.Dim("cache_before", 2), t, 8), CoordStatBytes))
	c.Ops(MulSizes(t, AddSizes(s.Dim("kv_c", 1), s.Dim("k_pe", 1))))
}

// Cost implements Coster. Rows are dequantized on demand from the cache (a
// row at a time): the stored output (F32 at most), the three-way policy's
// and the signature's statistics per row (and per request, token, page...).
func (*gather) Cost(s Shapes, p Params, c *Cost) {
	page := s.PageSize(p, "cache")
	rows, _ := s.Tokens(MulSizes(s.Dim("block_table", 1), page))
	d := s.Dim("cache", 2)
	if p.String("kv_cache_dtype", "bf16") == "fp8_ds_mla" {
		d = 576
	}
	c.LazyOutput("gathered", 4, rows, d)
	c.Add(fmt.Sprintf("statistics of %d gathered rows", rows), MulSizes(AddSizes(rows, s.Dim("cache", 0), d, 8), CoordStatBytes))
	c.Input("block_table", s.Dims["block_table"], 8)
	c.Ops(MulSizes(rows, d, 2))
}

// CaseContexts implements Contexter: a case's seq_lens are the tokens
// each request writes.
func (*write) CaseContexts() bool { return true }

// CaseContexts implements Contexter: a case's seq_lens are the tokens
// each request gathers.
func (*gather) CaseContexts() bool { return true }

// Roofline implements Roofliner: every tensor once.
func (*write) Roofline(in Inputs, outs map[string]*tensor.Tensor) (int64, float64) {
	return StreamedBytes(in, outs), 0
}

// Roofline implements Roofliner: every tensor once.
func (*gather) Roofline(in Inputs, outs map[string]*tensor.Tensor) (int64, float64) {
	return StreamedBytes(in, outs), 0
}
