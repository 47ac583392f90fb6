package engines

// The engines' conventions as data. Each entry cites the source it was
// confirmed from in the package comment.

// vllmCacheDTypes translates vLLM's --kv-cache-dtype spellings (e5m2
// caches have no contract and are refused with a message; "fp8" depends on
// the backend and is read by vllmFP8Alias). "auto" is the model's dtype
// (vllm 0.33.0 vllm/utils/torch_utils.py:519-525,
// kv_cache_dtype_str_to_dtype returns model_config.dtype): bf16 or fp16,
// so it stays the contract's auto, which reads the cache tensor's own
// dtype rather than assuming one (audit V1). "half" and "float16" are
// torch.float16 there (torch_utils.py:42-43). For a ModelOpt checkpoint
// vLLM first resolves auto to its kv_cache_quant_algo (FP8 -> fp8_e4m3,
// resolve_kv_cache_dtype_string, torch_utils.py:498-516 and the map at
// :78-81): such a capture holds a U8 cache, which auto refuses with a
// message naming the fp8 layouts.
var vllmCacheDTypes = map[string]string{
	"auto": "auto", "bfloat16": "bf16", "bf16": "bf16",
	"half": "fp16", "float16": "fp16", "fp16": "fp16",
	"fp8_e4m3": "fp8_e4m3", "fp8_ds_mla": "fp8_ds_mla",
}

// vllmRefusedCacheDTypes are the rest of vLLM's kv_cache_dtype spellings
// (vllm 0.33.0 vllm/utils/torch_utils.py:40-66, STR_DTYPE_TO_TORCH_DTYPE;
// audit V3): caches kcheck has no layout for, refused with what they are.
var vllmRefusedCacheDTypes = map[string]string{
	"fp8_e5m2":            "an E5M2 cache; kcheck reads E4M3 caches only (fp8_e4m3, fp8_ds_mla)",
	"float32":             "an fp32 cache; kcheck reads bf16, fp16 and fp8 caches",
	"float":               "an fp32 cache; kcheck reads bf16, fp16 and fp8 caches",
	"int8":                "an int8 cache",
	"fp8_inc":             "Intel Neural Compressor's fp8 cache (Gaudi), whose scaling kcheck has not examined",
	"fp8_per_token_head":  "a per-token-head scaled fp8 cache (one scale per token and head, not per tensor)",
	"int8_per_token_head": "a per-token-head scaled int8 cache",
	"int4_per_token_head": "a per-token-head scaled int4 cache",
	"nvfp4":               "an NVFP4 KV cache (e2m1 values with block scales)",
	"nvfp4_4over6":        "an NVFP4 KV cache with FlashInfer's 4over6 scale recipe",
	"nvfp4_ds_mla":        "the 352-byte NVFP4 DeepSeek MLA entry (SM100 only; vllm 0.33.0 flashmla_sparse.py:111-129)",
	"turboquant_k8v4":     "a TurboQuant cache",
	"turboquant_4bit_nc":  "a TurboQuant cache",
	"turboquant_k3v4_nc":  "a TurboQuant cache",
	"turboquant_3bit_nc":  "a TurboQuant cache",
	"octave_k3v4":         "an Octave cache",
	"octave_k3v3":         "an Octave cache",
	"octave_k3v3_compact": "an Octave cache",
	"ultraquant_4bit":     "an UltraQuant cache",
}

