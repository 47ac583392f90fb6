"""Merge partials in the engines' own dtypes and layouts (issue 16 item 3;
audit V12, I7, S4, gap 4): engine code, run by Triton's interpreter."""

import math

import torch

from kcheck.corpus import run

LN2 = math.log(2.0)
VLLM_MERGE = "vllm/v1/attention/ops/triton_merge_attn_states.py@0.33.0:14-71 (merge_attn_states), :73-215 (kernel: +inf->-inf :163-164, both-empty out 0 / lse -inf :178,:209, copy past prefill_tokens_with_context :106-143)"
VLLM_DISPATCH = "vllm/v1/attention/ops/merge_attn_states.py@0.33.0:84-205 (the CUDA op on CUDA, torch on CPU, this Triton kernel elsewhere)"
FI_MERGE = "flashinfer/triton/kernels/cascade.py@0.7.2.post1:100-131 (merge_states_kernel; state starts m=-5e4, d=1 :115), wrapper flashinfer/triton/cascade.py:86-115"
SGL_MERGE = "sglang/kernels/ops/attention/merge_state.py@0.5.23:66-96 (merge_state_triton; lse [T, H] :25-26; no both-empty guard :27-37, :56-58)"


def _states(g, T, H, D, dtype):
    po = (torch.randn(T, H, D, generator=g) * 2).to(dtype)
    so = (torch.randn(T, H, D, generator=g) * 2).to(dtype)
    pl = torch.randn(H, T, generator=g) * 3 + 4
    sl = torch.randn(H, T, generator=g) * 3 + 4
    return po, pl, so, sl


def vllm_merge(c, dtype, name, fault, seed):
    mod, shim = run.vllm_module("vllm.v1.attention.ops.triton_merge_attn_states")
    g = torch.Generator().manual_seed(seed)
    T, H, D, ptc = 8, 4, 128, 6
    po, pl, so, sl = _states(g, T, H, D, dtype)
    pl[1, 2] = math.inf      # an FA2-style empty prefix (+inf), read as -inf
    pl[2, 3] = -math.inf     # both sides empty: out 0, lse -inf
    sl[2, 3] = -math.inf
    pl[0, 4] = -math.inf     # empty prefix only: the suffix is copied
    feed_po, feed_pl, feed_so, feed_sl = po, pl, so, sl
    if fault == "both_empty_nan":
        return vllm_merge_unguarded(c, dtype, name, po, pl, so, sl)
    if fault == "lse_base_mixed":
        # a caller that hands the kernel base-2 partial lses
        feed_pl, feed_sl = pl / LN2, sl / LN2
    elif fault == "prefix_suffix_swapped":
        feed_po, feed_so = so, po
    out = torch.empty(T, H, D, dtype=dtype)
    out_lse = torch.empty(H, T)
    mod.merge_attn_states(out, feed_po, feed_pl, feed_so, feed_sl, out_lse, prefill_tokens_with_context=ptc)
    tensors = {"output": out, "prefix_output": po, "prefix_lse": pl, "suffix_output": so, "suffix_lse": sl, "output_lse": out_lse}
    meta = {"kcheck.kernel": "splitk_combine", "prefill_tokens_with_context": ptc, "kcheck.corpus.shim": shim or ""}
    base = f"vllm/merge_attn_states_{name}"
    if fault is None:
        expect = {"verdict": "pass"}
    elif fault == "lse_base_mixed":
        expect = {"verdict": "fail", "tensor": "output", "stage": None, "signature": "lse_base_mixed"}
    else:
        expect = {"verdict": "fail", "tensor": "output", "stage": None, "signature": "prefix and suffix weights exchanged: output fails, output_lse passes (lse is symmetric)"}
    c.add(f"{base}{'_' + fault if fault else ''}.safetensors", engine="vllm", from_engine="vllm",
          kernel="splitk_combine", function="vllm.v1.attention.ops.triton_merge_attn_states.merge_attn_states",
          source=VLLM_MERGE + "; " + VLLM_DISPATCH, produced_by="engine", tensors=tensors, meta=meta,
          expect=expect, audit=["V12", "S4", "gap4", "gap11"], item=3, fault=fault,
          twin=f"{base}.safetensors" if fault else f"{base}_{'lse_base_mixed' if dtype == torch.bfloat16 else 'prefix_suffix_swapped'}.safetensors",
          committed=True,
          notes=f"{dtype} partials [T,H,D], lse [H,T] f32; prefill_tokens_with_context={ptc} of T={T} (tokens 6,7 are copies of the suffix); "
                "token 2 head 1 prefix lse +inf (FA2 empty, read as -inf); token 3 head 2 both empty (this Triton kernel: out 0, lse -inf; "
                "the audit's CUDA kernel @03f97cce copies prefix_output instead)")


