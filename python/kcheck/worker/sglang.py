"""SGLang's Triton kernels (sglang 0.5.23), imported from the installed package.

These modules import the real `triton` directly (no driver gate), so no
shim of SGLang is needed.
"""

import torch

from kcheck.worker import BadInput, Unsupported
from kcheck.worker.common import float_param, need, param, provenance, require_convention


def splitk_combine(tensors, meta, opts):
    """sglang.kernels.ops.attention.merge_state.merge_state_triton(prefix_output,
    prefix_lse, suffix_output, suffix_lse): outputs [T, H, D], lse [T, H]
    (merge_state_kernel indexes token_idx * num_heads + head_idx), base e.
    Two states only: contract cases with S = 2 (prefix = split 0, suffix =
    split 1, each row a token with one head)."""
    require_convention(meta, "sglang", "splitk_combine", "lse_base", "e")
    po = need(tensors, "partial_out")
    pl = need(tensors, "partial_lse")
    if po.dim() != 3 or pl.dim() != 2:
        raise BadInput("partial_out must be [N, S, L] and partial_lse [N, S]")
    N, S, L = po.shape
    if S != 2:
        raise Unsupported(f"merge_state merges two states (prefix, suffix); the case has S = {S}")
    from sglang.kernels.ops.attention.merge_state import merge_state_triton

    out, lse = merge_state_triton(
        po[:, 0, :].reshape(N, 1, L).contiguous(), pl[:, 0].reshape(N, 1).contiguous(),
        po[:, 1, :].reshape(N, 1, L).contiguous(), pl[:, 1].reshape(N, 1).contiguous(),
    )
    m = provenance("sglang", "sglang", "sglang.kernels.ops.attention.merge_state.merge_state_triton")
    return {"out": out.reshape(N, L), "lse": lse.reshape(N)}, m


def pool_write(pool, loc, nope, rope, dtype, store, reserved_skip_index=0):
    """MLATokenToKVPool.set_mla_kv_buffer's write into pool ([rows, 1, D]
    in the pool's storage dtype store), as the pool does it: the tokens cast
    to the pool's dtype by PyTorch with no scale and viewed as store
    (memory_pool.py:5014-5024, written out here because the module imports
    transformers), then SGLang's own scatter set_mla_kv_buffer_triton, which
    skips a loc equal to reserved_skip_index (mla_buffer.py:41-44, :80)."""
    from sglang.kernels.ops.kvcache.mla_buffer import set_mla_kv_buffer_triton

    if nope.dtype != dtype:
        nope, rope = nope.to(dtype), rope.to(dtype)
    if store != dtype:
        nope, rope = nope.view(store), rope.view(store)
    set_mla_kv_buffer_triton(pool, loc, nope.contiguous(), rope.contiguous(), reserved_skip_index=reserved_skip_index)


