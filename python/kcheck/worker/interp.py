"""Four fixes for Triton's interpreter, applied only when it runs the kernels.

Triton 3.9's interpreter stores bfloat16 as its raw 16 bits in uint16
arrays (triton/runtime/interpreter.py, the `tl.bfloat16: np.uint16`
storage map) and InterpreterBuilder.create_dot converts only 8-bit floats
before np.matmul, so `tl.dot` of two bf16 blocks multiplies the raw bit
patterns as integers: every bf16 dot is garbage (python/findings/
triton_interpreter_bf16_dot.py reproduces it in a few lines; fp32 and fp16
dots are right). The shim widens a bf16 operand to float32 before the
original create_dot: exact (a bf16 value is the top half of its float32),
and what the GPU's bf16 MMA does (exact products, fp32 accumulation). It
changes nothing for any other dtype, and is not applied on a GPU.

Its float downcasts go through _convert_float, which is wrong twice:

- float32 -> bfloat16: InterpreterBuilder.cast_impl, the path of both
  `x.to(tl.bfloat16)` and a store of fp32 values into a bf16 tensor, calls
  it with no rounding mode, so the value is truncated toward zero: about
  half of all values come out one bf16 ulp low in magnitude
  (python/findings/triton_interpreter_bf16_cast.py). The GPU rounds to
  nearest even (cvt.rn.bf16.f32). A kernel that rounds P or a dequantized
  cache row to bf16 (vLLM's TRITON_MLA decode does both) is biased under
  the interpreter by up to one bf16 ulp per value.
- float32 -> fp8: its "round to nearest even" adds the first cut-off bit
  (ties round away, not to even) and the carry out of a full mantissa is
  masked off instead of raising the exponent, so float32 7.9 becomes e4m3
  4.0 and 1.0625 becomes 1.125 (python/findings/triton_interpreter_fp8_cast.py).

A load or store mask built as `(tensor < n) & ok`, with ok a comparison
of a `tl.range` loop variable (vLLM's _fp8_paged_mqa_logits_decode_kernel,
rocm_aiter_mla_sparse.py lines 596-597, `mask_pos = (pos < seq_len) &
blk_ok`), reaches InterpreterBuilder.create_masked_load as an int32 array
of 0/1, and the interpreter's C++ load refuses it ("mask has unsupported
dtype"; python/findings/triton_interpreter_int_mask.py). Compiled, the same
expression is an i1 mask. The shim passes such a mask on as its truth value
(`mask != 0`), which is what the compiled i1 holds.

The shim converts float32/float16/bfloat16 to a narrower bfloat16, float16,
float8e4nv or float8e5 with torch's round-to-nearest-even, after saturating
to the format's largest finite value for the fp8 formats (what the GPU's
cvt.rn.satfinite does for Triton's `.to(fp8)`); a conversion asked for
toward zero (rounding mode RTZ) and every other conversion is the
interpreter's own.
"""

import numpy as np

NOTE = ("triton interpreter: bf16 tl.dot operands widened exactly to fp32 (create_dot multiplies raw bf16 bits otherwise; "
        "python/findings/triton_interpreter_bf16_dot.py); integer 0/1 load/store masks passed as their truth value "
        "(python/findings/triton_interpreter_int_mask.py); downcasts to bf16, f16 and fp8 by torch's RTNE, fp8 after saturation "
        "(_convert_float truncates fp32 to bf16 and drops the fp8 mantissa carry; python/findings/triton_interpreter_bf16_cast.py, "
        "python/findings/triton_interpreter_fp8_cast.py)")

# The casts the probe and the fix cover, as torch dtype names.
CAST_TARGETS = ("bfloat16", "float8_e4m3fn")

_applied = False


def _bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def apply():
    """Install the fixes once; returns the note to record, or None when the
    interpreter already gets bf16 dots and every probed downcast right (a
    fixed Triton)."""
    global _applied
    import triton.language as tl
    from triton.runtime import interpreter as ti

    if _applied:
        return NOTE
    fix_dot = needed()
    fix_cast = any(cast_error(t) > 0 for t in CAST_TARGETS)
    fix_mask = mask_error()
    if not (fix_dot or fix_cast or fix_mask):
        return None
    orig = ti.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar == tl.bfloat16 or b.dtype.scalar == tl.bfloat16:
            wa = ti.TensorHandle(_bf16_to_f32(a.data) if a.dtype.scalar == tl.bfloat16 else a.data.astype(np.float32), tl.float32)
            wb = ti.TensorHandle(_bf16_to_f32(b.data) if b.dtype.scalar == tl.bfloat16 else b.data.astype(np.float32), tl.float32)
            return orig(self, wa, wb, d, input_precision, max_num_imprecise_acc)
        return orig(self, a, b, d, input_precision, max_num_imprecise_acc)

    if fix_dot:
        ti.InterpreterBuilder.create_dot = create_dot
    if fix_cast:
        _patch_float_cast(ti, tl)
    if fix_mask:
        _patch_int_mask(ti, tl)
    _applied = True
    return NOTE


