"""The engine calls the hook records, each checked against the installed packages.

An Op names one engine entry point: a custom op reached through torch.ops
(seen by the hook's TorchDispatchMode, its argument names read from the op's
own schema at run time) or a Python function (wrapped where it is defined,
and wherever it was imported by name). For each it says which contract
kernel the call is, which arguments it writes, and how its tensors become
the contract's for a pipeline stage (data movement only: reshape, squeeze,
slice, a dtype view).

Sources (installed vllm 0.33.0, sglang 0.5.23, flashinfer-python 0.7.2.post1):
  vllm/_custom_ops.py: concat_and_cache_mla(kv_c, k_pe, kv_cache,
    slot_mapping, kv_cache_dtype, scale, skip_scale) calls
    torch.ops._C_cache_ops.concat_and_cache_mla with the same names (schema:
    `Tensor($0! -> ) kv_cache`, written in place);
    gather_and_maybe_dequant_cache(src_cache, dst, block_table, cu_seq_lens,
    token_to_seq, num_tokens, kv_cache_dtype, scale, seq_starts);
    scaled_fp4_quant(input, input_global_scale, is_sf_swizzled_layout, ...)
    calls torch.ops._C.scaled_fp4_quant.out(input, input_global_scale,
    is_sf_swizzled_layout, output=, output_scale=), whose schema names the
    global scale `input_scale`; cutlass_scaled_fp4_mm(a, b, block_scale_a,
    block_scale_b, alpha, out_dtype) calls torch.ops._C.cutlass_scaled_fp4_mm
    (out, a, b, block_scale_a, block_scale_b, alpha); merge_attn_states(output,
    prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse,
    prefill_tokens_with_context, output_scale) calls torch.ops._C.
    merge_attn_states(output, output_lse, prefix_output, ...).
  vllm/v1/attention/ops/triton_decode_attention.py decode_attention_fwd(q,
    k_buffer, v_buffer, o, lse, req_to_token, b_seq_len, attn_logits,
    num_kv_splits, sm_scale, page_size, logit_cap, k_scale, v_scale, is_mla):
    stage 1 writes attn_logits [B, H, S, Lv + 1] (lse in column Lv), stage 2
    writes o [B, H, Lv] and lse [B, H]; triton_mla.py forward_mqa passes
    k_buffer = kv_c_and_k_pe_cache.unsqueeze(2) and v_buffer = its [..., :Lv].
  vllm/v1/attention/ops/triton_merge_attn_states.py merge_attn_states(output,
    prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse, ...).
  vllm/third_party/flashmla/flash_mla_interface.py and
    sglang/kernels/ops/attention/flash_mla_interface.py
    flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens,
    head_dim_v, tile_scheduler_metadata, num_splits, softmax_scale, causal,
    is_fp8_kvcache, indices, ...) -> (out, softmax_lse).
  sglang/kernels/ops/attention/decode_attention.py decode_attention_fwd_grouped(
    q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse,
    num_kv_splits, max_kv_splits, sm_scale_withk, v_scale, ...);
    sglang/srt/layers/attention/merge_state.py merge_state(prefix_output,
    prefix_lse, suffix_output, suffix_lse, output, output_lse) -> (output,
    output_lse), lse [T, H] (merge_state.py's kernel indexes
    token_idx * num_heads + head_idx).
  flashinfer/cascade.py merge_states(v, s) -> (v_merged, s_merged);
    flashinfer/mla/_batch_mla/_wrapper.py BatchMLAPagedAttentionWrapper.plan(
    qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv,
    head_dim_kpe, page_size, causal, sm_scale, ...) and run(*, query,
    kv_cache, out, lse, return_lse, ..., return_lse_base_on_e).
  sgl-kernel (not installed here; its op names as the audit cites
    sgl-kernel/python/sgl_kernel/gemm.py@02c75809): torch.ops.sgl_kernel.
    scaled_fp4_quant, cutlass_scaled_fp4_mm take vLLM's argument names; the
    hook reads their names from the live schema either way.
"""

from dataclasses import dataclass, field