def vllm_merge_unguarded(c, dtype, name, po, pl, so, sl):
    """The planted fault of a merge without vLLM's both-empty guard (vLLM
    0.33.0 triton_merge_attn_states.py :176-178, :207-209): SGLang's
    merge_state_triton, the same formula with no guard, run on the same
    states (its lse [T, H], so fed transposed) and recorded under vLLM's
    names. Without prefill_tokens_with_context (SGLang has none), so every
    token is merged; the both-empty row (token 3, head 2) holds NaN where
    vLLM writes out 0, lse -inf."""
    run.interpreter()
    from sglang.kernels.ops.attention.merge_state import merge_state_triton

    out, lse_th = merge_state_triton(po, pl.T.contiguous(), so, sl.T.contiguous())
    base = f"vllm/merge_attn_states_{name}"
    c.add(f"{base}_both_empty_nan.safetensors", engine="vllm", from_engine="vllm",
          kernel="splitk_combine", function="sglang.kernels.ops.attention.merge_state.merge_state_triton (unguarded), recorded as vLLM's merge_attn_states",
          source=SGL_MERGE + "; the guard it lacks: " + VLLM_MERGE, produced_by="engine",
          tensors={"output": out, "prefix_output": po, "prefix_lse": pl, "suffix_output": so, "suffix_lse": sl,
                   "output_lse": lse_th.T.contiguous()},
          meta={"kcheck.kernel": "splitk_combine"},
          expect={"verdict": "fail", "tensor": "output", "stage": None, "signature": "NaN on the both-empty row only (token 3, head 2): vLLM writes out 0, lse -inf"},
          audit=["V12", "S4", "gap11"], item=3, fault="both_empty_nan", twin=f"{base}.safetensors", committed=True,
          notes="same states as the passing capture, merged by a merge with no both-empty guard")


def flashinfer_merge(c, fault, seed):
    mod = run.flashinfer_cascade()
    run.interpreter()
    g = torch.Generator().manual_seed(seed)
    T, S, H, D = 5, 3, 2, 64
    v = (torch.randn(T, S, H, D, generator=g) * 2).bfloat16()
    s = torch.randn(T, S, H, generator=g) * 3 + 4
    s[1, 2, 0] = -math.inf          # one empty index set
    s[3, :, 1] = -math.inf          # a row with every set empty
    feed = s * LN2 if fault == "lse_base_mixed" else s   # natural-log lses handed to a base-2 merge
    vm = torch.empty(T, H, D, dtype=v.dtype)
    sm = torch.empty(T, H)
    mod.merge_states_kernel[(T,)](v, feed, vm, sm, S, H, D, bdx=D, bdy=H)
    base = "flashinfer/merge_states_bf16"
    c.add(f"{base}{'_' + fault if fault else ''}.safetensors", engine="flashinfer", from_engine="flashinfer",
          kernel="splitk_combine", function="flashinfer/triton/kernels/cascade.py merge_states_kernel (loaded by path, launched as flashinfer.triton.cascade.merge_states does)",
          source=FI_MERGE, produced_by="engine",
          tensors={"v": v, "s": s, "v_merged": vm, "s_merged": sm},
          # the Triton kernel's empty state, m = -5e4, d = 1 (:115), stored as m + log2(d) (:20-21)
          meta={"kcheck.kernel": "splitk_combine", "lse_empty": "-50000"},
          expect={"verdict": "pass"} if fault is None else {"verdict": "fail", "tensor": "v_merged", "stage": None, "signature": "lse_base_mixed"},
          audit=["I7", "gap4", "gap11"], item=3, fault=fault,
          twin=base + (".safetensors" if fault else "_lse_base_mixed.safetensors"), committed=True,
          notes="v [T,S,H,D] bf16 and v_merged bf16 (v's dtype), s [T,S,H] f32 base 2; token 3 head 1 has every set empty: this Triton "
                "kernel starts its state at m=-5e4, d=1, so it writes v_merged 0 and s_merged -50000 (not -inf): declared as lse_empty = -50000")


