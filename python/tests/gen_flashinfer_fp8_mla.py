"""Writes internal/engines/testdata/flashinfer_fp8_mla_{scale,tiles}.safetensors:
FlashInfer's FP8 MLA decode as FlashInfer's own Python reference computes it
(flashinfer-python 0.7.2.post1, flashinfer/trace/templates/attention.py
_mla_paged_decode_reference, lines 2305-2369), in the names, dtypes and layout
of BatchMLAPagedAttentionWrapper.run (_batch_mla/_wrapper.py:852-876): q_nope
[B, H, 512] and q_pe [B, H, 64] bf16, ckv_cache [NB, P, 512] and kpe_cache
[NB, P, 64] float8_e4m3fn, ckv_scale or ckv_scale_arr [NB, P, 4] and kpe_scale,
the page lists, out [B, H, 512] bf16 and a base-2 lse [B, H].

The kernels themselves are CUDA-only (SM90); this is the one FlashInfer code
path that runs here. It differs from the kernels on purpose-free grounds the
Go test states: it multiplies by the fp32 scales (the kernels hold a
per-tensor scale in bf16) and keeps the dequantized cache in fp32 (the
kernels round it to bf16). The reference is loaded from the installed
package by path (importing flashinfer needs its CUDA JIT); nothing of it is
copied here. It attends whole pages (it ignores kv_len), so every request's
length is a multiple of the page size.

    /work/main/python/.venv/bin/python python/tests/gen_flashinfer_fp8_mla.py
"""

import importlib.util
import os
import sys
import types

import torch
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "internal", "engines", "testdata")

B, H, L, R, P, NB = 2, 16, 512, 64, 8, 16
PAGES = [5, 8]  # seq_lens 40 and 64
SM_SCALE = 0.1352337788608801
CKV_SCALE, KPE_SCALE = 0.0173, 0.0121


def reference():
    root = os.path.join(list(importlib.util.find_spec("flashinfer").submodule_search_locations)[0], "trace")
    for name in ("kcheck_fi_trace", "kcheck_fi_trace.templates"):
        m = types.ModuleType(name)
        m.__path__ = []
        sys.modules[name] = m

    def load(name, path):
        s = importlib.util.spec_from_file_location(name, path)
        m = importlib.util.module_from_spec(s)
        sys.modules[name] = m
        s.loader.exec_module(m)
        return m

    load("kcheck_fi_trace.template", os.path.join(root, "template.py"))
    load("kcheck_fi_trace.templates._init_helpers", os.path.join(root, "templates", "_init_helpers.py"))
    return load("kcheck_fi_trace.templates.attention", os.path.join(root, "templates", "attention.py"))._mla_paged_decode_reference


def cpu(t):
    return t.detach().contiguous().cpu().clone()


def main() -> None:
    ref = reference()
    g = torch.Generator().manual_seed(20261202)
    q_nope = torch.randn(B, H, L, generator=g).to(torch.bfloat16)
    q_pe = torch.randn(B, H, R, generator=g).to(torch.bfloat16)
    chan = 1 + torch.arange(L) % 128 / 64  # channels of different magnitude
    ckv = (torch.randn(NB, P, L, generator=g) * chan).to(torch.bfloat16).float()
    kpe = torch.randn(NB, P, R, generator=g).to(torch.bfloat16).float()
    perm = torch.randperm(NB, generator=g).to(torch.int32)
    kv_indices = perm[: sum(PAGES)]
    kv_indptr = torch.tensor([0, PAGES[0], sum(PAGES)], dtype=torch.int32)
    kv_len = torch.tensor([n * P for n in PAGES], dtype=torch.int32)
    qo_indptr = torch.arange(B + 1, dtype=torch.int32)
    kpe_cache = (kpe / KPE_SCALE).to(torch.float8_e4m3fn)  # torch 2.15 saturates
    common = {"q_nope": q_nope, "q_pe": q_pe, "kpe_cache": kpe_cache, "qo_indptr": qo_indptr,
              "kv_indptr": kv_indptr, "kv_indices": kv_indices, "kv_len_arr": kv_len}
    meta = {"kcheck.format": "1", "kcheck.kernel": "mla_decode", "sm_scale": repr(SM_SCALE), "causal": "false",
            "page_size": str(P), "kpe_scale": repr(KPE_SCALE), "backend": "fa3",
            "source": "flashinfer-python 0.7.2.post1 flashinfer/trace/templates/attention.py:2305-2369 "
                      "_mla_paged_decode_reference (torch " + torch.__version__ + ", CPU)"}

    ckv_cache = (ckv / CKV_SCALE).to(torch.float8_e4m3fn)
    out, lse = ref(q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices, SM_SCALE,
                   ckv_scale=CKV_SCALE, kpe_scale=KPE_SCALE, return_lse=True)
    ts = {**common, "ckv_cache": ckv_cache, "out": out, "lse": lse}
    save_file({k: cpu(v) for k, v in ts.items()}, os.path.join(OUT, "flashinfer_fp8_mla_scale.safetensors"),
              metadata={**meta, "ckv_scale": repr(CKV_SCALE)})

    amax = ckv.reshape(NB, P, L // 128, 128).abs().amax(-1)
    arr = (amax / 448).to(torch.float32)  # a scale per 128 latent channels
    codes = (ckv.reshape(NB, P, L // 128, 128) / arr.unsqueeze(-1)).reshape(NB, P, L).to(torch.float8_e4m3fn)
    out, lse = ref(q_nope, q_pe, codes, kpe_cache, kv_indptr, kv_indices, SM_SCALE,
                   ckv_scale_arr=arr, kpe_scale=KPE_SCALE, return_lse=True)
    ts = {**common, "ckv_cache": codes, "ckv_scale_arr": arr, "out": out, "lse": lse}
    save_file({k: cpu(v) for k, v in ts.items()}, os.path.join(OUT, "flashinfer_fp8_mla_tiles.safetensors"),
              metadata={**meta, "ckv_scale": "None"})


if __name__ == "__main__":
    main()