@dataclass
class Part:
    """One contract kernel call made from an engine call (a pipeline stage).

    tensors: contract name -> (tensor, identity); identity says which
    engine tensor (and which slice of it) the contract tensor is, so a
    later stage's input can be linked to it. outputs: the contract names
    that are outputs."""

    stage: str
    kernel: str
    tensors: dict
    outputs: set
    params: dict = field(default_factory=dict)


@dataclass
class Op:
    name: str  # selection name
    engine: str  # whose conventions (`kcheck check --from ENGINE`)
    kernel: str  # contract kernel
    stage: str
    target: str  # "op:NS::NAME" (torch.ops) or "py:MODULE:QUALNAME"
    # Arguments written in place that are also read (copied before and
    # after: NAME_before / NAME_after); other written arguments are outputs
    # (copied after only). For a torch op the schema's (a!) marks say which
    # are written.
    inplace: tuple = ()
    outputs: tuple = ()
    returns: tuple = ()  # names of the return values (Python entry points)
    cache: str = None  # the argument holding the layer's KV cache
    # Schema name -> the Python API's name, where the two differ (the
    # names `kcheck check --from ENGINE` knows are the Python API's).
    rename: dict = field(default_factory=dict)
    # Arguments that are views of another argument (not stored twice).
    views: dict = field(default_factory=dict)
    # Does `kcheck check --from ENGINE` read this call under the engine's
    # own names? When not, a call's own file is written in the contract's
    # names (layout "contract") and the reason is named here.
    readable: bool = True
    unreadable_why: str = ""
    contract: callable = None  # call -> [Part]
    params: callable = None  # call -> extra contract params for its own file
    # Request rows (KCHECK_CAPTURE_REQUESTS): the tensors whose axis 0 is
    # the batch row of a request (the row of the block table / seq lens
    # the call carries), and token lists in CSR form (indptr, indices) with
    # one segment a request. An op that names none carries no request row
    # (a cache write addresses slots, a projection token rows) and is
    # captured whole.
    rows: tuple = ()
    csr: tuple = ()
    # A method whose call is a plan for later calls on the same object
    # (FlashInfer's wrapper: plan() takes the page lists and the scale,
    # run() the tensors): keeps_plan records the plan's arguments (no
    # file of its own), plan_from names the op whose latest call on the
    # object supplies the arguments the call itself lacks.
    keeps_plan: bool = False
    plan_from: str = None


def _ident(call, name, tag=""):
    return call.identity(name, tag)


def _kv_dtype(cache, declared):
    """The contract's kv_cache_dtype from the engine's spelling and the cache tensor."""
    import torch

    from kcheck import engines

    values = engines.engine("vllm").get("values", {}).get("kv_cache_dtype", {})
    kind = values.get(declared, declared) if declared is not None else None
    if kind in (None, "bf16") and cache.dtype == torch.bfloat16:
        return "bf16"
    if cache.dtype == torch.float16 and kind in (None, "bf16"):
        return "fp16"  # issue 16: fp16 caches are not yet readable
    if kind is None:
        return {torch.uint8: "fp8_e4m3", torch.float8_e4m3fn: "fp8_e4m3"}.get(cache.dtype, str(cache.dtype))
    return kind


def _cache_write_parts(call):
    import torch

    cache = call.before["kv_cache"]
    kind = _kv_dtype(cache, call.params.get("kv_cache_dtype"))
    squeeze = (lambda t: t.reshape(t.shape[0], t.shape[1], t.shape[-1])) if cache.dim() == 4 else (lambda t: t)
    ts = {
        "kv_c": (call.before["kv_c"], _ident(call, "kv_c")),
        "k_pe": (call.before["k_pe"], _ident(call, "k_pe")),
        "slot_mapping": (call.before["slot_mapping"], _ident(call, "slot_mapping")),
        "cache_before": (squeeze(cache), _ident(call, "kv_cache@before")),
        "cache_after": (squeeze(call.after["kv_cache"]), _ident(call, "kv_cache@after")),
    }
    if kind.startswith("fp8") and kind != "fp8_ds_mla":
        ts["k_scale"] = (call.before["scale"].to(torch.float32).reshape(()), _ident(call, "scale"))
    return [Part("cache", "kv_cache_write", ts, {"cache_after"}, {"kv_cache_dtype": kind, "page_size": str(cache.shape[1])})]