def _patch_float_cast(ti, tl):
    import torch

    orig = ti._convert_float
    wide = {tl.float32: torch.float32, tl.float16: torch.float16, tl.bfloat16: torch.bfloat16}
    # target -> (torch dtype, saturation bound; None: overflow goes to inf, as cvt.rn does)
    narrow = {
        tl.bfloat16: (torch.bfloat16, None),
        tl.float16: (torch.float16, None),
        tl.float8e4nv: (torch.float8_e4m3fn, 448.0),
        tl.float8e5: (torch.float8_e5m2, 57344.0),
    }

    def convert(input, input_dtype, output_dtype, rounding_mode):
        rtz = rounding_mode is not None and rounding_mode != ti._ir.ROUNDING_MODE.RTNE
        if (input_dtype in wide and output_dtype in narrow and input_dtype != output_dtype and not rtz
                and input_dtype.primitive_bitwidth >= output_dtype.primitive_bitwidth):
            src_t, (dst_t, mx) = wide[input_dtype], narrow[output_dtype]
            in_bits, out_bits = input_dtype.primitive_bitwidth, output_dtype.primitive_bitwidth
            raw = np.ascontiguousarray(input).view(getattr(np, f"uint{in_bits}")).view(getattr(np, f"int{in_bits}"))
            w = torch.from_numpy(raw.copy()).view(src_t).float()
            if mx is not None:
                w = w.clamp(-mx, mx)
            out = w.to(dst_t).view(torch.uint8 if out_bits == 8 else torch.int16).numpy()
            return out.view(getattr(np, f"uint{out_bits}")).reshape(np.shape(input))
        return orig(input, input_dtype, output_dtype, rounding_mode)

    ti._convert_float = convert


def _patch_int_mask(ti, tl):
    load, store = ti.InterpreterBuilder.create_masked_load, ti.InterpreterBuilder.create_masked_store

    def truth(mask):
        if mask.data.dtype != np.bool_ and np.issubdtype(mask.data.dtype, np.integer):
            return ti.TensorHandle(mask.data != 0, tl.int1)
        return mask

    def create_masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
        return load(self, ptrs, truth(mask), other, cache_policy, is_volatile)

    def create_masked_store(self, ptrs, value, mask, cache_policy):
        return store(self, ptrs, value, truth(mask), cache_policy)

    ti.InterpreterBuilder.create_masked_load = create_masked_load
    ti.InterpreterBuilder.create_masked_store = create_masked_store


def mask_error():
    """Whether the interpreter refuses a mask `(r < n) & (i < n)` with i a
    tl.range loop variable: the probe `apply` and the test use."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _copy(x_ptr, y_ptr, n, N: tl.constexpr):
        r = tl.arange(0, N)
        for start in tl.range(0, n, N):
            m = (start + r < n) & (start < n)
            tl.store(y_ptr + start + r, tl.load(x_ptr + start + r, mask=m, other=0.0), mask=m)

    x = torch.arange(8, dtype=torch.float32)
    y = torch.zeros(8)
    try:
        _copy[(1,)](x, y, 6, 8)
    except Exception:
        return True
    return y.tolist() != [0, 1, 2, 3, 4, 5, 0, 0]


def cast_error(target="float8_e4m3fn"):
    """How many of a sweep of float32 values the interpreter's `.to(target)`
    rounds differently from torch (after saturation, for fp8): the probe
    `apply` and the test use. target is a torch dtype name of CAST_TARGETS."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _cast(x_ptr, y_ptr, N: tl.constexpr):
        r = tl.arange(0, N)
        tl.store(y_ptr + r, tl.load(x_ptr + r).to(y_ptr.dtype.element_ty))

    dt = getattr(torch, target)
    if dt == torch.float8_e4m3fn:
        x = torch.linspace(-500, 500, 4096)
        want = x.clamp(-448, 448).to(dt)
    else:
        x = torch.randn(4096, generator=torch.Generator().manual_seed(1))
        want = x.to(dt)
    y = torch.zeros(4096, dtype=dt)
    _cast[(1,)](x, y, 4096)
    bits = torch.uint8 if dt.itemsize == 1 else torch.int16
    return int((y.view(bits) != want.view(bits)).sum())


def dot_error(dtype_name="bfloat16", n=16):
    """Max |tl.dot(a, b) - a@b| of one small block product under the
    interpreter: the probe `needed` uses and the test checks."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _dot(a_ptr, b_ptr, c_ptr, N: tl.constexpr):
        r = tl.arange(0, N)
        a = tl.load(a_ptr + r[:, None] * N + r[None, :])
        b = tl.load(b_ptr + r[:, None] * N + r[None, :])
        tl.store(c_ptr + r[:, None] * N + r[None, :], tl.dot(a, b))

    g = torch.Generator().manual_seed(0)
    dt = getattr(torch, dtype_name)
    a = torch.randn(n, n, generator=g).to(dt)
    b = torch.randn(n, n, generator=g).to(dt)
    c = torch.zeros(n, n)
    _dot[(1,)](a, b, c, n)
    return (c - a.float() @ b.float()).abs().max().item()


def needed():
    return not dot_error() < 1e-3
