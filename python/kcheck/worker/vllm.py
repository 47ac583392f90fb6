"""vLLM's Triton kernels (vllm 0.33.0), called as vLLM's backends call them.

Every vLLM Triton module imports `triton` and `tl` from vllm.triton_utils,
whose importing.py sets HAS_TRITON = False when no GPU driver is active
(vllm/triton_utils/importing.py, "Disabling Triton to prevent runtime
errors"), and then hands out TritonPlaceholder, whose `jit` returns the
Python function undecorated: the kernels cannot be launched, not even by
Triton's interpreter. The shim below replaces exactly those two names of
the real vllm.triton_utils module, `triton` and `tl`, with the real triton
and triton.language, and only when vLLM disabled them; everything else
(the kernel module, vllm.platforms, the launch code) is vLLM's own,
imported from the installed package. On a GPU machine no shim is applied.
"""

import torch

from kcheck.worker import BadInput, Unsupported, device
from kcheck.worker.common import (
    bool_param,
    float_param,
    need,
    param,
    provenance,
    require_convention,
)

SHIM = "vllm.triton_utils.triton/.tl replaced by the real triton/triton.language (vLLM disables Triton without an active GPU driver)"


def _load(modname):
    """Import a vLLM kernel module with Triton enabled; returns (module, shim or None)."""
    import importlib
    import sys

    import triton
    import triton.language as tl

    import vllm.triton_utils as tu

    shim = None
    if not tu.HAS_TRITON:
        if modname in sys.modules:
            raise RuntimeError(f"{modname} was imported before the shim")
        tu.triton, tu.tl = triton, tl
        shim = SHIM
    return importlib.import_module(modname), shim


# TRITON_MLA's split count (vllm/v1/attention/backends/mla/triton_mla.py,
# _compute_num_kv_splits and its constants _MIN_WORK_PER_SPLIT = 512,
# _SPLIT_OCCUPANCY_MULTIPLIER = 2): next_power_of_2(max(1, max_seq_len //
# 512)), capped at 2 * the SM count. The option num_kv_splits overrides it
# (the CPU has no SM count; the cap is reported as not applied).
def _triton_mla_splits(max_seq_len):
    n = max(1, max_seq_len // 512)
    return 1 << (n - 1).bit_length()


_PRECISION_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}


def _triton_mla_precision(q_dtype, cache_dtype):
    """The declared precision of _fwd_grouped_kernel_stage1 (vllm 0.33.0,
    vllm/v1/attention/ops/triton_decode_attention.py), which the Expected
    reference then emulates:

    - acc_dtype f32: `qk = tl.dot(q, k.to(q.dtype))` (line 393) and
      `acc += tl.dot(p.to(v.dtype), v)` (line 437) accumulate in fp32
      (tl.dot's default out dtype for 16-bit operands);
    - kv_dequant_dtype = q's dtype: an fp8 row is `(k.to(tl.float32) *
      ks).to(q.dtype)` (lines 391-392; kpe likewise, 402-403);
    - p_dtype = V's dtype, and with is_mla V is the (dequantized) K block
      itself, `v = tl.trans(k)` (line 431): q's dtype for an fp8 cache,
      the cache's own for a 16-bit one;
    - softmax_block 32: the running max e_max advances once per BLOCK_N =
      32-token tile (_decode_grouped_att_m_fwd, `BLOCK = 32`, line 505;
      16 on ROCm, which this worker does not run), so P is rounded
      against a max kept per 32 tokens.

    The softmax itself is natural-base, `p = tl.exp(qk - n_e_max)` on
    qk = fp32(dot * sm_scale) (lines 405, 435), where kcheck's model is
    FlashMLA's exp2f(fma(s, scale*log2e, -m*scale*log2e)); the two differ
    by a few fp32 ulp of P, below P's bf16 rounding, so it is not declared.
    """
    q_name = _PRECISION_DTYPES.get(q_dtype)
    if q_name is None:
        raise Unsupported(f"q dtype {q_dtype}: TRITON_MLA runs bf16/fp16 queries")
    fp8 = cache_dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    return {
        "acc_dtype": "f32",
        "kv_dequant_dtype": q_name,
        "p_dtype": q_name if fp8 else _PRECISION_DTYPES.get(cache_dtype, q_name),
        "softmax_block": "32",
        "kcheck.worker.precision_source": "vllm/v1/attention/ops/triton_decode_attention.py (vllm 0.33.0) lines 391-437, 505",
    }