// vllmKernels are vLLM's custom-op argument names (vllm/_custom_ops.py).
func vllmKernels() map[string]Kernel {
	mla := Kernel{
		// vLLM's MLA backends call the attention kernel with the cache
		// named kv_c_and_k_pe_cache, FlashMLA's argument names, and the
		// softmax scale as the layer's `scale`.
		Tensors: map[string]string{
			"kv_c_and_k_pe_cache": "kv_cache", "k_cache": "kv_cache", "cache_seqlens": "seq_lens",
			"block_tables": "block_table", "softmax_lse": "lse", "output": "out",
		},
		Params:   map[string]string{"scale": "softmax_scale"},
		Fixes:    []Fix{squeezeHeads("kv_cache"), decodeRank, flashMLAFP8, vllmFP8Alias("kv_cache")},
		Identify: []string{"cache_seqlens", "block_table"},
	}
	return map[string]Kernel{
		// scaled_fp4_quant(input, input_global_scale) -> (output, output_scale)
		"nvfp4_quantize": {
			Tensors:  map[string]string{"input": "x", "input_global_scale": "global_scale", "output": "packed", "output_scale": "block_scale"},
			Fixes:    []Fix{fp4QuantLayout, int32Scales("block_scale")},
			Identify: []string{"input", "input_global_scale", "output_scale"},
		},
		// tests' dequantize_nvfp4_to_dtype(tensor_fp4, tensor_sf, global_scale): divides.
		"nvfp4_dequantize": {
			Tensors:  map[string]string{"tensor_fp4": "packed", "tensor_sf": "block_scale", "output": "out"},
			Defaults: map[string]string{"scale_layout": "swizzled_128x4", "global_scale_kind": "quant"},
			Fixes:    []Fix{int32Scales("block_scale")},
			Identify: []string{"tensor_fp4", "tensor_sf"},
		},
		// cutlass_scaled_fp4_mm(a, b, block_scale_a, block_scale_b, alpha, out_dtype) -> out
		"nvfp4_gemm": {
			Tensors:  map[string]string{"a": "a_packed", "b": "b_packed", "block_scale_a": "a_scale", "block_scale_b": "b_scale", "output": "out"},
			Defaults: map[string]string{"scale_layout": "swizzled_128x4"},
			Fixes:    []Fix{int32Scales("a_scale", "b_scale"), fp4Alpha},
			Identify: []string{"block_scale_a", "block_scale_b"},
		},
		// concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
		// the cache is written in place, so a capture holds it twice; the
		// copy taken before the call is kv_cache_before (or kv_cache_in),
		// the one after is kv_cache_after, kv_cache_out or plain kv_cache.
		"kv_cache_write": {
			Tensors: map[string]string{
				"scale": "k_scale", "kv_cache_before": "cache_before", "kv_cache_in": "cache_before",
				"kv_cache_after": "cache_after", "kv_cache_out": "cache_after", "kv_cache": "cache_after",
			},
			Fixes:    []Fix{squeezeHeads("cache_before", "cache_after"), vllmFP8Alias("cache_after"), dsMLAScaleFromData},
			Identify: []string{"kv_c", "k_pe", "slot_mapping"},
		},
		// gather_and_maybe_dequant_cache(src_cache, dst, block_table, cu_seq_lens, batch_size, kv_cache_dtype, scale, seq_starts)
		"kv_cache_gather": {
			Tensors: map[string]string{"src_cache": "cache", "dst": "gathered", "scale": "k_scale"},
			// and cp_gather_and_upconvert_fp8_kv_cache, cp_gather_cache
			// (vllmCopyGathers, gather.go)
			Fixes:    []Fix{squeezeHeads("cache"), vllmCopyGathers, cumulativeSeqLens, vllmFP8Alias("cache")},
			Identify: []string{"src_cache", "dst"},
		},
		"mla_decode": mla,
		// The DSA lightning indexer's decode (vllmIndexer, indexer.go, has
		// the sources): the logits call's arguments as DeepGEMM's
		// fp8_fp4_paged_mqa_logits names them (vllm 0.33.0
		// vllm/utils/deep_gemm.py:738-746: q, kv_cache, weights,
		// context_lens, block_tables, max_model_len) and as ROCm's
		// rocm_fp8_paged_mqa_logits does (v1/attention/ops/
		// rocm_aiter_mla_sparse.py:756-764: q_fp8, kv_cache_fp8), its
		// result logits (model_executor/layers/sparse_attn_indexer.py:880;
		// rocm_aiter_mla_sparse.py:1382), the top-k's topk_indices (a slice
		// of topk_indices_buffer, sparse_attn_indexer.py:923) and
		// topk_tokens (:923), the layer's max_model_len as the scores'
		// width, and its scale_fmt (the indexer cache writer's: "ue8m0" for
		// DeepSeek-V3.2, model_executor/models/deepseek_v2.py:723; any other
		// value, None included, is the amax writer, USE_UE8M0 = scale_fmt
		// == "ue8m0", v1/attention/ops/rocm_aiter_mla_sparse.py:212) as
		// k_scale_fmt.
		"dsa_indexer": {
			Tensors: map[string]string{
				"q_fp8": "q", "kv_cache": "k_cache", "kv_cache_fp8": "k_cache", "context_lens": "seq_lens",
				"block_tables": "block_table", "logits": "scores", "topk_indices_buffer": "topk_indices",
			},
			Params:   map[string]string{"max_model_len": "max_seq", "topk_tokens": "topk", "scale_fmt": "k_scale_fmt"},
			Fixes:    []Fix{vllmIndexer},
			Identify: []string{"weights", "logits"},
		},
		"mla_decode_sparse": {
			Tensors: map[string]string{"kv_c_and_k_pe_cache": "kv_cache", "k_cache": "kv_cache", "softmax_lse": "lse", "output": "out"},
			Params:  map[string]string{"scale": "softmax_scale"},
			// FLASHMLA_SPARSE calls FlashMLA's sparse kernels, which mask only
			// -1 (vllm 0.33.0 vllm/v1/attention/backends/mla/flashmla_sparse.py:1217-1220:
			// "the fp8 kernel masks natively").
			Defaults: map[string]string{"invalid_index": "minus_one"},
			// DeepSeek-V4 passes its compressed cache as FlashMLA's
			// extra_k_cache, [NB, P, 1, 584] like k_cache
			// (vllm/models/deepseek_v4/nvidia/flashmla.py:248-263).
			Fixes:    []Fix{squeezeHeads("kv_cache", "extra_k_cache"), flashMLAFP8, vllmFP8Alias("kv_cache"), flashMLAScaleRead},
			Identify: []string{"indices", "k_cache"},
		},
		// merge_attn_states(output, prefix_output, prefix_lse, suffix_output,
		// suffix_lse, output_lse, prefill_tokens_with_context, output_scale)
		// (vllm 0.33.0 vllm/v1/attention/ops/triton_merge_attn_states.py
		// lines 14-23): outputs [T, H, D] in the model dtype, lse [H, T]
		// (lines 33-41, indexed by strides). A row with both states empty
		// gets out 0 and lse -inf (lines 176-178, 207-209): empty_row's
		// default; a capture of the CUDA op, which copies prefix_output
		// there (audit V12, csrc/libtorch_stable/attention/
		// merge_attn_states.cu@03f97cce), declares empty_row = first_split.
		"splitk_combine": {
			Tensors:  map[string]string{"output": "out", "output_lse": "lse"},
			Defaults: map[string]string{"lse_layout": "H,T"},
			Fixes:    []Fix{mergeTwoStates},
			Identify: []string{"prefix_output", "suffix_output"},
		},
	}
}

