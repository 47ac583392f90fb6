package transfer

import (
	"cmp"
	"fmt"
	"slices"

	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/kvcache"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// The bugs a failed transfer is compared with, each the decode-side cache
// the transfer leaves when it has that bug (kernel.Suspect): where the
// failing bytes hold what one of them leaves, the signature names it. Each
// is a cause the user of a disaggregated deployment suspects when the
// decode node's output is wrong:
//
//   - block_table_shift: the prefill side's page j+1 sent as page j, or
//     page j written into the decode side's page j+1 (the two nodes' block
//     lists paired off by one, as a prefix-cache hit counted on one side
//     only does); an entry past the table or outside the cache is block 0,
//     which engines pad tables with.
//   - page_size_mismatch (the two page sizes differ): whole prefill pages
//     written at the decode side's addresses computed with the prefill
//     side's page length, as SGLang's mooncake transfer computes both
//     addresses from the prefill item_len (sglang 0.5.23,
//     sglang/srt/disaggregation/mooncake/conn.py:1186-1191) and zips the two
//     page lists.
//   - layout_mismatch (the two layouts differ: a dtype, a k_scale, a tile
//     scale convention): each entry's bytes moved unconverted, to the right
//     place (kvcache.CopyRaw), as a transport between two nodes whose
//     "auto" cache dtype resolved differently (vLLM's NIXL handshake hashes
//     the configured cache_dtype string, not the resolved dtype: vllm
//     0.33.0, nixl/metadata.py:198, and enforce_handshake_compat can turn
//     the check off, nixl/base_worker.py:1038-1039).
//   - partial_transfer: every request's last prefill page not sent.
func suspects(p *problem, before *tensor.Tensor) []Suspect {
	var out []Suspect
	add := func(pattern, detail string, moves []kvcache.Move, mode kvcache.CopyMode) {
		x, err := kvcache.NewTransfer(p.src.cache, before, p.dst.cache, moves, mode)
		if err != nil {
			return // a bug that cannot be modelled on these inputs explains nothing
		}
		out = append(out, Suspect{Pattern: pattern, Detail: detail, Values: newAfter(x, false)})
	}
	ps, pd := p.src.lay.PageSize, p.dst.lay.PageSize
	src := p.routing.Src
	// block_table_shift
	shifted := make([]kvcache.Move, 0, len(p.routing.Moves))
	for _, m := range p.routing.Moves {
		m.Src = slotOnNextPage(src, p.src.cache.NB, int(m.Request), int(m.Token))
		shifted = append(shifted, m)
	}
	add("block_table_shift", "a transfer reading each prefill page from the block-table entry after its own (block lists paired off by one)", shifted, p.mode)
	// the same slip on the decode side: page j written into the decode
	// block of page j+1
	dst := p.routing.Dst
	var ahead []kvcache.Move
	for _, m := range p.routing.Moves {
		m.Dst = slotOnNextPage(dst, p.dst.cache.NB, int(m.Request), int(m.Token))
		ahead = append(ahead, m)
	}
	add("block_table_shift", "a transfer writing each page into the decode block-table entry after its own (block lists paired off by one)", lastWins(ahead), p.mode)
	// page_size_mismatch
	if ps != pd && p.src.lay.EntrySize()*p.src.t.DType.Size() == p.dst.lay.EntrySize()*p.dst.t.DType.Size() {
		var moves []kvcache.Move
		for b, n := range dst.SeqLens {
			pages := min((n+ps-1)/ps, (n+pd-1)/pd)
			for j := 0; j < pages; j++ {
				sb, db := int64(src.Table[b*src.MaxBlocks+j]), int64(dst.Table[b*dst.MaxBlocks+j])
				for o := 0; o < ps; o++ {
					if d := db*int64(ps) + int64(o); d < int64(p.dst.cache.Slots()) {
						moves = append(moves, kvcache.Move{Dst: d, Src: sb*int64(ps) + int64(o), Request: int32(b), Token: int32(j*ps + o)})
					}
				}
			}
		}
		add("page_size_mismatch", fmt.Sprintf("a transfer that addresses the decode side's pages of %d tokens with the prefill side's page length of %d (whole pages, paired in order)", pd, ps), lastWins(moves), kvcache.CopyRaw)
	}
	// layout_mismatch
	if p.mode == kvcache.CopyConvert {
		add("layout_mismatch", fmt.Sprintf("a transfer that moves the prefill side's bytes (%s) unconverted into the decode side's cache (%s)", describe(p.src), describe(p.dst)), p.routing.Moves, kvcache.CopyRaw)
	}
	// partial_transfer
	var sent []kvcache.Move
	for _, m := range p.routing.Moves {
		n := p.routing.Dst.SeqLens[m.Request]
		if int(m.Token) < (n+ps-1)/ps*ps-ps {
			sent = append(sent, m)
		}
	}
	add("partial_transfer", "a transfer that does not send each request's last prefill page", sent, p.mode)
	return out
}

// slotOnNextPage is the slot token t of request b has when its page is
// looked up one block-table entry late: page t/P+1's block (block 0 past
// the table or outside the cache, nb blocks), at the token's offset.
func slotOnNextPage(pages *kvcache.Pages, nb, b, t int) int64 {
	ps := pages.PageSize
	blk := int64(0)
	if j := t/ps + 1; j < pages.MaxBlocks {
		if v := pages.Table[b*pages.MaxBlocks+j]; v >= 0 && int(v) < nb {
			blk = int64(v)
		}
	}
	return blk*int64(ps) + int64(t%ps)
}

// lastWins sorts moves by destination, keeping of those that share one
// the last in request and token order (the order a transport issues its
// writes in; which lands last on a GPU is a race).
func lastWins(moves []kvcache.Move) []kvcache.Move {
	slices.SortStableFunc(moves, func(a, b kvcache.Move) int {
		return cmp.Or(cmp.Compare(a.Dst, b.Dst), cmp.Compare(a.Request, b.Request), cmp.Compare(a.Token, b.Token))
	})
	out := moves[:0]
	for i, m := range moves {
		if i+1 < len(moves) && moves[i+1].Dst == m.Dst {
			continue
		}
		out = append(out, m)
	}
	return out
}

// sentRows is the Read of src_cache: the entries of the requests' tokens.
func sentRows(in Inputs) (func(int) bool, error) {
	ct, bt, sl := in.Tensors["src_cache"], in.Tensors["src_block_table"], in.Tensors["seq_lens"]
	if ct == nil || bt == nil || sl == nil || len(ct.Shape) != 3 {
		return nil, fmt.Errorf("tensors src_cache, src_block_table or seq_lens missing or misshapen")
	}
	page := ct.Shape[1]
	pages, err := kvcache.NewPagesNamed("src_block_table", bt, sl, page, ct.Shape[0])
	if err != nil {
		return nil, err
	}
	// A whole page's tail past seq_len moves as bytes nobody reads: what
	// it holds (a poisoned slot) is no anomaly of the prefill's.
	read := make([]bool, ct.Shape[0]*page)
	for b, n := range pages.SeqLens {
		for t := 0; t < n; t++ {
			blk, off := pages.Locate(b, t)
			read[blk*page+off] = true
		}
	}
	return func(i int) bool { r := i / max(ct.Shape[2], 1); return r < len(read) && read[r] }, nil
}