def mla_decode(tensors, meta, opts):
    """TRITON_MLA's forward_mqa (vllm/v1/attention/backends/mla/triton_mla.py):
    o = zeros(B, H, kv_lora_rank, q.dtype), lse = zeros(B, H, q.dtype),
    attn_logits = empty(B, H, num_kv_splits, kv_lora_rank + 1, float32),
    decode_attention_fwd(q, kv_cache.unsqueeze(2), kv_cache.unsqueeze(2)[..., :L],
    o, lse, block_table, seq_lens, attn_logits, num_kv_splits, scale,
    PAGE_SIZE, k_scale=, v_scale=k_scale, is_mla=True).

    Outputs, moved into the contract's layout (data movement only):
    out [B, s_q, H, L] from o; lse [B, H, s_q] from lse, in the dtype the
    buffer had (option lse_dtype: `query`, TRITON_MLA's, or `f32`, the same
    kernel handed an fp32 buffer); partial_out [B, s_q, H, S, L] and
    partial_lse [B, s_q, H, S] from attn_logits[..., :L] and [..., L]
    (option partials=off leaves them out). attn_logits is filled with NaN
    before the call, so a split the kernel never writes (an empty split:
    the store is inside `if split_kv_end > split_kv_start`) is visibly not
    data.
    """
    require_convention(meta, "vllm", "mla_decode", "lse_base", "e")
    kind = param(meta, "kv_cache_dtype", "bf16")
    if kind not in ("bf16", "fp8_e4m3"):
        raise Unsupported(f"kv_cache_dtype {kind}: TRITON_MLA reads bf16/fp16 or per-tensor fp8 caches (triton_mla.py supported_kv_cache_dtypes), not {kind}")
    lse_dtype = opts.get("lse_dtype", "query")
    if lse_dtype not in ("query", "f32"):
        raise BadInput(f"option lse_dtype={lse_dtype}: want query or f32")
    partials = opts.get("partials", "on")
    if partials not in ("on", "off"):
        raise BadInput(f"option partials={partials}: want on or off")

    q = need(tensors, "q")
    cache = need(tensors, "kv_cache")
    block_table = need(tensors, "block_table").to(torch.int32)
    seq_lens = need(tensors, "seq_lens").to(torch.int32)
    if q.dim() != 4:
        raise BadInput(f"q has shape {tuple(q.shape)}; want [B, s_q, H, D]")
    B, s_q, H, D = q.shape
    if cache.dim() != 3 or cache.shape[2] != D:
        raise BadInput(f"kv_cache has shape {tuple(cache.shape)}; want [NB, P, {D}]")
    L = int(param(meta, "latent_dim", "512"))
    P = cache.shape[1]
    scale = float_param(meta, "softmax_scale")
    causal = bool_param(meta, "causal", False)
    k_scale = None
    if kind == "fp8_e4m3":
        cache = cache.view(torch.float8_e4m3fn)
        k_scale = need(tensors, "k_scale").to(torch.float32).reshape(())

    mod, shim = _load("vllm.v1.attention.ops.triton_decode_attention")

    # forward_mqa's multi-token decode (triton_mla.py, query_len > 1): rows
    # are (request, query) pairs, each with the request's block table and,
    # when causal, a context shortened by the queries after it.
    qf = q.reshape(B * s_q, H, D).contiguous()
    bt = block_table.repeat_interleave(s_q, dim=0) if s_q > 1 else block_table
    if s_q > 1 and causal:
        offs = torch.arange(1 - s_q, 1, dtype=seq_lens.dtype, device=seq_lens.device)
        sl = (seq_lens.unsqueeze(1) + offs).flatten().clamp(min=0)
    else:
        sl = seq_lens.repeat_interleave(s_q) if s_q > 1 else seq_lens
    max_len = int(seq_lens.max().item()) if seq_lens.numel() else 0
    # The split count: the option, else the case's own (a split-K case asks
    # for S splits: the kernel takes any num_kv_splits), else TRITON_MLA's.
    if "num_kv_splits" in opts:
        S, why = int(opts["num_kv_splits"]), "option num_kv_splits"
    elif meta.get("num_splits"):
        S, why = int(meta["num_splits"]), "the case's num_splits"
    else:
        S, why = _triton_mla_splits(max_len), "TRITON_MLA _compute_num_kv_splits (no SM cap on the CPU)"
    if S < 1:
        raise BadInput(f"num_kv_splits = {S}: want at least 1")

    rows = B * s_q
    o = torch.zeros(rows, H, L, dtype=q.dtype, device=q.device)
    lse = torch.zeros(rows, H, dtype=q.dtype if lse_dtype == "query" else torch.float32, device=q.device)
    attn_logits = torch.full((rows, H, S, L + 1), float("nan"), dtype=torch.float32, device=q.device)
    kv = cache.unsqueeze(2)
    mod.decode_attention_fwd(
        qf, kv, kv[..., :L], o, lse, bt, sl, attn_logits, S, scale, P,
        k_scale=k_scale, v_scale=k_scale, is_mla=True,
    )
    outs = {
        "out": o.reshape(B, s_q, H, L),
        "lse": lse.reshape(B, s_q, H).permute(0, 2, 1),
    }
    if partials == "on":
        outs["partial_out"] = attn_logits[..., :L].reshape(B, s_q, H, S, L)
        outs["partial_lse"] = attn_logits[..., L].reshape(B, s_q, H, S)
    m = provenance("vllm", "vllm", "vllm.v1.attention.ops.triton_decode_attention.decode_attention_fwd (as TRITON_MLA forward_mqa)", shim)
    m["num_kv_splits"] = str(S)
    m["kcheck.worker.num_kv_splits_from"] = why
    m["kcheck.worker.lse_dtype"] = str(lse.dtype).replace("torch.", "")
    m.update(_triton_mla_precision(q.dtype, cache.dtype))
    return outs, m