// withTritonMLA adds TRITON_MLA's own argument names to vLLM's mla_decode
// (a copy: SGLang's table starts from vLLM's, and SGLang's Triton decode
// uses the same names k_buffer, o and attn_logits for other layouts).
//
// TRITON_MLA calls decode_attention_fwd(q, k_buffer, v_buffer, o, lse,
// req_to_token, b_seq_len, attn_logits, num_kv_splits, sm_scale,
// page_size, ...) (vllm 0.33.0 vllm/v1/attention/ops/
// triton_decode_attention.py lines 755-770; the call in
// vllm/v1/attention/backends/mla/triton_mla.py lines 328-342): k_buffer
// is the cache unsqueezed to [NB, P, 1, D] (line 292), v_buffer its
// first L columns (line 293: a view, no tensor of its own), req_to_token
// the decode block table (line 296), b_seq_len the seq lens (line 297),
// o [B, H, L] and lse [B, H] in q's dtype (lines 262-265), sm_scale the
// layer's scale (line 338) and num_kv_splits S of attn_logits (asserted,
// triton_decode_attention.py line 772).
func withTritonMLA(k Kernel) Kernel {
	out := Kernel{Tensors: map[string]string{}, Params: map[string]string{}, Defaults: k.Defaults,
		Fixes: append(append([]Fix(nil), k.Fixes...), tritonMLAPrecision, tritonAttnLogits), Identify: k.Identify}
	for a, b := range k.Tensors {
		out.Tensors[a] = b
	}
	for a, b := range k.Params {
		out.Params[a] = b
	}
	for a, b := range map[string]string{"k_buffer": "kv_cache", "req_to_token": "block_table", "b_seq_len": "seq_lens", "o": "out"} {
		out.Tensors[a] = b
	}
	out.Params["sm_scale"] = "softmax_scale"
	out.Params["num_kv_splits"] = "num_splits"
	return out
}

