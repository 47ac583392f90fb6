"""Minimal reproduction: Triton's interpreter rounds float32 -> fp8 wrong.

    TRITON_INTERPRET=1 python python/findings/triton_interpreter_fp8_cast.py

Seen with triton 3.9.0 (python/requirements.lock), CPU. _convert_float in
triton/runtime/interpreter.py adds the first cut-off bit ("RTNE") without
ties-to-even and masks off the carry out of a full mantissa instead of
raising the exponent: 7.9 -> 4.0 (torch and the GPU: 8.0), 1.0625 -> 1.125
(1.0, the even neighbour), small values flushed. SGLang's fp8_ds_mla
quantizer (`y_q.to(fp8)`) run under the interpreter writes such codes, so
kcheck's kv_cache_write check failed it (1914 of 178432 bytes) until
kcheck.worker.interp fixed the interpreter.
"""

import os
import sys

if os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("run with TRITON_INTERPRET=1")

import torch
import triton
import triton.language as tl


@triton.jit
def cast(x_ptr, y_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    tl.store(y_ptr + r, tl.load(x_ptr + r).to(y_ptr.dtype.element_ty))


x = torch.tensor([7.9, 7.75, 1.0625, 3.9, 0.001, 0.0039] + [0.0] * 2)
y = torch.zeros(8, dtype=torch.float8_e4m3fn)
cast[(1,)](x, y, 8)
for a, b, c in zip(x.tolist()[:6], y.float().tolist(), x.to(torch.float8_e4m3fn).float().tolist()):
    print(f"{a:<10.6g} interpreter {b:<10.6g} torch {c:<10.6g}{'' if b == c else '   <- differs'}")
