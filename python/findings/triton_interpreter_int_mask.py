"""Minimal reproduction: Triton's interpreter refuses an integer load mask.

    TRITON_INTERPRET=1 python python/findings/triton_interpreter_int_mask.py

Seen with triton 3.9.0 and torch 2.15.0 (python/requirements.lock), CPU.
A mask `(start + r < n) & (start < n)`, with start a tl.range loop
variable, reaches InterpreterBuilder.create_masked_load
(triton/runtime/interpreter.py) as an int32 array of 0/1 instead of bool,
and the interpreter's C++ load raises "mask has unsupported dtype".
Compiled, the expression is an i1 mask and the kernel runs.

vLLM 0.33.0's _fp8_paged_mqa_logits_decode_kernel
(vllm/v1/attention/ops/rocm_aiter_mla_sparse.py lines 596-597, `mask_pos =
(pos < seq_len) & blk_ok` with blk_ok = logical_blk < max_blocks) builds
exactly this mask, so it cannot run under the interpreter without
kcheck.worker.interp's fix, which passes such a mask on as its truth value.
"""

import os
import sys

if os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("run with TRITON_INTERPRET=1")

import torch
import triton
import triton.language as tl
from triton.runtime import interpreter as ti


@triton.jit
def copy(x_ptr, y_ptr, n, N: tl.constexpr):
    r = tl.arange(0, N)
    for start in tl.range(0, n, N):
        m = (start + r < n) & (start < n)
        tl.store(y_ptr + start + r, tl.load(x_ptr + start + r, mask=m, other=0.0), mask=m)


seen = []
orig = ti.InterpreterBuilder.create_masked_load


def spy(self, ptrs, mask, other, cache_policy, is_volatile):
    seen.append(mask.data.dtype)
    return orig(self, ptrs, mask, other, cache_policy, is_volatile)


ti.InterpreterBuilder.create_masked_load = spy
x = torch.arange(8, dtype=torch.float32)
y = torch.zeros(8)
try:
    copy[(1,)](x, y, 6, 8)
    print("ran:", y.tolist())
except Exception as e:
    print(f"interpreter error: {e}")
print("mask dtype reaching create_masked_load:", ", ".join(str(d) for d in seen))
