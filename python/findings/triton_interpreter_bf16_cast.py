"""Minimal reproduction: Triton's interpreter truncates float32 -> bfloat16.

    TRITON_INTERPRET=1 python python/findings/triton_interpreter_bf16_cast.py

Seen with triton 3.9.0 and torch 2.15.0 (python/requirements.lock), CPU.
InterpreterBuilder.cast_impl (triton/runtime/interpreter.py) converts
float32 to bfloat16 with _convert_float(..., rounding_mode=None), which
keeps the top 7 mantissa bits and drops the rest: rounding toward zero.
`x.to(tl.bfloat16)` and a store of float32 values into a bf16 tensor both
take that path. The GPU (cvt.rn.bf16.f32) and torch round to nearest even,
so about half of all values come out one bf16 ulp smaller in magnitude.

What it did to kcheck's judgement of vLLM 0.33.0's TRITON_MLA decode
(vllm/v1/attention/ops/triton_decode_attention.py, _fwd_grouped_kernel_stage1
rounds P with `p.to(v.dtype)` and an fp8 cache row with
`(k.to(tl.float32) * ks).to(q.dtype)`): case
mla_decode/deepseek-v3/tp8/bf16/p16/ctx-P+1 came out inconclusive (out: 7 of
16384 elements up to 1.14x their tolerance, all on head 0) and
mla_decode/deepseek-v3/tp8/fp8_e4m3/p16/ctx-P+1 failed (lse: 2 of 32
elements at 3.99x). With kcheck.worker.interp's fix both pass, the bf16
out bit-identical to kcheck's declared-precision reference (max ulp 0).
The capture tests (python/tests/engine_loop.py) saw the same cast fail a
healthy decode step (partial_out 2.96x its tolerance) before the fix.
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
x = torch.tensor([1.00390625 + 2**-10, 0.998, 1.9999, -1.152360200881958, 3.0, 0.1, 1e-3, 7.0])
y = torch.zeros(8, dtype=torch.bfloat16)
cast[(1,)](x, y, 8)
for a, b, c in zip(x.tolist(), y.float().tolist(), x.to(torch.bfloat16).float().tolist()):
    print(f"{a:<22.17g} interpreter {b:<12.9g} torch {c:<12.9g}{'' if b == c else '   <- differs'}")