def _fp4_scale_bytes(t):
    """vLLM allocates NVFP4 block scales as int32 and views them as fp8:
    the same bytes, read as the contract's F8_E4M3 [rows, K/16 padded]."""
    import torch

    b = t.contiguous().view(torch.uint8)
    return b.reshape(t.shape[0], -1).view(torch.float8_e4m3fn)


def _quant_parts(call):
    x = call.before["input"]
    layout = "swizzled_128x4" if call.params.get("is_sf_swizzled_layout", "true") == "true" else "linear"
    ts = {
        "x": (x, _ident(call, "input")),
        "global_scale": (call.before["input_global_scale"], _ident(call, "input_global_scale")),
        "packed": (call.after["output"], _ident(call, "output")),
        "block_scale": (_fp4_scale_bytes(call.after["output_scale"]), _ident(call, "output_scale")),
    }
    return [Part("quant", "nvfp4_quantize", ts, {"packed", "block_scale"}, {"scale_layout": layout})]


def _gemm_parts(call):
    import torch

    ts = {
        "a_packed": (call.before["a"], _ident(call, "a")),
        "b_packed": (call.before["b"], _ident(call, "b")),
        "a_scale": (_fp4_scale_bytes(call.before["block_scale_a"]), _ident(call, "block_scale_a")),
        "b_scale": (_fp4_scale_bytes(call.before["block_scale_b"]), _ident(call, "block_scale_b")),
        # vLLM's alpha is the product of the two dequant-direction global
        # scales (1 / (gs_a * gs_b)): the contract's a_global with b_global 1.
        "a_global": (call.before["alpha"].to(torch.float32).reshape(()), _ident(call, "alpha")),
        "b_global": (torch.ones((), dtype=torch.float32), None),
        "out": (call.after["out"], _ident(call, "out")),
    }
    return [Part("quant", "nvfp4_gemm", ts, {"out"}, {"scale_layout": "swizzled_128x4"})]


def _triton_mla_parts(call):
    """TRITON_MLA's decode as two stages: stage 1 (attention over each
    split: attn_logits) and stage 2 (the split-K combine: o, lse)."""
    import torch

    q = call.before["q"]
    kb = call.before["k_buffer"]
    logits = call.after["attn_logits"]
    B, H, D = q.shape
    S, Lv = logits.shape[2], logits.shape[3] - 1
    kind = "bf16" if kb.dtype == torch.bfloat16 else ("fp16" if kb.dtype == torch.float16 else "fp8_e4m3")
    cache = kb.reshape(kb.shape[0], kb.shape[1], kb.shape[-1])
    po = logits[..., :Lv].reshape(B, 1, H, S, Lv).contiguous()
    pl = logits[..., Lv].reshape(B, 1, H, S).contiguous()
    po_id, pl_id = _ident(call, "attn_logits@after", "[..., :Lv]"), _ident(call, "attn_logits@after", "[..., Lv]")
    attn = {
        "q": (q.reshape(B, 1, H, D), _ident(call, "q")),
        "kv_cache": (cache, _ident(call, "k_buffer")),
        "block_table": (call.before["req_to_token"], _ident(call, "req_to_token")),
        "seq_lens": (call.before["b_seq_len"], _ident(call, "b_seq_len")),
        "partial_out": (po, po_id),
        "partial_lse": (pl, pl_id),
    }
    # num_splits is the call's num_kv_splits (S of attn_logits); the
    # contract reads S from the shape too (reference/CONTRACTS.md §3.6.1), but not every kcheck
    # build does yet.
    p = {"softmax_scale": call.params["sm_scale"], "kv_cache_dtype": kind, "page_size": call.params.get("page_size", "1"),
         "num_splits": str(S)}
    if kind == "fp8_e4m3" and "k_scale" in call.before:
        attn["k_scale"] = (call.before["k_scale"].to(torch.float32).reshape(()), _ident(call, "k_scale"))
    combine = {
        "partial_out": (po, po_id),
        "partial_lse": (pl, pl_id),
        "out": (call.after["o"].reshape(B * H, Lv), _ident(call, "o@after")),
        "lse": (call.after["lse"].reshape(B * H), _ident(call, "lse@after")),
    }
    return [Part("attn", "mla_decode", attn, {"partial_out", "partial_lse"}, p), Part("combine", "splitk_combine", combine, {"out", "lse"}, {})]


