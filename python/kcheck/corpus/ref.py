"""Float64 attention for the captures whose engine kernel is CUDA-only.

A correct kernel of the engine's precision returns these values rounded to
its output dtype; the generator does only that rounding, so such a capture
passes exactly when kcheck models the engine's layout and conventions.
"""

import math

import torch


def attend(q, keys, values, scale, sink=None):
    """q [H, Dk], keys [N, Dk], values [N, Dv] (float64) -> out [H, Dv], lse [H]
    (natural log; -inf and out 0 when N = 0). sink [H]: FlashMLA's attn_sink,
    out scaled by exp(lse) / (exp(lse) + exp(sink)), lse unchanged."""
    H = q.shape[0]
    if keys.shape[0] == 0:
        return torch.zeros(H, values.shape[1], dtype=torch.float64), torch.full((H,), -math.inf, dtype=torch.float64)
    s = (q.double() @ keys.double().T) * scale
    lse = torch.logsumexp(s, dim=1)
    out = torch.softmax(s, dim=1) @ values.double()
    if sink is not None:
        out = out * torch.sigmoid(lse - sink.double()).unsqueeze(1)
    return out, lse


def e4m3(x):
    """Round to E4M3 saturating (the engines' cvt.rn.satfinite); returns the fp8 tensor."""
    return x.float().clamp(-448, 448).to(torch.float8_e4m3fn)


def pow2_scale(amax):
    """2^ceil(log2(max(amax/448, 1e-4))): FlashMLA tests/quant.py and vLLM after PR #49435."""
    return torch.pow(2.0, torch.ceil(torch.log2(torch.clamp_min(amax.float() / 448.0, 1e-4))))


def amax_scale(amax):
    """max(amax/448, FLT_MIN): vLLM's fp8_ds_mla writer before PR #49435."""
    return torch.clamp_min(amax.float() / 448.0, torch.finfo(torch.float32).tiny)


def e8m0_toward_zero(s):
    """FlashMLA sm100's __nv_cvt_float2_to_e8m0x2(..., cudaRoundZero): the largest
    power of two <= s (s > 0)."""
    return torch.pow(2.0, torch.floor(torch.log2(s.double()))).float()