def sglang_merge(c, fault, seed):
    run.interpreter()
    from sglang.kernels.ops.attention.merge_state import merge_state_triton

    g = torch.Generator().manual_seed(seed)
    T, H, D = 6, 4, 128
    po, pl, so, sl = _states(g, T, H, D, torch.bfloat16)
    pl, sl = pl.T.contiguous(), sl.T.contiguous()   # SGLang: [T, H]
    pl[2, 1] = -math.inf     # one empty state
    pl[4, 3] = -math.inf     # both empty: no guard, NaN in out and lse (:27-37, :56-58)
    sl[4, 3] = -math.inf
    feed_pl, feed_sl = pl, sl
    if fault == "lse_layout_h_t":
        # a caller laying the lses out [H, T] (the older merge_state_v2 CUDA layout) in a [T, H] buffer
        feed_pl = pl.T.contiguous().reshape(T, H)
        feed_sl = sl.T.contiguous().reshape(T, H)
    out, out_lse = merge_state_triton(po, feed_pl, so, feed_sl)
    base = "sglang/merge_state_bf16"
    c.add(f"{base}{'_' + fault if fault else ''}.safetensors", engine="sglang", from_engine="sglang",
          kernel="splitk_combine", function="sglang.kernels.ops.attention.merge_state.merge_state_triton",
          source=SGL_MERGE, produced_by="engine",
          tensors={"prefix_output": po, "prefix_lse": pl, "suffix_output": so, "suffix_lse": sl, "output": out, "output_lse": out_lse},
          meta={"kcheck.kernel": "splitk_combine"},
          expect={"verdict": "pass"} if fault is None else {"verdict": "fail", "tensor": "output", "stage": None, "signature": "lse read transposed ([H,T] vs [T,H]): errors along heads and tokens"},
          audit=["S4", "gap4"], item=3, fault=fault,
          twin=base + (".safetensors" if fault else "_lse_layout_h_t.safetensors"), committed=True,
          notes="outputs [T,H,D] bf16, lse [T,H] f32 base e (merge_state_kernel indexes token*num_heads+head); token 4 head 3 has "
                "both states empty: NaN, as the engine writes it (--from sglang's empty_row = nan)")


def build(c):
    vllm_merge(c, torch.bfloat16, "bf16", None, 1601)
    vllm_merge(c, torch.bfloat16, "bf16", "lse_base_mixed", 1601)
    vllm_merge(c, torch.bfloat16, "bf16", "both_empty_nan", 1601)
    vllm_merge(c, torch.float16, "fp16", None, 1602)
    vllm_merge(c, torch.float16, "fp16", "prefix_suffix_swapped", 1602)
    flashinfer_merge(c, None, 1603)
    flashinfer_merge(c, "lse_base_mixed", 1603)
    sglang_merge(c, None, 1604)
    sglang_merge(c, "lse_layout_h_t", 1604)