mla_decode.options = ("lse_dtype", "partials", "num_kv_splits")


def splitk_combine(tensors, meta, opts):
    """vLLM's Triton merge_attn_states (vllm/v1/attention/ops/
    triton_merge_attn_states.py): output [T, H, D], prefix/suffix outputs
    [T, H, D], lse [H, T], base e. It merges exactly two states, so only
    contract cases with S = 2 map onto it: prefix = split 0, suffix =
    split 1, each contract row a token with one head."""
    require_convention(meta, "vllm", "splitk_combine", "lse_base", "e")
    po = need(tensors, "partial_out")
    pl = need(tensors, "partial_lse")
    if po.dim() != 3 or pl.dim() != 2:
        raise BadInput("partial_out must be [N, S, L] and partial_lse [N, S]")
    N, S, L = po.shape
    if S != 2:
        raise Unsupported(f"merge_attn_states merges two states (prefix, suffix); the case has S = {S}")
    mod, shim = _load("vllm.v1.attention.ops.triton_merge_attn_states")
    out_dtype = torch.bfloat16
    prefix = po[:, 0, :].reshape(N, 1, L).contiguous()
    suffix = po[:, 1, :].reshape(N, 1, L).contiguous()
    output = torch.empty(N, 1, L, dtype=torch.float32, device=po.device)
    output_lse = torch.empty(1, N, dtype=torch.float32, device=po.device)
    mod.merge_attn_states(output, prefix, pl[:, 0].reshape(1, N).contiguous(), suffix, pl[:, 1].reshape(1, N).contiguous(), output_lse)
    m = provenance("vllm", "vllm", "vllm.v1.attention.ops.triton_merge_attn_states.merge_attn_states", shim)
    m["kcheck.worker.note"] = "output buffer fp32 (the contract's partials are fp32; vLLM merges in the partials' dtype)"
    del out_dtype
    return {"out": output.reshape(N, L), "lse": output_lse.reshape(N)}, m


def kernels(name):
    return {"mla_decode": mla_decode, "splitk_combine": splitk_combine}
