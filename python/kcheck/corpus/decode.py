"""Split-K MLA decode as deployed (issue 16 items 2-3; audit V13, V15, S5,
gaps 1, 2, 11): vLLM's TRITON_MLA and SGLang's Triton decode, engine code
under Triton's interpreter, called with the arguments their backends pass."""

import math

import torch

from kcheck.corpus import run
from kcheck.corpus.ref import e4m3

TRITON_MLA = ("vllm/v1/attention/backends/mla/triton_mla.py@0.33.0:246-345 (forward_mqa: o zeros [B,H,L], lse zeros [B,H] in q.dtype :262-265, "
              "attn_logits torch.empty [B,H,S,L+1] f32 :281-290, decode_attention_fwd(..., k_scale=v_scale=layer._k_scale, is_mla=True) :328-343), "
              ":40-50 (_compute_num_kv_splits: next_power_of_2(max(1, max_seq_len // 512)) capped at 2*SMs), :100-107 (supported_dtypes fp16/bf16, kv cache auto/float16/bfloat16/fp8/fp8_e4m3)")
TRITON_DECODE = ("vllm/v1/attention/ops/triton_decode_attention.py@0.33.0:278-466 (_fwd_grouped_kernel_stage1: stores only inside `if split_kv_end > split_kv_start` :360, "
                 "fp8 K dequantized `(k.to(f32) * ks).to(q.dtype)` :391-392, MLA V = tl.trans(k) :431, P rounded `p.to(v.dtype)` :437, lse in column Lv :452-464), "
                 ":575-638 (_fwd_kernel_stage2: skips empty splits :611, lse = e_max + log(e_sum) :634)")
SGL_DECODE = ("sglang/kernels/ops/attention/decode_attention.py@0.5.23:1191-1327 (decode_attention_fwd: sm_scale * k_scale folded :1265), :530-795 "
              "(_fwd_grouped_kernel_stage1: split length cdiv(cdiv(len, kv_splits), MIN_BLOCK_KV) * MIN_BLOCK_KV :633, _MIN_BLOCK_KV = 32 :46, "
              "per-request num_kv_splits :615, kv_indptr/kv_indices :606-607), :935-1075 (stage 2; no final lse)")
SCALE = 192 ** -0.5 * (0.1 * math.log(40) + 1) ** 2   # DeepSeek-V3 (CONTRACTS section 6)