def kv_cache_write(tensors, meta, opts):
    """bf16, fp16 and fp8_e4m3 caches: SGLang's MLA pool write
    (MLATokenToKVPool.set_mla_kv_buffer, sglang/srt/mem_cache/memory_pool.py
    :5026-5047): the tokens cast to the pool's dtype by PyTorch with no
    scale (:5014-5024, done here as those lines do it: the module imports
    transformers), then the engine's Triton scatter set_mla_kv_buffer_triton
    (sglang/kernels/ops/kvcache/mla_buffer.py:290-309) over the cache viewed
    as SGLang's flat pool [NB * P, 1, D]; the contract's skipped slots (< 0)
    are passed as its reserved_skip_index -1. fp8_ds_mla: below."""
    kind = param(meta, "kv_cache_dtype", "bf16")
    if kind == "fp8_ds_mla":
        return _dsa_quantize_write(tensors, meta, opts)
    dtype, store = {"bf16": (torch.bfloat16, torch.bfloat16), "fp16": (torch.float16, torch.float16),
                    "fp8_e4m3": (torch.float8_e4m3fn, torch.uint8)}.get(kind, (None, None))
    if dtype is None:
        raise Unsupported(f"kv_cache_dtype {kind}: SGLang's MLA pool holds bf16, fp16, fp8_e4m3 or fp8_ds_mla")
    if kind == "fp8_e4m3":
        ks = tensors.get("k_scale")
        if ks is None or ks.numel() != 1 or float(ks.reshape(-1)[0]) != 1.0:
            raise Unsupported("SGLang's fp8 pool casts with no scale: only k_scale = 1 is its write")
        if param(meta, "fp8_saturate", "true") != "true":
            raise Unsupported("fp8_saturate = false: torch's float8_e4m3fn cast saturates (torch 2.15)")
    kv_c = need(tensors, "kv_c")
    k_pe = need(tensors, "k_pe")
    slots = need(tensors, "slot_mapping").to(torch.int64)
    before = need(tensors, "cache_before")
    if before.dim() != 3:
        raise BadInput(f"cache_before has shape {tuple(before.shape)}; want [NB, P, D]")
    NB, P, D = before.shape
    if kv_c.shape[1] + k_pe.shape[1] != D:
        raise BadInput(f"kv_c [.., {kv_c.shape[1]}] and k_pe [.., {k_pe.shape[1]}] do not fill a {D}-wide entry")
    T = slots.shape[0]
    if (slots >= NB * P).any():
        raise BadInput("slot_mapping has a slot outside the cache")
    pool = before.reshape(NB * P, 1, D).clone()
    pool = pool.view(store) if store == torch.uint8 else pool
    loc = torch.where(slots < 0, torch.full_like(slots, -1), slots)
    pool_write(pool, loc, kv_c[:T].reshape(T, 1, -1), k_pe[:T].reshape(T, 1, -1), dtype, store, reserved_skip_index=-1)
    m = provenance("sglang", "sglang", "MLATokenToKVPool.set_mla_kv_buffer's cast (memory_pool.py:5014-5024) and "
                   "sglang.kernels.ops.kvcache.mla_buffer.set_mla_kv_buffer_triton")
    return {"cache_after": pool.view(before.dtype).reshape(NB, P, D)}, m


def _dsa_quantize_write(tensors, meta, opts):
    """The DSA (NSA) fp8_ds_mla cache quantizer,
    sglang.kernels.ops.quantization.dsa_quant_k_cache.quantize_k_cache(cache_k
    [num_tokens, 1, 1, 576] bf16) -> 656-byte entries [e4m3 x512 | f32 x4 |
    bf16 x64], each tile scale amax/448 with no floor. SGLang's pool then
    stores each token's entry at its slot (set_mla_kv_buffer); the worker
    does that byte copy itself (cache_after = cache_before with the written
    slots replaced), which is data movement."""
    if meta.get("ds_mla_scale", "amax") != "amax":
        raise Unsupported(f"ds_mla_scale {meta.get('ds_mla_scale')}: SGLang's quantizer writes amax/448 scales")
    kv_c = need(tensors, "kv_c")
    k_pe = need(tensors, "k_pe")
    slots = need(tensors, "slot_mapping").to(torch.int64)
    before = need(tensors, "cache_before")
    if kv_c.dtype != torch.bfloat16 or k_pe.dtype != torch.bfloat16:
        raise Unsupported("the quantizer asserts bf16 k_nope and k_rope")
    if before.dim() != 3 or before.shape[2] != 656 or before.dtype != torch.uint8:
        raise BadInput(f"cache_before has shape {tuple(before.shape)} {before.dtype}; want U8 [NB, P, 656]")
    T = kv_c.shape[0]
    from sglang.kernels.ops.quantization.dsa_quant_k_cache import quantize_k_cache

    entries = quantize_k_cache(torch.cat([kv_c, k_pe], dim=-1).reshape(T, 1, 1, -1)).reshape(T, -1)
    if entries.shape[1] != 656:
        raise RuntimeError(f"quantize_k_cache returned {entries.shape[1]} bytes a token, not 656")
    after = before.clone()
    flat = after.view(-1, 656)
    valid = slots >= 0
    if (slots[valid] >= flat.shape[0]).any():
        raise BadInput("slot_mapping has a slot outside the cache")
    flat[slots[valid]] = entries.view(torch.uint8)[valid]
    m = provenance("sglang", "sglang", "sglang.kernels.ops.quantization.dsa_quant_k_cache.quantize_k_cache (the slot scatter by the worker)")
    return {"cache_after": after}, m


