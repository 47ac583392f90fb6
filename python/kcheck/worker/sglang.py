"""SGLang's Triton kernels (sglang 0.5.23), imported from the installed package.

These modules import the real `triton` directly (no driver gate), so no
shim of SGLang is needed.
"""

import torch

from kcheck.worker import BadInput, Unsupported
from kcheck.worker.common import need, param, provenance, require_convention


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


def kv_cache_write(tensors, meta, opts):
    """The DSA (NSA) fp8_ds_mla cache quantizer,
    sglang.kernels.ops.quantization.dsa_quant_k_cache.quantize_k_cache(cache_k
    [num_tokens, 1, 1, 576] bf16) -> 656-byte entries [e4m3 x512 | f32 x4 |
    bf16 x64], each tile scale amax/448 with no floor. SGLang's pool then
    stores each token's entry at its slot (set_mla_kv_buffer); the worker
    does that byte copy itself (cache_after = cache_before with the written
    slots replaced), which is data movement."""
    kind = param(meta, "kv_cache_dtype", "bf16")
    if kind != "fp8_ds_mla":
        raise Unsupported(f"kv_cache_dtype {kind}: the SGLang worker runs the fp8_ds_mla quantizer only")
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


def kernels(name):
    return {"splitk_combine": splitk_combine, "kv_cache_write": kv_cache_write}