# SGLang's split length is whole 32-token blocks (decode_attention.py,
# _MIN_BLOCK_KV = 32; stage 1 and stage 2 both take kv_len_per_split =
# cdiv(cdiv(seq_len, kv_splits), MIN_BLOCK_KV) * MIN_BLOCK_KV).
SGLANG_MIN_BLOCK_KV = 32


def _cdiv(a, b):
    return -(-a // b)


def _sglang_decode_parts(call):
    """SGLang's Triton decode (TritonAttnBackend.forward_decode, MLA) as
    two stages: stage 1 (attention over each split: attn_logits [B, H, S,
    L], attn_lse [B, H, S]) and stage 2 (the combine: o [B, H, L]; SGLang
    stores no final lse). The pool is token-major (page size 1): k_buffer
    [tokens, 1, D] is read as the contract's [tokens, 1, D] cache and the
    token lists kv_indptr/kv_indices as a block table of one-token pages,
    padded with slot 0 (never read past seq_len); split_bounds are the
    32-token rounded splits the kernel makes of each request's tokens,
    which is the partials' layout, not a result."""
    import torch

    q = call.before["q"]
    kb = call.before["k_buffer"]
    indptr = call.before["kv_indptr"].to(torch.int64)
    indices = call.before["kv_indices"].to(torch.int64)
    splits = call.before["num_kv_splits"].to(torch.int64)
    logits, lse = call.after["attn_logits"], call.after["attn_lse"]
    B, H, D = q.shape
    S, Lv = logits.shape[2], logits.shape[3]
    lens = (indptr[1:] - indptr[:-1]).tolist()
    width = max([1, *lens])
    table = torch.zeros(B, width, dtype=torch.int32)
    bounds = torch.zeros(B, S + 1, dtype=torch.int32)
    for b, n in enumerate(lens):
        table[b, :n] = indices[indptr[b]: indptr[b] + n].to(torch.int32)
        per = _cdiv(_cdiv(n, int(splits[b])), SGLANG_MIN_BLOCK_KV) * SGLANG_MIN_BLOCK_KV
        bounds[b] = torch.tensor([min(j * per, n) for j in range(S + 1)], dtype=torch.int32)
    kind = "bf16" if kb.dtype == torch.bfloat16 else ("fp16" if kb.dtype == torch.float16 else str(kb.dtype))
    po = logits.reshape(B, 1, H, S, Lv)
    pl = lse.reshape(B, 1, H, S)
    po_id, pl_id = _ident(call, "attn_logits@after"), _ident(call, "attn_lse@after")
    attn = {
        "q": (q.reshape(B, 1, H, D), _ident(call, "q")),
        "kv_cache": (kb.reshape(kb.shape[0], 1, kb.shape[-1]), _ident(call, "k_buffer")),
        "block_table": (table, None),
        "seq_lens": (torch.tensor(lens, dtype=torch.int32), None),
        "split_bounds": (bounds, None),
        "partial_out": (po, po_id),
        "partial_lse": (pl, pl_id),
    }
    # sm_scale_withk is softmax_scale times k_scale (1 for a bf16 cache,
    # the only one kcheck reads SGLang's decode with: fp8 rounds q and P
    # to the cache dtype, kcheck.worker.sglang says where).
    p = {"softmax_scale": call.params["sm_scale_withk"], "kv_cache_dtype": kind, "page_size": "1", "latent_dim": str(Lv)}
    combine = {
        "partial_out": (logits.reshape(B * H, S, Lv), po_id),
        "partial_lse": (lse.reshape(B * H, S), pl_id),
        "out": (call.after["o"].reshape(B * H, Lv), _ident(call, "o@after")),
    }
    return [Part("attn", "mla_decode", attn, {"partial_out", "partial_lse"}, p), Part("combine", "splitk_combine", combine, {"out"}, {})]


def _merge_parts(call, lse_layout):
    """A two-state merge as a two-split combine: rows are (token, head).
    lse_layout "HT" (vLLM: [H, T]) or "TH" (SGLang's Triton merge_state)."""
    import torch

    po, so = call.before["prefix_output"], call.before["suffix_output"]
    T, H, Dv = po.shape
    pl, sl = call.before["prefix_lse"], call.before["suffix_lse"]
    if lse_layout == "HT":
        pl, sl = pl.transpose(0, 1), sl.transpose(0, 1)
    ts = {
        "partial_out": (torch.stack([po, so], dim=2).reshape(T * H, 2, Dv), None),
        "partial_lse": (torch.stack([pl.reshape(T, H), sl.reshape(T, H)], dim=2).reshape(T * H, 2).contiguous(), None),
        "out": (call.after["output"].reshape(T * H, Dv), _ident(call, "output@after")),
    }
    outs = {"out"}
    if call.after.get("output_lse") is not None:
        lse = call.after["output_lse"]
        lse = lse.transpose(0, 1) if lse_layout == "HT" else lse
        ts["lse"] = (lse.reshape(T * H).contiguous(), _ident(call, "output_lse@after"))
        outs.add("lse")
    return [Part("combine", "splitk_combine", ts, outs, {})]


def _flashmla_kernel(call):
    return {"kcheck.kernel": "mla_decode_sparse" if "indices" in call.before else "mla_decode"}


def _flashinfer_mla_kernel(call):
    return {"lse_base": "e" if call.params.get("return_lse_base_on_e") == "true" else "2"}


OPS = {}


def _add(op):
    OPS[op.name] = op


# vLLM custom ops (torch.ops; also what sgl-kernel's same-named ops are).
_add(Op("concat_and_cache_mla", "vllm", "kv_cache_write", "cache", "op:_C_cache_ops::concat_and_cache_mla",
        inplace=("kv_cache",), cache="kv_cache", contract=_cache_write_parts))
_add(Op("gather_and_maybe_dequant_cache", "vllm", "kv_cache_gather", "cache", "op:_C_cache_ops::gather_and_maybe_dequant_cache",
        outputs=("dst",), cache="src_cache"))
_add(Op("scaled_fp4_quant", "vllm", "nvfp4_quantize", "quant", "op:_C::scaled_fp4_quant",
        outputs=("output", "output_scale"), rename={"input_scale": "input_global_scale"}, contract=_quant_parts))
_add(Op("cutlass_scaled_fp4_mm", "vllm", "nvfp4_gemm", "quant", "op:_C::cutlass_scaled_fp4_mm",
        outputs=("out",), contract=_gemm_parts))
_add(Op("merge_attn_states", "vllm", "splitk_combine", "combine", "op:_C::merge_attn_states",
        outputs=("output", "output_lse"), contract=lambda c: _merge_parts(c, "HT")))
_add(Op("sgl_scaled_fp4_quant", "sglang", "nvfp4_quantize", "quant", "op:sgl_kernel::scaled_fp4_quant",
        outputs=("output", "output_scale"), rename={"input_scale": "input_global_scale"}, contract=_quant_parts))
_add(Op("sgl_cutlass_scaled_fp4_mm", "sglang", "nvfp4_gemm", "quant", "op:sgl_kernel::cutlass_scaled_fp4_mm",
        outputs=("out",), contract=_gemm_parts))

# Python entry points.
_add(Op("decode_attention_fwd", "vllm", "mla_decode", "attn", "py:vllm.v1.attention.ops.triton_decode_attention:decode_attention_fwd",
        outputs=("o", "lse", "attn_logits"), cache="k_buffer", views={"v_buffer": "k_buffer"}, contract=_triton_mla_parts,
        rows=("q", "o", "lse", "req_to_token", "b_seq_len", "attn_logits")))
_add(Op("triton_merge_attn_states", "vllm", "splitk_combine", "combine", "py:vllm.v1.attention.ops.triton_merge_attn_states:merge_attn_states",
        outputs=("output", "output_lse"), contract=lambda c: _merge_parts(c, "HT")))
_add(Op("sglang_decode_attention_fwd_grouped", "sglang", "mla_decode", "attn", "py:sglang.kernels.ops.attention.decode_attention:decode_attention_fwd_grouped",
        outputs=("o", "attn_logits", "attn_lse"), cache="k_buffer", views={"v_buffer": "k_buffer"}, contract=_sglang_decode_parts,
        rows=("q", "o", "attn_logits", "attn_lse", "num_kv_splits"), csr=(("kv_indptr", "kv_indices"),), readable=False,
        unreadable_why="the sglang engine table has no reading of SGLang's Triton decode (kv_indptr/kv_indices token lists, "
                       "separate attn_logits/attn_lse, 32-token split rounding; issue 16)"))
_add(Op("sglang_merge_state", "sglang", "splitk_combine", "combine", "py:sglang.srt.layers.attention.merge_state:merge_state",
        outputs=("output", "output_lse"), returns=("output", "output_lse"), contract=lambda c: _merge_parts(c, "TH"),
        readable=False, unreadable_why="the sglang engine table has no merge_state entry (its lse layout is [T, H], audit S4; issue 16)"))
_FLASHMLA_ROWS = ("q", "block_table", "cache_seqlens", "out", "softmax_lse", "indices")
_add(Op("flash_mla_with_kvcache", "flashmla", "mla_decode", "attn", "py:vllm.third_party.flashmla.flash_mla_interface:flash_mla_with_kvcache",
        returns=("out", "softmax_lse"), outputs=("out",), cache="k_cache", params=_flashmla_kernel, rows=_FLASHMLA_ROWS))
_add(Op("sglang_flash_mla_with_kvcache", "flashmla", "mla_decode", "attn", "py:sglang.kernels.ops.attention.flash_mla_interface:flash_mla_with_kvcache",
        returns=("out", "softmax_lse"), outputs=("out",), cache="k_cache", params=_flashmla_kernel, rows=_FLASHMLA_ROWS))
_add(Op("flashinfer_merge_states", "flashinfer", "splitk_combine", "combine", "py:flashinfer.cascade:merge_states",
        returns=("v_merged", "s_merged")))
# FlashInfer's MLA wrapper (flashinfer-python 0.7.2.post1,
# flashinfer/mla/_batch_mla/_wrapper.py): plan(qo_indptr, kv_indptr,
# kv_indices, kv_len_arr, num_heads, head_dim_ckv, head_dim_kpe, page_size,
# causal, sm_scale, q_data_type, kv_data_type, ..., *, metadata=
# MLAPlanMetadata (the same page lists, or the dense cum_seq_lens_q,
# block_tables, seq_lens: _contracts.py MLAPlanMetadata), ...) at line 410;
# run(q_nope, q_pe, ckv_cache, kpe_cache, out, lse, return_lse, ...,
# return_lse_base_on_e, ..., *, query= (packed, or the pair q_nope, q_pe),
# kv_cache= (packed, or the pair ckv_cache, kpe_cache), ...) at line 852.
# run's lse is base e exactly when return_lse_base_on_e (_contracts.py
# lines 139-140, validate_run_options). The page lists and the scale live
# in the plan, so a run's capture takes them from the wrapper's latest plan.
_FLASHINFER_MLA = "py:flashinfer.mla._batch_mla._wrapper:BatchMLAPagedAttentionWrapper"
_add(Op("flashinfer_mla_plan", "flashinfer", "mla_decode", "attn", _FLASHINFER_MLA + ".plan", keeps_plan=True))
_add(Op("flashinfer_mla_run", "flashinfer", "mla_decode", "attn", _FLASHINFER_MLA + ".run",
        returns=("out", "lse"), outputs=("out", "lse"), params=_flashinfer_mla_kernel, cache="ckv_cache|kv_cache",
        plan_from="flashinfer_mla_plan",
        rename={"query": "q", "query.0": "q_nope", "query.1": "q_pe", "kv_cache.0": "ckv_cache", "kv_cache.1": "kpe_cache"}))


def by_target():
    return {op.target: op for op in OPS.values()}