# TritonAttnBackend.max_kv_splits (sglang/srt/layers/attention/
# triton_backend.py, `get_exec().kernel.triton_attention_num_kv_splits`),
# 8 as SGLang's own attention tests set it; without a device core count
# (the CPU) get_num_kv_splits fills every request's count with it.
DEFAULT_KV_SPLITS = 8


def mla_decode(tensors, meta, opts):
    """SGLang's Triton grouped decode, decode_attention_fwd_grouped (sglang
    0.5.23, sglang/kernels/ops/attention/decode_attention.py), as
    TritonAttnBackend.forward_decode calls it for MLA (has_mla=True, one
    query a request):

    - the cache is SGLang's token-major pool: kv_cache [NB, P, D] viewed as
      [NB*P, 1, D] (k_buffer) and its first L columns (v_buffer), with
      kv_indptr [B+1] and kv_indices the request's token slots
      (block_table[b, t // P] * P + t % P): the worker builds these token
      lists from the block table (data movement);
    - num_kv_splits [B] per request (all equal here: the option
      num_kv_splits, else the case's num_splits, else 8, SGLang's
      max_kv_splits as the backend fills it without a core count),
      attn_logits [B, H, S, L] and attn_lse [B, H, S] fp32, filled with NaN
      first (a split the kernel never writes is visibly not data);
    - o [B, H, L] in q's dtype, sm_scale_withk = softmax_scale (bf16 cache:
      k_scale 1), v_scale 1.

    OUT is the call in SGLang's names (q [B, H, D], k_buffer, kv_indptr,
    kv_indices, num_kv_splits, o, attn_logits, attn_lse, sm_scale, ...)
    and declares kcheck.worker.layout = sglang: kcheck reads it with the
    engine table `--from sglang` reads a capture with, which maps
    attn_logits/attn_lse to the partials with the kernel's 32-token-rounded
    split bounds and leaves the splits the kernel never writes unjudged
    (reference/CONTRACTS.md §3.6.1, §9.1). SGLang's decode computes no
    final lse (_fwd_kernel_stage2 stores o only), declared in
    kcheck.worker.not_written: o and the partials are judged.

    Refused: fp8 caches (stage 1 rounds q to the cache's fp8 dtype,
    `q_k = q.to(K_Buffer.dtype.element_ty)`, line 661, and P to it,
    `p.to(v.dtype)` with v the fp8 K block, line 762: kcheck's precision
    model has no fp8 q or P), fp8_ds_mla, s_q > 1 (the decode path takes
    one query a request) and causal.
    """
    require_convention(meta, "sglang", "mla_decode", "lse_base", "e")
    kind = param(meta, "kv_cache_dtype", "bf16")
    if kind != "bf16":
        raise Unsupported(f"kv_cache_dtype {kind}: SGLang's Triton decode rounds q and P to an fp8 cache's dtype "
                          "(decode_attention.py lines 661, 762), which kcheck's precision model cannot declare; bf16 only")
    q = need(tensors, "q")
    cache = need(tensors, "kv_cache")
    block_table = need(tensors, "block_table").to(torch.int64)
    seq_lens = need(tensors, "seq_lens").to(torch.int64)
    if q.dim() != 4:
        raise BadInput(f"q has shape {tuple(q.shape)}; want [B, s_q, H, D]")
    B, s_q, H, D = q.shape
    if s_q != 1:
        raise Unsupported(f"s_q = {s_q}: SGLang's Triton decode takes one query a request")
    if cache.dim() != 3 or cache.shape[2] != D:
        raise BadInput(f"kv_cache has shape {tuple(cache.shape)}; want [NB, P, {D}]")
    if meta.get("causal", "false") == "true":
        raise Unsupported("causal: one query a request has nothing to mask")
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise Unsupported(f"q dtype {q.dtype}: SGLang's decode runs bf16/fp16 queries")
    L = int(param(meta, "latent_dim", "512"))
    NB, P = cache.shape[0], cache.shape[1]
    scale = float_param(meta, "softmax_scale")
    if "num_kv_splits" in opts:
        S, why = int(opts["num_kv_splits"]), "option num_kv_splits"
    elif meta.get("num_splits"):
        S, why = int(meta["num_splits"]), "the case's num_splits"
    else:
        S, why = DEFAULT_KV_SPLITS, "SGLang's max_kv_splits without a device core count"
    if S < 1:
        raise BadInput(f"num_kv_splits = {S}: want at least 1")

    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd_grouped

    lens = [int(n) for n in seq_lens.tolist()]
    slots = []
    for b, n in enumerate(lens):
        t = torch.arange(n, dtype=torch.int64, device=q.device)
        slots.append(block_table[b, t // P] * P + t % P)
    kv_indices = torch.cat(slots).to(torch.int32) if slots else torch.zeros(0, dtype=torch.int32)
    kv_indptr = torch.zeros(B + 1, dtype=torch.int32, device=q.device)
    kv_indptr[1:] = torch.cumsum(seq_lens, 0).to(torch.int32)
    k_buffer = cache.reshape(NB * P, 1, D)
    v_buffer = k_buffer[..., :L]
    num_kv_splits = torch.full((B,), S, dtype=torch.int32, device=q.device)
    attn_logits = torch.full((B, H, S, L), float("nan"), dtype=torch.float32, device=q.device)
    attn_lse = torch.full((B, H, S), float("nan"), dtype=torch.float32, device=q.device)
    o = torch.zeros(B, H, L, dtype=q.dtype, device=q.device)
    decode_attention_fwd_grouped(
        q.reshape(B, H, D).contiguous(), k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse,
        num_kv_splits, S, scale, 1.0, has_mla=True, page_size=1,
    )
    # OUT is the call as SGLang made it, in its own names: kcheck reads it
    # as `kcheck check --from sglang` reads a capture of this call
    # (internal/engines sglangTritonDecode: the token lists back to a block
    # table, attn_logits/attn_lse to the partials, num_kv_splits to the
    # 32-token-rounded split bounds, the empty splits the kernel never
    # writes left unjudged), so a run and a capture are read the same.
    outs = {
        "q": q.reshape(B, H, D), "k_buffer": k_buffer, "kv_indptr": kv_indptr, "kv_indices": kv_indices,
        "num_kv_splits": num_kv_splits, "o": o, "attn_logits": attn_logits, "attn_lse": attn_lse,
    }
    m = provenance("sglang", "sglang", "sglang.kernels.ops.attention.decode_attention.decode_attention_fwd_grouped (as TritonAttnBackend.forward_decode, has_mla)")
    m.update({"kcheck.kernel": "mla_decode", "kcheck.worker.layout": "sglang", "kcheck.worker.not_written": "lse",
              "sm_scale": repr(scale), "k_scale": "1.0", "v_scale": "1.0", "max_kv_splits": str(S), "v_head_dim": str(L)})
    m["kcheck.worker.num_kv_splits_from"] = why
    # Declared precision (decode_attention.py, _fwd_grouped_kernel_stage1):
    # fp32 tl.dot accumulation (lines 690, 762), P rounded to V's dtype,
    # with has_mla V is the bf16 K block (`v = tl.trans(k)`, line 734), and
    # a running max per BLOCK_N = 32 tokens (_decode_grouped_att_m_fwd,
    # `BLOCK = 32`, line 818).
    m.update({"acc_dtype": "f32", "p_dtype": "bf16", "kv_dequant_dtype": "bf16", "softmax_block": "32",
              "kcheck.worker.precision_source": "sglang/kernels/ops/attention/decode_attention.py (sglang 0.5.23) lines 661-762, 818"})
    return outs, m


mla_decode.options = ("num_kv_splits",)


def kernels(name):
    return {"splitk_combine": splitk_combine, "kv_cache_write": kv_cache_write, "mla_decode": mla_decode}
