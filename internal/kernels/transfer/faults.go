package transfer

import (
	"context"
	"fmt"
	"strconv"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/faults"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/kernels/paged"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// KV-cache transfer faults (stage cache): what goes wrong between a
// prefill node and a decode node in a disaggregated deployment. The
// transports move raw bytes by page (vLLM's NIXL connector, SGLang's
// disaggregation: transfer.go cites them), so each bug is a
// byte move to the wrong place, of the wrong length, or in the wrong
// layout. The hooks work on the bytes themselves, apart from the
// reference's routing, so that the checker's model of each bug (the
// kernel's suspects) is not the code that plants it.

var transferKernel = []string{"kv_cache_transfer"}

// transferNotSimulated is why the simulated decoder cannot show these.
const transferNotSimulated = "the simulated decoder runs one node, which writes and reads its own cache and transfers none; the trigger, the signature table and `kcheck check` on a transfer capture show this fault"

// transferCase is a quick transfer for triggers: two requests (37 and 20
// tokens) from a prefill cache of srcDType pages of srcPage tokens into a
// decode cache of dstDType pages of 16 (L = 32, R = 16 unless a dtype fixes
// them).
func transferCase(dstDType, srcDType string, srcPage int, params map[string]string) cases.Case {
	p := map[string]string{"src_kv_cache_dtype": srcDType, "src_page_size": strconv.Itoa(srcPage)}
	for k, v := range params {
		p[k] = v
	}
	c := cases.Case{Name: "trigger/kv_cache_transfer", Kernel: "kv_cache_transfer", KVCacheDType: dstDType, PageSize: 16,
		SeqLens: []int{37, 20}, Seed: 106, Params: p}
	if dstDType != "fp8_ds_mla" && srcDType != "fp8_ds_mla" {
		c.Latent, c.Rope = 32, 16
	}
	return c
}

// dsMLAPow2FromAmax is a signature case: a transfer between fp8_ds_mla
// caches of the two tile-scale conventions (a prefill node on vLLM's amax
// writer, a decode node on the pow2 one of vLLM PR #49435).
func dsMLAPow2FromAmax() *faults.Trigger {
	return &faults.Trigger{Case: transferCase("fp8_ds_mla", "fp8_ds_mla", 16, map[string]string{"src_ds_mla_scale": "amax", "ds_mla_scale": "pow2"})}
}

// smallerDecodePages is a signature case: a transfer into decode pages (4)
// smaller than the prefill's (16).
func smallerDecodePages() *faults.Trigger {
	c := transferCase("bf16", "bf16", 16, nil)
	c.PageSize = 4
	return &faults.Trigger{Case: c}
}

// transferSides reads what the hooks need: both caches' block counts, page
// sizes and entry bytes, both tables and the requests' lengths.
type transferSides struct {
	src, dst           *tensor.Tensor
	srcPage, dstPage   int
	srcEntry, dstEntry int // bytes
	srcTab, dstTab     []int64
	srcMB, dstMB       int
	lens               []int64
}

func readSides(in map[string]*tensor.Tensor, p kernel.Params) (*transferSides, error) {
	for _, name := range []string{"src_cache", "dst_cache_before", "src_block_table", "dst_block_table", "seq_lens"} {
		if in[name] == nil {
			return nil, fmt.Errorf("tensor %s is missing (the contract needs it)", name)
		}
	}
	s := &transferSides{src: in["src_cache"], dst: in["dst_cache_before"]}
	var err error
	if _, s.srcPage, _, err = paged.CacheGeometry(s.src, kernel.Params{"page_size": p["src_page_size"]}, "src_cache"); err != nil {
		return nil, err
	}
	if _, s.dstPage, _, err = paged.CacheGeometry(s.dst, p, "dst_cache_before"); err != nil {
		return nil, err
	}
	st, dt := in["src_block_table"], in["dst_block_table"]
	if len(st.Shape) != 2 || len(dt.Shape) != 2 {
		return nil, fmt.Errorf("tensors src_block_table %v and dst_block_table %v: want [B, max_blocks]", st.Shape, dt.Shape)
	}
	s.srcEntry, s.dstEntry = paged.EntryBytes(s.src), paged.EntryBytes(s.dst)
	s.srcTab, s.dstTab, s.srcMB, s.dstMB = faults.Ints(st), faults.Ints(dt), st.Shape[1], dt.Shape[1]
	s.lens = faults.Ints(in["seq_lens"])
	return s, nil
}

// block returns entry j of a table row, ok false past the row or outside a
// cache of nb blocks.
func block(tab []int64, mb, b, j, nb int) (int64, bool) {
	if j >= mb {
		return 0, false
	}
	v := tab[b*mb+j]
	return v, v >= 0 && v < int64(nb)
}

func init() {
	faults.Register(&faults.Fault{
		Name: "transfer_block_table_shift", Stage: kernel.StageCache, Kernels: transferKernel,
		Needs:    "a request of two prefill pages or more",
		BugClass: "prefill and decode block lists paired off by one (a prefix-cache hit counted on one node only, a trim from the wrong end): each decode page receives the prefill page after its own",
		Doc: "The transfer reads prefill page j of every request from src_block_table[b, j+1]; the last page reads the table's padding " +
			"(block 0). The decode node attends a context shifted by a page.",
		Inputs: func(in map[string]*tensor.Tensor, p kernel.Params) (map[string]*tensor.Tensor, error) {
			bt, src := in["src_block_table"], in["src_cache"]
			if bt == nil || src == nil || len(bt.Shape) != 2 || len(src.Shape) != 3 {
				return in, nil
			}
			tab := faults.Ints(bt)
			B, mb := bt.Shape[0], bt.Shape[1]
			out := make([]int64, len(tab))
			for b := 0; b < B; b++ {
				for j := 0; j < mb; j++ {
					if v, ok := block(tab, mb, b, j+1, src.Shape[0]); ok {
						out[b*mb+j] = v
					} // else 0: the padding engines fill a table with
				}
			}
			in["src_block_table"] = tensor.FromInt64s(bt.DType, bt.Shape, out)
			return in, nil
		},
		Trigger:      &faults.Trigger{Case: transferCase("bf16", "bf16", 16, nil)},
		NotSimulated: transferNotSimulated,
		Signatures: []faults.Expect{
			{Tensor: "dst_cache_after", Pattern: "block_table_shift"},
			{On: dsMLAPow2FromAmax(), Tensor: "dst_cache_after", Pattern: "block_table_shift", Why: "through the decode side's writer: the shifted tokens re-encoded"},
		},
	})
	faults.Register(&faults.Fault{
		Name: "transfer_page_size_mismatch", Stage: kernel.StageCache, Kernels: transferKernel,
		Needs:    "prefill and decode caches of different page sizes (src_page_size other than page_size)",
		BugClass: "page-size mismatch between the nodes: whole prefill pages written at decode addresses computed with the prefill page's length (SGLang's mooncake transfer addresses both sides with the prefill item_len)",
		Doc: "For each request the prefill pages and the decode pages are paired in order, and prefill page j's bytes " +
			"(src_page_size entries) are written at byte dst_block_table[b, j] · src_page_size · entry_bytes of the decode cache, " +
			"as if the decode pages were the prefill's size: tokens land in the wrong pages and offsets, and the rest of the " +
			"decode pages keep what they held.",
		Outputs: func(_ context.Context, in kernel.Inputs, out map[string]*tensor.Tensor) error {
			s, err := readSides(in.Tensors, in.Params)
			if err != nil {
				return err
			}
			after := s.dst.Clone()
			item := s.srcPage * s.srcEntry
			for b, n := range s.lens {
				pages := min((int(n)+s.srcPage-1)/s.srcPage, (int(n)+s.dstPage-1)/s.dstPage)
				for j := 0; j < pages; j++ {
					sb, ok1 := block(s.srcTab, s.srcMB, b, j, s.src.Shape[0])
					db, ok2 := block(s.dstTab, s.dstMB, b, j, s.dst.Shape[0])
					if !ok1 || !ok2 {
						continue
					}
					at := int(db) * item
					if at >= len(after.Data) {
						continue // past the decode buffer: the RDMA write fails, nothing lands
					}
					copy(after.Data[at:], s.src.Data[int(sb)*item:int(sb+1)*item])
				}
			}
			out["dst_cache_after"] = after
			return nil
		},
		Trigger:      &faults.Trigger{Case: transferCase("bf16", "bf16", 32, nil)},
		NotSimulated: transferNotSimulated,
		Signatures: []faults.Expect{
			{Tensor: "dst_cache_after", Pattern: "page_size_mismatch"},
			{On: smallerDecodePages(), Tensor: "dst_cache_after", Pattern: "page_size_mismatch", Why: "prefill pages of 16 into decode pages of 4: whole pages run over four decode pages each"},
		},
	})
	faults.Register(&faults.Fault{
		Name: "transfer_layout_mismatch", Stage: kernel.StageCache, Kernels: transferKernel,
		Needs:    "prefill and decode caches of different layouts: kv_cache_dtype against src_kv_cache_dtype, dst_k_scale against src_k_scale, or ds_mla_scale against src_ds_mla_scale",
		BugClass: "cache dtype or scale convention differing between the nodes (\"auto\" resolved to fp8 on one node only; a writer of another fp8_ds_mla tile-scale convention) while the transport moves bytes unconverted",
		Doc: "Every token's entry goes to the right decode slot, but as the prefill node's bytes: the decode node reads bf16 bytes as " +
			"fp8 codes (or amax tile scales where it expects powers of two); an entry longer on the decode side keeps its old tail.",
		Outputs: func(_ context.Context, in kernel.Inputs, out map[string]*tensor.Tensor) error {
			s, err := readSides(in.Tensors, in.Params)
			if err != nil {
				return err
			}
			after := s.dst.Clone()
			for b, n := range s.lens {
				for t := 0; t < int(n); t++ {
					sb, ok1 := block(s.srcTab, s.srcMB, b, t/s.srcPage, s.src.Shape[0])
					db, ok2 := block(s.dstTab, s.dstMB, b, t/s.dstPage, s.dst.Shape[0])
					if !ok1 || !ok2 {
						continue
					}
					from := (int(sb)*s.srcPage + t%s.srcPage) * s.srcEntry
					to := (int(db)*s.dstPage + t%s.dstPage) * s.dstEntry
					copy(after.Data[to:to+s.dstEntry], s.src.Data[from:from+s.srcEntry])
				}
			}
			out["dst_cache_after"] = after
			return nil
		},
		Trigger:      &faults.Trigger{Case: transferCase("fp8_e4m3", "bf16", 16, nil)},
		NotSimulated: transferNotSimulated,
		Signatures: []faults.Expect{
			{Tensor: "dst_cache_after", Pattern: "layout_mismatch", Why: "bf16 bytes in an fp8_e4m3 cache"},
			{On: dsMLAPow2FromAmax(), Tensor: "dst_cache_after", Pattern: "layout_mismatch", Why: "amax tile scales (and their codes) in a pow2 cache"},
		},
	})
	faults.Register(&faults.Fault{
		Name: "transfer_last_page_dropped", Stage: kernel.StageCache, Kernels: transferKernel,
		Needs:    "a request with at least one token",
		BugClass: "partial transfer: the last (partially filled) prefill page of each request not sent, as when the page count is computed as seq_len / page_size rounded down, or the decode side is told the transfer is done one page early",
		Doc: "Every request's tokens on its last prefill page keep the decode cache's earlier content: the decode node attends " +
			"stale or poisoned entries at the end of the prompt.",
		Outputs: func(_ context.Context, in kernel.Inputs, out map[string]*tensor.Tensor) error {
			s, err := readSides(in.Tensors, in.Params)
			if err != nil {
				return err
			}
			after := out["dst_cache_after"].Clone()
			whole := in.Params.String("whole_pages", "false") == "true"
			for b, n := range s.lens {
				if n <= 0 {
					continue
				}
				last := (int(n) - 1) / s.srcPage * s.srcPage
				end := int(n)
				if whole {
					end = (int(n) + s.dstPage - 1) / s.dstPage * s.dstPage
				}
				for t := last; t < end; t++ {
					db, ok := block(s.dstTab, s.dstMB, b, t/s.dstPage, s.dst.Shape[0])
					if !ok {
						continue
					}
					at := (int(db)*s.dstPage + t%s.dstPage) * s.dstEntry
					copy(after.Data[at:at+s.dstEntry], s.dst.Data[at:at+s.dstEntry])
				}
			}
			out["dst_cache_after"] = after
			return nil
		},
		Trigger:      &faults.Trigger{Case: transferCase("bf16", "bf16", 16, nil)},
		NotSimulated: transferNotSimulated,
		Signatures: []faults.Expect{
			{Tensor: "dst_cache_after", Pattern: "partial_transfer", Why: "the unsent entries also hold what was there before, which partial_transfer explains better than unwritten"},
		},
	})
}