def _triton_mla_splits(max_seq_len, sm_count=132):
    # triton_mla.py _compute_num_kv_splits with vLLM's constants (512 tokens a split, 2 blocks an SM).
    n = max(1, max_seq_len // 512)
    return min(1 << (n - 1).bit_length(), 2 * sm_count)


def _paged(g, B, lens, P, D, NB, dtype, amp=1.0):
    cache = (torch.randn(NB, P, D, generator=g) * amp).to(dtype)
    nblk = max((l + P - 1) // P for l in lens)
    perm = torch.randperm(NB, generator=g)[: B * nblk].to(torch.int32)
    return cache, perm.reshape(B, nblk).contiguous()


def triton_mla(c, name, q_dtype, cache_kind, fault, seed, lens=(1100, 40, 1), committed=False):
    mod, shim = run.vllm_module("vllm.v1.attention.ops.triton_decode_attention")
    g = torch.Generator().manual_seed(seed)
    lens = list(lens)   # by default S = 2 splits (1100 // 512 = 2); request 2's split 1 holds no token
    B, H, L, R, P = len(lens), 16, 512, 64, 64
    NB = B * ((max(lens) + P - 1) // P) + 5   # every request's pages distinct, a few spare
    raw, bt = _paged(g, B, lens, P, L + R, NB, torch.float32, 0.6)
    q = (torch.randn(B, H, L + R, generator=g) * 0.8).to(q_dtype)
    k_scale = torch.tensor(1.0)
    if cache_kind == "fp8":
        k_scale = torch.tensor(0.0078125 * 1.37)   # a checkpoint's per-tensor scale (not a power of two)
        cache = e4m3(raw / k_scale).view(torch.uint8)  # vLLM allocates fp8 caches as uint8
        kernel_cache = cache.view(torch.float8_e4m3fn)
    else:
        cache = raw.to(q_dtype)
        kernel_cache = cache
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    S = _triton_mla_splits(max(lens))
    feed_bt, feed_scale, feed_ks = bt, SCALE, k_scale
    if fault == "block_table_shift":
        feed_bt = bt.clone()
        feed_bt[0, 5:] = torch.roll(bt[0, 5:], 1)   # request 0's pages from page 5 on, one slot late
    elif fault == "softmax_scale_default":
        feed_scale = (L + R) ** -0.5
    elif fault == "kv_scale_ignored":
        feed_ks = torch.tensor(1.0)
    o = torch.zeros(B, H, L, dtype=q_dtype)
    lse = torch.zeros(B, H, dtype=q_dtype)
    # torch.empty in forward_mqa: filled with NaN here so unwritten splits are visibly not data
    attn_logits = torch.full((B, H, S, L + 1), math.nan)
    kv = kernel_cache.unsqueeze(2)
    mod.decode_attention_fwd(q, kv, kv[..., :L], o, lse, feed_bt, seq_lens, attn_logits, S, feed_scale, P,
                             k_scale=feed_ks, v_scale=feed_ks, is_mla=True)
    base = f"vllm/triton_mla_{name}"
    kvdt = {"bf16": "auto", "fp16": "auto", "fp8": "fp8"}[cache_kind]
    meta = {"kcheck.kernel": "mla_decode", "scale": SCALE, "num_kv_splits": S, "kv_cache_dtype": kvdt,
            "page_size": P, "kv_lora_rank": L, "kcheck.corpus.sm_count": 132, "kcheck.corpus.shim": shim or "",
            "kcheck.corpus.attn_logits_fill": "nan (torch.empty in the engine; splits the kernel never writes keep it)"}
    expect = {"verdict": "pass"}
    if fault == "block_table_shift":
        expect = {"verdict": "fail", "tensor": "o", "stage": None, "signature": "page boundary (request 0, pages >= 5)"}
    elif fault == "softmax_scale_default":
        expect = {"verdict": "fail", "tensor": "o", "stage": None, "signature": "softmax_scale_default"}
    elif fault == "kv_scale_ignored":
        expect = {"verdict": "fail", "tensor": "o", "stage": None, "signature": "fp8 k_scale not applied (uniform, every token)"}
    twin_fault = {"bf16": "block_table_shift", "fp16": "softmax_scale_default", "fp8": "kv_scale_ignored"}[name.split("_")[0]]
    c.add(f"{base}{'_' + fault if fault else ''}.safetensors", engine="vllm", from_engine="vllm", kernel="mla_decode",
          function="vllm.v1.attention.ops.triton_decode_attention.decode_attention_fwd (as TritonMLAImpl.forward_mqa calls it)",
          source=TRITON_MLA + "; " + TRITON_DECODE, produced_by="engine",
          tensors={"q": q, "kv_c_and_k_pe_cache": cache, "block_table": bt, "seq_lens": seq_lens, "k_scale": k_scale,
                   "o": o, "lse": lse, "attn_logits": attn_logits},
          meta=meta, expect=expect, audit=["V13", "V15", "V1", "F17", "gap1", "gap11"], item=3 if cache_kind != "fp16" else 2,
          fault=fault, twin=base + (".safetensors" if fault else f"_{twin_fault}.safetensors"), committed=committed,
          notes=f"q {q_dtype}, cache {cache_kind} [NB,P,576] (kv_c_and_k_pe_cache before forward_mqa's unsqueeze(2)), o and lse in q.dtype, "
                f"S={S} splits from max_seq_len {max(lens)}; lens {lens}" + ("; the last request leaves its later splits unwritten (NaN). " if S > 1 else ". ")
                + ("fp8: K dequantized to q.dtype, V = trans(K) in q.dtype, P rounded to q.dtype (0.33.0; the audit's older V15 said V fp32, P unrounded)" if cache_kind == "fp8" else ""))


def sglang_decode(c, fault, seed):
    run.interpreter()
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd

    g = torch.Generator().manual_seed(seed)
    B, H, L, R = 3, 16, 512, 64
    lens = [300, 40, 5]
    splits = [4, 4, 1]
    total = sum(lens) + 37
    k_buffer = (torch.randn(total, 1, L + R, generator=g) * 0.6).bfloat16()
    kv_indices = torch.randperm(total, generator=g)[: sum(lens)].to(torch.int64)
    kv_indptr = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    q = (torch.randn(B, H, L + R, generator=g) * 0.8).bfloat16()
    num_kv_splits = torch.tensor(splits, dtype=torch.int32)
    Smax = max(splits)
    feed_idx = kv_indices
    if fault == "kv_indices_shift":
        feed_idx = kv_indices.clone()
        feed_idx[: lens[0] - 1] = kv_indices[1: lens[0]]   # request 0's token t read from token t+1's slot
    o = torch.zeros(B, H, L, dtype=torch.bfloat16)
    attn_logits = torch.full((B, H, Smax, L), math.nan)
    attn_lse = torch.full((B, H, Smax), math.nan)
    decode_attention_fwd(q, k_buffer, k_buffer[..., :L], o, kv_indptr, feed_idx, attn_logits, attn_lse,
                         num_kv_splits, Smax, SCALE, 1.0, 1.0, has_mla=True)   # as triton_backend.py:2472-2489 calls it with use_mla
    base = "sglang/triton_decode_bf16"
    c.add(f"{base}{'_' + fault if fault else ''}.safetensors", engine="sglang", from_engine="sglang", kernel="mla_decode",
          function="sglang.kernels.ops.attention.decode_attention.decode_attention_fwd (grouped MLA path, page_size 1)",
          source=SGL_DECODE, produced_by="engine",
          tensors={"q": q, "k_buffer": k_buffer, "kv_indptr": kv_indptr, "kv_indices": kv_indices, "num_kv_splits": num_kv_splits,
                   "o": o, "attn_logits": attn_logits, "attn_lse": attn_lse},
          meta={"kcheck.kernel": "mla_decode", "sm_scale": SCALE, "k_scale": 1.0, "v_scale": 1.0, "max_kv_splits": Smax,
                "v_head_dim": L, "kcheck.corpus.attn_logits_fill": "nan (torch.empty in the engine)"},
          expect={"verdict": "pass"} if fault is None else {"verdict": "fail", "tensor": "o", "stage": None, "signature": "token-level shift in request 0 (kv_indices)"},
          audit=["S5", "gap2", "gap11"], item=3, fault=fault,
          twin=base + (".safetensors" if fault else "_kv_indices_shift.safetensors"), committed=True,
          notes="separate attn_logits [B,H,S,512] and attn_lse [B,H,S]; per-request num_kv_splits [4,4,1] with 32-token rounded splits: "
                "request 0 (300 tokens) splits at 96/192/288, request 1 (40 tokens) at 32 and leaves splits 2-3 unwritten; no final lse")


def build(c):
    sglang_decode(c, None, 1611)
    sglang_decode(c, "kv_indices_shift", 1611)
    triton_mla(c, "bf16", torch.bfloat16, "bf16", None, 1610)
    triton_mla(c, "bf16", torch.bfloat16, "bf16", "block_table_shift", 1610)
    # TRITON_MLA's fp8 cache under a bf16 model (V15) and its fp16 model (V1,
    # F17), small enough to commit (0.6 and 1.1 MB): two requests of 300 and
    # 7 tokens, one split (the bf16 pair above has the unwritten splits).
    # --from vllm declares the kernel's precision (internal/engines
    # tritonMLAPrecision); the twins plant a k_scale the kernel ignored and
    # FlashMLA's default softmax scale.
    for fault in (None, "kv_scale_ignored"):
        triton_mla(c, "fp8_bf16q", torch.bfloat16, "fp8", fault, 1612, lens=(300, 7), committed=True)
    for fault in (None, "softmax_scale_default"):
        triton_mla(c, "fp16", torch.float16, "fp16", fault, 1613, lens=(300, 7), committed=True)
