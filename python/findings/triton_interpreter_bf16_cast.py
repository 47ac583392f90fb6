"""Minimal reproduction: Triton's interpreter truncates float32 -> bfloat16.

    TRITON_INTERPRET=1 python python/findings/triton_interpreter_bf16_cast.py

Seen with triton 3.9.0 (python/requirements.lock), CPU. `x.to(tl.bfloat16)`
goes through InterpreterBuilder.cast_impl (triton/runtime/interpreter.py),
which calls _convert_float(..., rounding_mode=None): without RTNE the
mantissa is cut, so about half of all values come out one bf16 ulp toward
zero; a GPU (and torch) rounds to nearest even. vLLM's TRITON_MLA stage 1
rounds P this way (`p.to(v.dtype)` before the PV dot), so its split
partials under the interpreter were off by up to one bf16 ulp of each P,
and kcheck failed a healthy decode step (partial_out 2.96x its tolerance)
until python/tests/engine_loop.py fixed the cast.
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
    tl.store(y_ptr + r, tl.load(x_ptr + r).to(tl.bfloat16))


x = torch.rand(4096) * 3
y = torch.zeros(4096, dtype=torch.bfloat16)
cast[(1,)](x, y, 4096)
truncated = (x.view(torch.int32) & ~0xFFFF).view(torch.float32)
print(f"interpreter vs torch round-to-nearest-even: {int((y != x.bfloat16()).sum())} of 4096 differ")
print(f"interpreter vs truncation:                  {int((y.float() != truncated).sum())} of 4096 differ")
