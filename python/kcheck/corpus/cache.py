"""KV-cache writes in the engines' own names and layouts (audit S3, gap 9).

SGLang's MLA pool write, MLATokenToKVPool.set_mla_kv_buffer: the tokens cast
to the pool's dtype by PyTorch (memory_pool.py:5014-5022, done here as those
lines do it: importing memory_pool needs transformers, which the lock does
not install), then the engine's own Triton scatter, set_mla_kv_buffer_triton,
run by Triton's interpreter.
"""

import torch

from kcheck.corpus import run

SGL_POOL = ("sglang/srt/mem_cache/memory_pool.py@0.5.23:5026-5047 (set_mla_kv_buffer), :5014-5024 (PyTorch cast to the pool "
            "dtype, no scale, uint8 view), :4863-4869 (kv_buffer [size + page_size, 1, D]; slot 0 for padded tokens); "
            "sglang/kernels/ops/kvcache/mla_buffer.py@0.5.23:290-309 (set_mla_kv_buffer_triton, reserved_skip_index 0), "
            ":14-84 (kernel: loc == reserved_skip_index not stored :41-44, :80)")


def sglang_pool_write(c, kind, fault, seed):
    run.interpreter()
    from kcheck.worker.sglang import pool_write

    g = torch.Generator().manual_seed(seed)
    size, page, L, R = 40, 1, 512, 64
    T = 7
    dtype, store = {"bf16": (torch.bfloat16, torch.bfloat16), "fp16": (torch.float16, torch.float16),
                    "fp8_e4m3": (torch.float8_e4m3fn, torch.uint8)}[kind]
    # The pool as earlier writes left it (random rows), so that a stray write shows.
    before = (torch.randn(size + page, 1, L + R, generator=g) * 4).to(dtype).view(store)
    nope = (torch.randn(T, 1, L, generator=g) * 3).to(torch.bfloat16)
    rope = (torch.randn(T, 1, R, generator=g) * 3).to(torch.bfloat16)
    if kind == "fp8_e4m3":
        nope[1, 0, :4] = torch.tensor([500.0, -1000.0, 464.0, 470.0])  # past 448: torch 2.15 saturates
    # Token 2 is CUDA-graph padding: SGLang points it at slot 0, which the kernel skips.
    loc = torch.tensor([5, 17, 0, 33, 9, 38, 1], dtype=torch.int64)
    feed = loc
    if fault == "loc_off_by_one":
        feed = torch.where(loc > 0, loc + 1, loc)  # an allocator handing out slot + 1
    buf = before.clone()
    pool_write(buf, feed, nope, rope, dtype, store)  # reserved_skip_index 0, as the pool calls it
    base = f"sglang/pool_write_{kind}"
    meta = {"kcheck.kernel": "kv_cache_write"}
    if kind == "fp8_e4m3":
        meta["kv_cache_dtype"] = "fp8_e4m3"
    c.add(f"{base}{'_' + fault if fault else ''}.safetensors", engine="sglang", from_engine="sglang",
          kernel="kv_cache_write", function="MLATokenToKVPool.set_mla_kv_buffer's cast and set_mla_kv_buffer_triton",
          source=SGL_POOL, produced_by="engine",
          tensors={"kv_buffer_before": before, "kv_buffer": buf, "loc": loc, "cache_k_nope": nope, "cache_k_rope": rope},
          meta=meta,
          expect={"verdict": "pass"} if fault is None else {"verdict": "fail", "tensor": "kv_buffer", "stage": None, "signature": None},
          audit=["S3", "gap9"], item=1, fault=fault,
          twin=None if kind != "fp8_e4m3" else base + (".safetensors" if fault else "_loc_off_by_one.safetensors"), committed=True,
          notes=f"{kind} pool [size + page_size, 1, 576] read as one-token pages; loc 0 (a padded token) is not written; "
                + ("the cast has no scale (k_scale 1) and saturates past 448 at torch 2.15" if kind == "fp8_e4m3" else "the tokens are bf16 cast to the pool dtype"))


def build(c):
    for i, kind in enumerate(("bf16", "fp16", "fp8_e4m3")):
        sglang_pool_write(c, kind, None, 1650 + i)
    sglang_pool_write(c, "fp8_e4m3", "loc_off_by_one", 1652)
