package engines

import (
	"fmt"
	"math"
	"strconv"

	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// vllmIndexer reads vLLM's DSA lightning-indexer decode as dsa_indexer
// (reference/CONTRACTS.md §3.9), all at vllm 0.33.0:
//   - the logits call: on CUDA DeepGEMM's fp8_fp4_paged_mqa_logits((q,
//     q_scale), kv_cache, weights, context_lens, block_tables,
//     schedule_metadata, max_model_len, indices)
//     (vllm/utils/deep_gemm.py:738-800, called by
//     vllm/model_executor/layers/sparse_attn_indexer.py:877-888), on ROCm
//     rocm_fp8_paged_mqa_logits(q_fp8, kv_cache_fp8, weights, context_lens,
//     block_tables, schedule_metadata, max_model_len)
//     (vllm/v1/attention/ops/rocm_aiter_mla_sparse.py:756-806, called at
//     :1382-1391) and its Triton rocm_fp8_paged_mqa_logits_triton (:624-692).
//     q is [B, next_n, H, D] e4m3 (sparse_attn_indexer.py:838-851; the
//     query's scale folded into weights, :1117-1118), read as [B·next_n, H,
//     D] with next_n its second dimension; weights F32 [B·next_n, H]
//     (deep_gemm.py:763-764); the result logits [B·next_n, max_model_len]
//     F32 (:775-777; bf16 on SM100, which dsa_indexer does not take).
//   - the cache: DeepseekV32IndexerCache, uint8 [NB, P, D + D/128·4] (132
//     bytes for D = 128: model_executor/models/deepseek_v2.py:731-734,
//     bind_kv_cache squeezes the head axis, :653-656), viewed [NB, P, 1,
//     132] for the call (kv_cache_as_quant_view, sparse_attn_indexer.py:
//     365; kv_cache.unsqueeze(-2), rocm_aiter_mla_sparse.py:1362): read as
//     [NB, P, 132], k_cache_dtype fp8_e4m3, the contract's block-split
//     layout (each block's P·D codes, then its P F32 scales: the Triton
//     kernel's offsets, rocm_aiter_mla_sparse.py:600-614, and the torch
//     reference, :466-478). vLLM's MXFP4 indexer cache (D/2 + D/32 bytes a
//     token, sparse_attn_indexer.py:355-364) and DeepGEMM's MX query scales
//     (q_scale, :877-878) have no contract: refused by name.
//   - context_lens: [B] or [B, next_n] per-row lengths, or [B, 1] (the CUDA
//     path passes seq_lens 2-D always: sparse_attn_indexer.py:852-854), which
//     with next_n > 1 means one length a request (the Triton kernel's
//     ctx_per_row False when the lengths number B, rocm_aiter_mla_sparse.py:
//     647-648; the top-k's _row_ends, model_executor/layers/indexer_topk.py:
//     288-297): [B, 1] is read as [B].
//   - logits past each row's visible length are not data: the kernels write
//     only pos < the row's length (mask_pos, rocm_aiter_mla_sparse.py:597,
//     621; DeepGEMM "columns past each row's context length are not
//     cleaned", deep_gemm.py:775-777) into vLLM's workspace, torch.empty
//     (vllm/v1/worker/workspace.py:264), and every top-k masks them
//     (indexer_topk.py:359-372). They are set to the contract's -inf and not
//     judged, unless the capture declares logits_past_len = -inf (the buffer
//     filled with -inf before the call, as the torch reference allocates it,
//     rocm_aiter_mla_sparse.py:454-459): then they are judged as they are.
//   - the top-k writes topk_indices (topk_indices_buffer[:B·next_n,
//     :topk_tokens], sparse_attn_indexer.py:923-931; rocm_aiter_mla_sparse.py:
//     1423): request token positions. FLASHMLA_SPARSE converts them to
//     global cache slots with triton_convert_req_index_to_global_index(
//     req_id_per_token, block_table, topk_indices, ..., return_valid_counts
//     =True) -> (topk_indices, topk_length)
//     (v1/attention/backends/mla/flashmla_sparse.py:914-922;
//     sparse_utils.py:493-637): a capture holding req_id (the conversion's
//     first argument) or topk_length (its valid counts, returned by the
//     conversion only) holds converted indices, topk_index = global_slot.
//     req_id must be each row's own request (row r is request r / next_n);
//     a BLOCK_STRIDE_ROWS other than the page size is refused.
var vllmIndexer = Fix{Doc: "vLLM paged MQA logits and top-k: q [B, next_n, H, D], the U8 [NB, P, 1, D+4] indexer cache, context_lens [B, 1], logits past each row unwritten, converted top-k slots", Apply: func(v *View) ([]string, error) {
	if v.T("q_scale") != nil {
		return nil, fmt.Errorf("tensor %sq_scale: DeepGEMM's MX-scaled query (vllm 0.33.0 sparse_attn_indexer.py:877-878, mqa_logits_mx_inputs) has no dsa_indexer contract; an fp8 query's scale is folded into weights", v.Prefix)
	}
	var notes []string
	nextN, err := indexerQuery(v, &notes)
	if err != nil {
		return nil, err
	}
	if err := indexerCache(v, &notes); err != nil {
		return nil, err
	}
	if sl := v.T("seq_lens"); sl != nil && len(sl.Shape) == 2 && sl.Shape[1] == 1 && nextN != 1 {
		r, err := reshape(v.Prefix+"seq_lens", sl, sl.Shape[0])
		if err != nil {
			return nil, err
		}
		v.Set("seq_lens", r)
		notes = append(notes, fmt.Sprintf("seq_lens %v read as [%d]: one length a request, each next_n row's derived (vLLM's [B, 1])", sl.Shape, sl.Shape[0]))
	}
	if err := indexerSlots(v, nextN, &notes); err != nil {
		return nil, err
	}
	if err := indexerUnwritten(v, nextN, &notes); err != nil {
		return nil, err
	}
	return notes, nil
}}

// indexerQuery reads q [B, next_n, H, D] as [B·next_n, H, D] and returns
// next_n, from the shape or the capture's own next_n (which must agree).
func indexerQuery(v *View, notes *[]string) (int, error) {
	nextN := 1
	if s, ok := v.Param("next_n"); ok {
		n, err := strconv.Atoi(s)
		if err != nil {
			return 0, fmt.Errorf("parameter next_n = %q: want an integer", s)
		}
		nextN = n
	}
	q := v.T("q")
	if q == nil || len(q.Shape) != 4 {
		return nextN, nil
	}
	b, n := q.Shape[0], q.Shape[1]
	if _, ok := v.Param("next_n"); ok && n != nextN {
		return 0, fmt.Errorf("tensor %sq has shape %v, vLLM's [B, next_n, H, D] with next_n = %d, but parameter next_n = %d", v.Prefix, q.Shape, n, nextN)
	}
	r, err := reshape(v.Prefix+"q", q, b*n, q.Shape[2], q.Shape[3])
	if err != nil {
		return 0, err
	}
	v.Set("q", r)
	if _, ok := v.Param("next_n"); !ok {
		v.SetParam("next_n", strconv.Itoa(n))
	}
	*notes = append(*notes, fmt.Sprintf("q %v read as %v, next_n = %d (vLLM's [B, next_n, H, D])", q.Shape, r.Shape, n))
	return n, nil
}

// indexerCache reads the [NB, P, 1, W] view of the indexer cache as [NB,
// P, W] and, when the capture does not say, names the layout by its width.
func indexerCache(v *View, notes *[]string) error {
	kc := v.T("k_cache")
	if kc == nil {
		return nil
	}
	note, err := dropUnitAxis(v, "k_cache", 4, 2, "vLLM's indexer cache view is [NB, P, 1, D + 4] (dimension 2 must be 1)")
	if err != nil {
		return err
	}
	*notes = append(*notes, note...)
	kc = v.T("k_cache")
	q := v.T("q")
	if kc.DType != tensor.U8 || v.Declared("k_cache_dtype") || q == nil || len(q.Shape) != 3 || len(kc.Shape) != 3 {
		return nil
	}
	d, w := q.Shape[2], kc.Shape[2]
	switch {
	case w == d+4:
		v.SetParam("k_cache_dtype", "fp8_e4m3")
		*notes = append(*notes, fmt.Sprintf("k_cache U8 of %d bytes a token (Dk = %d codes + one F32 scale) read as k_cache_dtype = fp8_e4m3, vLLM's indexer cache", w, d))
		return nil
	case w == d/2+d/32:
		return fmt.Errorf("tensor %sk_cache is U8 %v, %d bytes a token: vLLM's MXFP4 indexer cache (Dk/2 + Dk/32, vllm 0.33.0 sparse_attn_indexer.py:355-364), which dsa_indexer does not read", v.Prefix, kc.Shape, w)
	}
	return fmt.Errorf("tensor %sk_cache is U8 %v, %d bytes a token: vLLM's fp8 indexer cache holds Dk + 4 = %d (Dk = q's %d; vllm 0.33.0 deepseek_v2.py:731-734)", v.Prefix, kc.Shape, w, d+4, d)
}

// indexerSlots reads a capture of the top-k after FLASHMLA_SPARSE's
// conversion to global cache slots: req_id checked to be each row's own
// request, topk_index = global_slot.
func indexerSlots(v *View, nextN int, notes *[]string) error {
	if s, ok := v.Param("BLOCK_STRIDE_ROWS"); ok && s != "None" {
		ps, psOK := v.Param("page_size")
		if kc := v.T("k_cache"); !psOK && kc != nil && len(kc.Shape) == 3 {
			ps = strconv.Itoa(kc.Shape[1])
		}
		if s != ps {
			return fmt.Errorf("parameter BLOCK_STRIDE_ROWS = %s: slots block·%s + offset in a cache of %s-token pages are not the contract's global slots (block·P + offset)", s, s, ps)
		}
	}
	if ti := v.T("topk_indices"); ti != nil && len(ti.Shape) == 2 {
		if q := v.T("q"); q != nil && len(q.Shape) == 3 && ti.Shape[0] > q.Shape[0] {
			// topk_indices_buffer: vLLM's decode writes its first B·next_n rows
			// (sparse_attn_indexer.py:923)
			rows := q.Shape[0]
			r := &tensor.Tensor{DType: ti.DType, Shape: []int{rows, ti.Shape[1]}, Data: ti.Data[:rows*ti.Shape[1]*ti.DType.Size()]}
			if err := checked(v.Prefix+"topk_indices", r); err != nil {
				return err
			}
			v.Set("topk_indices", r)
			*notes = append(*notes, fmt.Sprintf("topk_indices %v: its first %d rows read, the decode's (B·next_n)", ti.Shape, rows))
		}
	}
	rid, tl := v.T("req_id"), v.T("topk_length")
	if rid == nil && tl == nil {
		return nil
	}
	if !v.Declared("topk_index") {
		v.SetParam("topk_index", "global_slot")
		*notes = append(*notes, "topk_indices read as global cache slots (topk_index = global_slot): the capture holds the output of triton_convert_req_index_to_global_index (req_id or topk_length)")
	}
	if rid != nil {
		if err := checked(v.Prefix+"req_id", rid); err != nil {
			return err
		}
		if !rid.DType.IsInt() || len(rid.Shape) != 1 {
			return fmt.Errorf("tensor %sreq_id is %s %v: want an integer [B·next_n], each row's request", v.Prefix, rid.DType, rid.Shape)
		}
		if q := v.T("q"); q != nil && len(q.Shape) == 3 && rid.Shape[0] != q.Shape[0] {
			return fmt.Errorf("tensor %sreq_id has %d entries; q has %d rows", v.Prefix, rid.Shape[0], q.Shape[0])
		}
		for r := 0; r < rid.Len(); r++ {
			if got := rid.Int64At(r); got != int64(r/max(nextN, 1)) {
				return fmt.Errorf("tensor %sreq_id[%d] = %d: dsa_indexer's rows are request-major, row %d is request %d (next_n = %d); a decode batch whose rows are ordered otherwise is not read", v.Prefix, r, got, r, r/max(nextN, 1), nextN)
			}
		}
		v.Del("req_id")
	}
	if tl != nil {
		v.Del("topk_length")
		*notes = append(*notes, "topk_length (the conversion's valid counts) not judged: the contract judges the slots")
	}
	return nil
}

// indexerUnwritten sets the logits past each row's visible length, which
// the kernel never writes, to the contract's -inf (a copy: the capture is
// not written), unless the capture declares it filled them with -inf.
func indexerUnwritten(v *View, nextN int, notes *[]string) error {
	sc, sl := v.T("scores"), v.T("seq_lens")
	if sc == nil || sl == nil || len(sc.Shape) != 2 || sc.DType != tensor.F32 || !sl.DType.IsInt() {
		return nil // the contract's validation names what is wrong
	}
	if s, ok := v.Param("logits_past_len"); ok {
		switch s {
		case "-inf":
			return nil
		case "unwritten":
		default:
			return fmt.Errorf("parameter logits_past_len = %q: want unwritten (vLLM's workspace, not data) or -inf (the buffer filled with -inf before the call)", s)
		}
	}
	rows, width := sc.Shape[0], sc.Shape[1]
	if err := checked(v.Prefix+"scores", sc); err != nil {
		return err
	}
	visible := func(r int) (int, bool) {
		switch {
		case len(sl.Shape) == 2 && sl.Shape[0]*sl.Shape[1] == rows:
			return int(sl.Int64At(r)), true
		case len(sl.Shape) == 1 && sl.Shape[0]*nextN == rows:
			return int(sl.Int64At(r/nextN)) - nextN + r%nextN + 1, true
		case len(sl.Shape) == 2 && sl.Shape[1] == 1 && nextN == 1 && sl.Shape[0] == rows:
			return int(sl.Int64At(r)), true
		}
		return 0, false
	}
	out := sc.Clone()
	set, other := 0, 0
	for r := 0; r < rows; r++ {
		n, ok := visible(r)
		if !ok {
			return nil // shapes the contract refuses, naming them
		}
		for t := min(max(n, 0), width); t < width; t++ {
			i := r*width + t
			if x := out.Float64At(i); !math.IsInf(x, -1) {
				other++
			}
			out.SetFloat64(i, math.Inf(-1))
			set++
		}
	}
	if set == 0 {
		return nil
	}
	v.Set("scores", out)
	*notes = append(*notes, fmt.Sprintf("logits: %d elements past their row's visible length not judged, read as -inf (%d held something else): vLLM's paged MQA logits never write them (they are its workspace's, not data); declare logits_past_len = -inf to judge a buffer filled with -inf", set, other))
	return nil
}
