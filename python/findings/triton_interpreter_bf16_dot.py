"""Minimal reproduction: Triton's interpreter computes bf16 tl.dot wrong.

    TRITON_INTERPRET=1 python python/findings/triton_interpreter_bf16_dot.py

Seen with triton 3.9.0 and torch 2.15.0 (python/requirements.lock), CPU:
fp32 and fp16 dots agree with torch to ~1e-6; the bf16 dot is off by ~1e10,
because InterpreterBuilder.create_dot (triton/runtime/interpreter.py) runs
np.matmul on the uint16 arrays the interpreter stores bf16 in, converting
only 8-bit float operands first. Every Triton kernel with a bf16 tl.dot
(vLLM's TRITON_MLA decode, SGLang's decode) is therefore wrong under the
interpreter; kcheck's workers apply kcheck.worker.interp's fix and say so.
"""

import os
import sys

if os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("run with TRITON_INTERPRET=1")

import torch
import triton
import triton.language as tl


@triton.jit
def dot(a_ptr, b_ptr, c_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    a = tl.load(a_ptr + r[:, None] * N + r[None, :])
    b = tl.load(b_ptr + r[:, None] * N + r[None, :])
    tl.store(c_ptr + r[:, None] * N + r[None, :], tl.dot(a, b))


N = 16
torch.manual_seed(0)
for dt in (torch.float32, torch.float16, torch.bfloat16):
    a, b = torch.randn(N, N).to(dt), torch.randn(N, N).to(dt)
    c = torch.zeros(N, N)
    dot[(1,)](a, b, c, N)
    print(f"{str(dt):15} max |tl.dot - torch| = {(c - a.float() @ b.float()).abs().max().item():.3g}")