// withSGLangTritonDecode adds SGLang's Triton MLA decode to its
// mla_decode (a copy, as withTritonMLA): decode_attention_fwd(q,
// k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse,
// num_kv_splits, max_kv_splits, sm_scale, k_scale, v_scale, ...) (sglang
// 0.5.23 sglang/kernels/ops/attention/decode_attention.py, the grouped
// MLA path; sm_scale carries k_scale folded in, line 1265). The layout
// (token pool, page lists, the two split-K tensors, per-request split
// counts) is sglangTritonDecode's.
func withSGLangTritonDecode(k Kernel) Kernel {
	out := Kernel{Tensors: map[string]string{}, Params: map[string]string{}, Defaults: k.Defaults,
		Fixes: append([]Fix{sglangTritonDecode}, k.Fixes...), Identify: k.Identify}
	for a, b := range k.Tensors {
		out.Tensors[a] = b
	}
	for a, b := range k.Params {
		out.Params[a] = b
	}
	out.Tensors["o"] = "out"
	out.Params["sm_scale"] = "softmax_scale"
	out.Params["max_kv_splits"] = "num_splits"
	return out
}

func init() {
	vllm := vllmKernels()
	vllm["mla_decode"] = withCutlassMLA(withTritonMLA(vllm["mla_decode"]))
	register(&Engine{
		Name:    "vllm",
		Summary: "vLLM custom ops: natural-log lse, -inf for empty rows, ds_mla scales read from the data (amax before PR #49435, pow2 after), swizzled NVFP4 scales, quant-direction global scales",
		Defaults: map[string]string{
			"lse_base": "e", "lse_empty": "-inf",
		},
		// the indexer's scale_fmt None (Python's str) is the amax writer (table: dsa_indexer)
		Values:  map[string]map[string]string{"kv_cache_dtype": vllmCacheDTypes, "k_scale_fmt": {"None": "amax"}},
		Refused: map[string]map[string]string{"kv_cache_dtype": vllmRefusedCacheDTypes},
		Kernels: vllm,
	})

	// SGLang calls FlashMLA through sgl_kernel with the cache named
	// kv_cache, and shares vLLM's NVFP4 op names (sgl_kernel
	// scaled_fp4_quant, cutlass_scaled_fp4_mm) and cache dtype spellings.
	sgl := vllmKernels()
	// merge_state_triton(prefix_output, prefix_lse, suffix_output,
	// suffix_lse) -> (output, output_lse) (sglang 0.5.23
	// sglang/kernels/ops/attention/merge_state.py lines 66-96): the lse
	// [T, H], indexed token_idx * num_heads + head_idx (lines 11-15,
	// 25-26; the older sgl_kernel merge_state_v2 @2112e0e5 indexed
	// [H, T], audit S4: such a capture declares lse_layout = H,T). No
	// guard for two empty states: -inf - -inf leaves NaN in out and lse
	// (lines 27-37, 56-58), so empty_row = nan.
	sgl["splitk_combine"] = Kernel{
		Tensors:  map[string]string{"output": "out", "output_lse": "lse"},
		Defaults: map[string]string{"lse_layout": "T,H", "empty_row": "nan"},
		Fixes:    []Fix{mergeTwoStates},
		Identify: []string{"prefix_output", "suffix_output"},
	}
	sgl["mla_decode"] = withSGLangTritonDecode(sgl["mla_decode"])
	// SGLang's MLA pool write, set_mla_kv_buffer(layer, loc, cache_k_nope,
	// cache_k_rope) on MLATokenToKVPool (audit S3; sglangPoolWrite has the
	// sources): the pool before and after the call as kv_buffer_before and
	// kv_buffer.
	sgl["kv_cache_write"] = Kernel{
		Tensors: map[string]string{
			"kv_buffer_before": "cache_before", "kv_buffer": "cache_after", "kv_buffer_after": "cache_after",
			"loc": "slot_mapping", "cache_k_nope": "kv_c", "cache_k_rope": "k_pe",
		},
		Defaults: map[string]string{"page_size": "1"},
		Fixes:    []Fix{sglangPoolWrite},
		Identify: []string{"loc", "cache_k_nope", "cache_k_rope"},
	}
	delete(sgl, "kv_cache_gather")  // no gather op
	delete(sgl, "dsa_indexer")      // vLLM's indexer names; SGLang's indexer was not read
	delete(sgl, "nvfp4_dequantize") // no dequantize op
	register(&Engine{
		Name:     "sglang",
		Summary:  "SGLang (sgl_kernel): FlashMLA's decode with the cache named kv_cache, vLLM's NVFP4 ops, natural-log lse",
		Defaults: map[string]string{"lse_base": "e", "lse_empty": "-inf", "ds_mla_scale": "amax"},
		Values:   map[string]map[string]string{"kv_cache_dtype": vllmCacheDTypes},
		Refused:  map[string]map[string]string{"kv_cache_dtype": vllmRefusedCacheDTypes},
		Kernels:  sgl,
	})

	register(&Engine{
		Name:     "flashinfer",
		Summary:  "FlashInfer: base-2 lse ([B*s_q, H] layout), -inf for empty rows, split q_nope/q_pe and ckv/kpe caches with page lists, swizzled NVFP4 scales",
		Defaults: map[string]string{"lse_base": "2", "lse_empty": "-inf"},
		Kernels: map[string]Kernel{
			// BatchMLAPagedAttentionWrapper: plan(qo_indptr, kv_indptr,
			// kv_indices, kv_len_arr, ..., sm_scale, ...), run(q_nope, q_pe,
			// ckv_cache, kpe_cache) -> (out, lse).
			// trtllm_batch_decode_with_kv_cache_mla(query, kv_cache,
			// workspace_buffer, qk_nope_head_dim, kv_lora_rank,
			// qk_rope_head_dim, block_tables, seq_lens, max_seq_len, ...,
			// bmm1_scale, bmm2_scale, ..., return_lse, ...) -> out or (out,
			// lse) (flashinfer-python 0.7.2.post1 flashinfer/mla/_core.py
			// :4859-4893): vLLM's FLASHINFER_MLA and SGLang's trtllm_mla
			// (trtllmMLA, blackwell.go).
			"mla_decode": {
				// and run(..., kv_len, page_table) of the wrapper's cutlass
				// backend (flashInferCutlassMLA, blackwell.go).
				Tensors:  map[string]string{"output": "out", "query": "q", "block_tables": "block_table", "kv_len": "seq_lens", "page_table": "block_table"},
				Params:   map[string]string{"sm_scale": "softmax_scale"},
				Fixes:    []Fix{flashInferFP8MLA, trtllmMLA, flashInferMLA, flashInferCutlassMLA},
				Identify: []string{"q_nope", "q_pe", "ckv_cache", "kpe_cache"},
			},
			// merge_states(v, s) -> (V, S)
			"splitk_combine": {
				Tensors: map[string]string{"v": "partial_out", "s": "partial_lse", "v_merged": "out", "s_merged": "lse",
					"V": "out", "S": "lse"},
				Fixes:    []Fix{flashInferMergeStates},
				Identify: []string{"v", "s"},
			},
			// fp4_quantize(input, global_scale, ..., is_sf_swizzled_layout=True) -> (x_q, sf)
			"nvfp4_quantize": {
				Tensors:  map[string]string{"input": "x", "x_q": "packed", "sf": "block_scale"},
				Fixes:    []Fix{flashInferFP4Modes, fp4QuantLayout},
				Identify: []string{"x_q", "sf"},
			},
		},
	})

	register(&Engine{
		Name:     "flashmla",
		Summary:  "FlashMLA: natural-log lse [B, H, s_q], +inf for a row that sees no token, k_cache [NB, P, 1, D], pow2 ds_mla scales (its tests)",
		Defaults: map[string]string{"lse_base": "e", "lse_empty": "+inf", "ds_mla_scale": "pow2"},
		Kernels: map[string]Kernel{
			// flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, ..., softmax_scale, causal, is_fp8_kvcache, indices) -> (out, softmax_lse)
			"mla_decode": {
				Tensors:  map[string]string{"k_cache": "kv_cache", "cache_seqlens": "seq_lens", "softmax_lse": "lse"},
				Fixes:    []Fix{squeezeHeads("kv_cache"), decodeRank, flashMLAFP8},
				Identify: []string{"k_cache", "cache_seqlens", "block_table"},
			},
			"mla_decode_sparse": {
				Tensors: map[string]string{"k_cache": "kv_cache", "softmax_lse": "lse"},
				// only -1 is masked (FlashMLA@9241ae3 csrc/sm90/decode/sparse_fp8/splitkv_mla.cuh:632, tests/ref.py:71)
				Defaults: map[string]string{"invalid_index": "minus_one"},
				Fixes:    []Fix{squeezeHeads("kv_cache", "extra_k_cache"), flashMLAFP8, flashMLAScaleRead},
				Identify: []string{"k_cache", "indices"},
			},
		},
	})
}
