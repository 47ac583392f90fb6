package faults

import (
	"context"
	"testing"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/signature"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// signatureCase is the case on which fault f is judged in kernel kern: its
// trigger where the trigger runs kern, else the trigger's settings (cache
// dtype, parameters) on the small case of kern the catalog's triggers use.
func signatureCase(f *Fault, kern string) *Trigger {
	if f.Trigger.Case.Kernel == kern {
		return f.Trigger
	}
	tc := f.Trigger.Case
	var c cases.Case
	switch kern {
	case "kv_cache_gather", "kv_cache_write":
		c = kvCase(kern, tc.KVCacheDType, tc.Params)
	case "mla_decode":
		c = mlaCase(max(tc.SQ, 1))
	case "mla_decode_sparse":
		c = mlaCase(max(tc.SQ, 1))
		c.Kernel, c.Name, c.TopK = kern, "trigger/"+kern, 16
	case "nvfp4_quantize", "nvfp4_dequantize":
		c = smallCase(kern, 16, 0, 256, tc.Params)
	case "nvfp4_gemm":
		c = smallCase(kern, 16, 64, 256, tc.Params)
	default:
		panic("no signature case for " + kern)
	}
	return &Trigger{Case: c}
}

// Case edits for patterns that the triggers are too small to show. Each
// says what the pattern needs, not which fault it is for.
var (
	// manyContexts: a growth needs at least four context lengths (the
	// triggers have two requests).
	manyContexts = func(c *cases.Case) { c.SeqLens = []int{2, 5, 9, 20, 50, 120, 300, 700} }
	// manyAttended: the same for a sparse decode, whose context is the
	// slots it attends, at most top-k of them.
	manyAttended = func(c *cases.Case) { manyContexts(c); c.TopK = 1024 }
	// manyHeads: two heads of four are half the elements, which no
	// concentration may be; sixteen heads (TP 8) leave two an eighth.
	manyHeads = func(c *cases.Case) { c.TP = 8 }
	// manyRows: with eight rows every row may use all four splits; 64
	// rows give rows with empty splits and rows without.
	manyRows = func(c *cases.Case) { c.Batch = 16 }
	// dsMLAPow2FromAmax: a transfer between fp8_ds_mla caches of the two
	// tile-scale conventions (a prefill node on vLLM's amax writer, a
	// decode node on the pow2 one of vLLM PR #49435).
	dsMLAPow2FromAmax = func(c *cases.Case) {
		c.KVCacheDType, c.Latent, c.Rope = "fp8_ds_mla", 0, 0
		c.Params = map[string]string{"src_kv_cache_dtype": "fp8_ds_mla", "src_page_size": "16", "src_ds_mla_scale": "amax", "ds_mla_scale": "pow2"}
	}
	// smallerDecodePages: decode pages smaller than the prefill's.
	smallerDecodePages = func(c *cases.Case) {
		c.PageSize = 4
		c.Params = map[string]string{"src_kv_cache_dtype": "bf16", "src_page_size": "16"}
	}
)

// Input edits for faults that need particular data on a kernel other than
// their trigger's.
var (
	// subnormalScales: row 0's block scales set to the E4M3 subnormal
	// 3·2^-9, as a small activation under a large global scale gets them.
	subnormalScales = func(in kernel.Inputs) (kernel.Inputs, error) {
		for _, pair := range scaleOperands[:2] {
			sc, ok := in.Tensors[pair[0]]
			if !ok {
				continue
			}
			c := replaced(sc)
			for j := 0; j < sc.Shape[len(sc.Shape)-1]; j++ {
				c.Data[j] = 0x03
			}
			in.Tensors[pair[0]] = c
		}
		return in, nil
	}
	// pageTableDriven adds what a page-table-driven writer reads
	// (engine.block_table, engine.batch_indices, engine.positions) to a
	// write case: the requests' tokens in order, each page's block read off
	// the slot of a token written on it.
	pageTableDriven = func(seqLens []int, page int) func(in kernel.Inputs) (kernel.Inputs, error) {
		return func(in kernel.Inputs) (kernel.Inputs, error) {
			slots := ints(in.Tensors["slot_mapping"])
			maxPages := 0
			for _, n := range seqLens {
				maxPages = max(maxPages, (n+page-1)/page)
			}
			table := make([]int64, len(seqLens)*maxPages)
			var batch, pos []int64
			i := 0
			for b, n := range seqLens {
				for t := 0; t < n; t, i = t+1, i+1 {
					batch, pos = append(batch, int64(b)), append(pos, int64(t))
					if slots[i] >= 0 {
						table[b*maxPages+t/page] = slots[i] / int64(page)
					}
				}
			}
			in.Tensors[engineBlockTable] = tensor.FromInt64s(tensor.I32, []int{len(seqLens), maxPages}, table)
			in.Tensors[engineBatch] = tensor.FromInt64s(tensor.I32, []int{len(batch)}, batch)
			in.Tensors[enginePositions] = tensor.FromInt64s(tensor.I32, []int{len(pos)}, pos)
			return in, nil
		}
	}
)

// Every catalog fault, on every kernel it lives in (and the cache dtypes
// its trigger needs), leaves the signature that names its pattern and the
// kind of coordinate that shows it ("" for a pattern in the values
// themselves, or for none). Where the pattern is "uniform" or
// "concentrated" on a generic coordinate, the comment says why that is
// what the fault genuinely does. The rows run `kcheck faults`' catalog:
// a fault added without a row fails TestEveryFaultHasASignatureRow.
var signatureTable = []struct {
	fault, kernel string
	edit          func(*cases.Case)
	shape         func(kernel.Inputs) (kernel.Inputs, error) // replaces the case's own
	tensor        string
	pattern       string
	kind          kernel.CoordKind
	why           string
}{
	// quant
	{"e4m3_subnormal_scale_flushed", "nvfp4_quantize", nil, nil, "packed", signature.Zeros, "", "the flushed scale zeroes the block's codes"},
	{"e4m3_subnormal_scale_flushed", "nvfp4_quantize", nil, nil, "block_scale", signature.Zeros, "", "the flushed scales themselves"},
	{"e4m3_subnormal_scale_flushed", "nvfp4_dequantize", nil, subnormalScales, "out", signature.Zeros, "", ""},
	{"e4m3_subnormal_scale_flushed", "nvfp4_gemm", nil, subnormalScales, "out", signature.Zeros, "", "a's row 0 reads as zeros, so does its output row"},
	{"fused_shard_global_scale", "nvfp4_gemm", nil, nil, "out", signature.ConstantFactor, "", "the second shard's rows come out scaled by the ratio of the two global scales"},
	{"global_scale_inverted", "nvfp4_dequantize", nil, nil, "out", signature.ConstantFactor, "", ""},
	{"global_scale_inverted", "nvfp4_gemm", nil, nil, "out", signature.ConstantFactor, "", ""},
	{"nibble_order", "nvfp4_quantize", nil, nil, "packed", signature.AlternatingNibble, kernel.KindByte, ""},
	{"nibble_order", "nvfp4_dequantize", nil, nil, "out", signature.AlternatingNibble, kernel.KindCol, ""},
	{"nibble_order", "nvfp4_gemm", nil, nil, "out", signature.Uniform, "", "the GEMM sums each output over all of K: swapped neighbours in the weights reach every output element alike"},
	{"scale_padding_uninitialised", "nvfp4_quantize", nil, nil, "block_scale", signature.Padding, kernel.KindPadding, ""},
	{"scale_padding_uninitialised", "nvfp4_gemm", nil, nil, "out", signature.NonFinite, "", "the garbage in the padding is NaN, summed into every output of the rows that read it"},
	{"swizzled_scales_read_linear", "nvfp4_dequantize", nil, nil, "out", signature.Zeros, "", "read linearly, most blocks take a scale from the zeroed padding"},
	{"swizzled_scales_read_linear", "nvfp4_gemm", nil, nil, "out", signature.Uniform, "", "every block's scale is another's, and the GEMM sums them all into every output"},
	{"zero_block_nan", "nvfp4_quantize", nil, nil, "block_scale", signature.ScaleBlock, kernel.KindScaleBlock, ""},
	// cache
	{"ds_mla_scale_convention", "kv_cache_write", nil, nil, "cache_after", signature.Concentrated, kernel.KindPart, "the tile scales (part 1) are stored in the other convention: a region of the entry, no named pattern"},
	{"fp8_scale_applied_twice", "kv_cache_write", nil, nil, "cache_after", signature.Uniform, "", "every written value is stored with the wrong scale: fp8 codes, so no constant factor between codes"},
	{"fp8_scale_applied_twice", "kv_cache_gather", nil, nil, "gathered", signature.ConstantFactor, "", ""},
	{"fp8_scale_ignored", "kv_cache_write", nil, nil, "cache_after", signature.Uniform, "", "as fp8_scale_applied_twice: every written code, alike"},
	{"int32_offset_overflow", "kv_cache_write", nil, nil, "cache_after", signature.Uniform, "", "the wrapped writes land all over the cache"},
	{"kpe_saturated_by_kvc_scale", "kv_cache_write", nil, nil, "cache_after", signature.Concentrated, kernel.KindPart, "k_pe (part 2) saturates: a region of the entry"},
	{"v41_written_block_split", "kv_cache_write", nil, nil, "cache_after", signature.V41WrittenBlockSplit, "", "the bytes are all there, in the other order: the kernel's suspect (the write in the old order) names it"},
	{"negative_slot_wraps", "kv_cache_write", nil, nil, "cache_after", signature.PageBoundary, kernel.KindPageOffset, "the padded token lands in the cache's last entry, offset P-1 of the last block"},
	{"neighbour_block_table_row", "kv_cache_gather", nil, nil, "gathered", signature.Concentrated, kernel.KindRow, "the last page of one request is read from another's row: rows of one request's last page"},
	{"neighbour_block_table_row", "kv_cache_write", nil, pageTableDriven([]int{37, 20}, 16), "cache_after", signature.Concentrated, kernel.KindPageOffset, "the last pages' tokens (the first offsets of their pages) land in another request's block, and their own entries keep cache_before: the offsets the last pages fill, no named pattern"},
	{"page_boundary_off_by_one", "kv_cache_write", nil, nil, "cache_after", signature.PageBoundary, kernel.KindPageOffset, ""},
	{"page_boundary_off_by_one", "kv_cache_gather", nil, nil, "gathered", signature.PageBoundary, kernel.KindPageOffset, ""},
	{"stale_pages", "kv_cache_write", nil, nil, "cache_after", signature.Unwritten, "", ""},
	{"transfer_block_table_shift", "kv_cache_transfer", nil, nil, "dst_cache_after", signature.BlockTableShift, "", ""},
	{"transfer_block_table_shift", "kv_cache_transfer", dsMLAPow2FromAmax, nil, "dst_cache_after", signature.BlockTableShift, "", "through the decode side's writer: the shifted tokens re-encoded"},
	{"transfer_last_page_dropped", "kv_cache_transfer", nil, nil, "dst_cache_after", signature.PartialTransfer, "", "the unsent entries also hold what was there before, which partial_transfer explains better than unwritten"},
	{"transfer_layout_mismatch", "kv_cache_transfer", nil, nil, "dst_cache_after", signature.LayoutMismatch, "", "bf16 bytes in an fp8_e4m3 cache"},
	{"transfer_layout_mismatch", "kv_cache_transfer", dsMLAPow2FromAmax, nil, "dst_cache_after", signature.LayoutMismatch, "", "amax tile scales (and their codes) in a pow2 cache"},
	{"transfer_page_size_mismatch", "kv_cache_transfer", nil, nil, "dst_cache_after", signature.PageSizeMismatch, "", ""},
	{"transfer_page_size_mismatch", "kv_cache_transfer", smallerDecodePages, nil, "dst_cache_after", signature.PageSizeMismatch, "", "prefill pages of 16 into decode pages of 4: whole pages run over four decode pages each"},
	// attn
	{"bf16_accumulation", "mla_decode", manyContexts, nil, "out", signature.GrowthWithContext, kernel.KindContextLen, ""},
	{"bf16_accumulation", "mla_decode_sparse", manyAttended, nil, "out", signature.GrowthWithContext, kernel.KindContextLen, ""},
	{"causal_mask_top_left", "mla_decode", manyContexts, nil, "out", signature.GrowthWithContext, kernel.KindContextLen, ""},
	{"heads_swapped", "mla_decode", manyHeads, nil, "out", signature.HeadGroup, kernel.KindHead, ""},
	{"heads_swapped", "mla_decode_sparse", manyHeads, nil, "out", signature.HeadGroup, kernel.KindHead, ""},
	{"indexer_weights_ignored", "dsa_indexer", nil, nil, "scores", signature.Uniform, "", "every head's weight is wrong, so every score is"},
	{"indexer_fp8_cache_interleaved", "dsa_indexer", nil, nil, "scores", signature.NonFinite, "", "every scale is four code bytes read as an F32: those with a high exponent overflow the score to inf"},
	{"indexer_causal_ignored", "dsa_indexer", nil, nil, "scores", signature.FutureTokensVisible, "", "finite scores where the row's causal limit wants -inf, each the score of a future token"},
	{"indexer_causal_ignored", "dsa_indexer", nil, nil, "topk_indices", signature.FutureTokensVisible, "", "the rows' top-k hold future tokens"},
	{"page_tail_attended", "mla_decode", nil, nil, "out", signature.NonFinite, "", "the tail past seq_len holds NaN-poisoned slots, attended by every row of the request"},
	{"model1_read_interleaved", "mla_decode_sparse", nil, nil, "out", signature.BlockSplitReadInterleaved, "", "every row reads garbage, so no position shows it: the kernel's suspect (the decode over the cache read token by token) does"},
	{"model1_value_latent_only", "mla_decode_sparse", nil, nil, "out", signature.Zeros, "", "the rope columns 448..511 of out (part = rope) are left at zero"},
	{"rope_dropped", "mla_decode", manyContexts, nil, "out", signature.GrowthWithContext, kernel.KindContextLen, ""},
	{"rope_dropped", "mla_decode_sparse", manyAttended, nil, "out", signature.GrowthWithContext, kernel.KindContextLen, ""},
	{"softmax_scale_default", "mla_decode", manyContexts, nil, "out", signature.GrowthWithContext, kernel.KindContextLen, ""},
	{"softmax_scale_default", "mla_decode_sparse", manyAttended, nil, "out", signature.GrowthWithContext, kernel.KindContextLen, ""},
	// combine
	{"empty_split_nan", "splitk_combine", manyRows, nil, "out", signature.SplitCount, kernel.KindSplitsUsed, ""},
	{"lse_base_mixed", "splitk_combine", manyRows, nil, "out", signature.SplitCount, kernel.KindSplitsUsed, ""},
	{"stale_partial", "splitk_combine", manyRows, nil, "out", signature.SplitCount, kernel.KindSplitsUsed, "split 0's partial reads as zeros: the rows that combine two or more splits fail, those with at most one are right here"},
	{"unweighted_average", "splitk_combine", manyRows, nil, "out", signature.SplitCount, kernel.KindSplitsUsed, ""},
}

func TestFaultSignatures(t *testing.T) {
	sampled := map[string]bool{}
	for _, row := range signatureTable {
		if raceEnabled && sampled[row.kernel] {
			continue // one row a kernel: see raceEnabled
		}
		sampled[row.kernel] = true
		t.Run(row.fault+"/"+row.kernel+"/"+row.tensor, func(t *testing.T) {
			f, err := Lookup(row.fault)
			if err != nil {
				t.Fatal(err)
			}
			tr := *signatureCase(f, row.kernel)
			if row.edit != nil {
				row.edit(&tr.Case)
			}
			if row.shape != nil {
				tr.Shape = row.shape
			}
			in, err := tr.Inputs()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := (Proving{Backend{Fault: f}}).Run(context.Background(), row.kernel, in); err != nil {
				t.Fatalf("the fault does not show on this case: %v", err)
			}
			ff := *f
			ff.Trigger = &tr
			r := runTrigger(t, &ff, Backend{Fault: f})
			for _, c := range r.Checks {
				if c.Tensor != row.tensor {
					continue
				}
				if c.Signature == nil {
					t.Fatalf("%s: verdict %s, no signature", c.Tensor, c.Verdict)
				}
				t.Logf("%s: %s (by %q)", c.Tensor, c.Signature.Pattern, c.Signature.Coord)
				if c.Signature.Pattern != row.pattern || c.Signature.Coord != string(row.kind) {
					t.Errorf("%s: signature %s (by %q), want %s (by %q): %s", c.Tensor, c.Signature.Pattern, c.Signature.Coord, row.pattern, row.kind, c.Signature.Detail)
				}
				return
			}
			t.Fatalf("no check of %s", row.tensor)
		})
	}
}

// Every fault of the catalog has a row for every kernel it lives in.
func TestEveryFaultHasASignatureRow(t *testing.T) {
	has := map[string]bool{}
	for _, row := range signatureTable {
		has[row.fault+" "+row.kernel] = true
	}
	for _, f := range All() {
		for _, k := range f.Kernels {
			if !has[f.Name+" "+k] && !noSignatureRow[f.Name+" "+k] {
				t.Errorf("fault %s on %s has no row in signatureTable", f.Name, k)
			}
		}
	}
}

// noSignatureRow are the kernels a fault lives in where the signature cases
// cannot make it fire, with why.
var noSignatureRow = map[string]bool{}
