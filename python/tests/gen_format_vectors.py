"""Writes internal/safetensors/testdata/torch_formats.safetensors with
safetensors.torch.save_file: every code of E2M1, E4M3FN, E5M2 and E8M0 with
its value as torch and ml_dtypes decode it, and encode sweeps over every
rounding midpoint (and the float32 neighbours on either side) with the codes
torch and ml_dtypes give (E8M0's with the inputs it has no code for), plus bf16/f16/int32/int64 tensors. The Go test
internal/safetensors/torch_formats_test.go reads it with kcheck's own reader
and compares kcheck's reference/formats with both libraries: a third and
fourth source beside NVIDIA's tables (/work/shared/data).

    python/.venv/bin/python python/tests/gen_format_vectors.py   (make python-vectors)
"""

import os
import sys

import ml_dtypes
import numpy as np
import safetensors
import torch
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "internal", "safetensors", "testdata", "torch_formats.safetensors")


def midpoint_sweep(values):
    """Midpoints between adjacent distinct finite values, and the float32
    values one ulp either side of each (ties and their neighbours)."""
    v = np.unique(values[np.isfinite(values)].astype(np.float64))
    mids = (v[:-1] + v[1:]) / 2
    m32 = mids.astype(np.float32)
    assert np.all(m32.astype(np.float64) == mids), "a midpoint is not a float32"
    up = np.nextafter(m32, np.float32(np.inf))
    down = np.nextafter(m32, np.float32(-np.inf))
    return np.concatenate([m32, up, down, v.astype(np.float32)])


# E8M0 has no sign, zero, infinity or subnormal codes: how an encoder maps
# those inputs is a choice each library makes, so the sweep holds them too
# (zeros, negatives, float32 subnormals around 2^-127 and its midpoints, the
# values past the largest code, infinities and NaN).
E8M0_SPECIALS = np.array(
    [0.0, -0.0, -1.0, -1.5, -3.0, 2.0**-149, 2.0**-128, 1.25 * 2.0**-127, 1.5 * 2.0**-127, 1.75 * 2.0**-127,
     2.0**-126 * 0.6, 1.5 * 2.0**127, 1.75 * 2.0**127, np.finfo(np.float32).max, np.inf, -np.inf, np.nan],
    dtype=np.float32,
)


def main():
    t = {}
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    for name, tdt, mdt in (
        ("e4m3", torch.float8_e4m3fn, ml_dtypes.float8_e4m3fn),
        ("e5m2", torch.float8_e5m2, ml_dtypes.float8_e5m2),
        ("e8m0", torch.float8_e8m0fnu, ml_dtypes.float8_e8m0fnu),
    ):
        as_fmt = codes.clone().view(tdt)
        t[f"{name}_codes"] = as_fmt  # stored in the format's own safetensors dtype
        t[f"{name}_torch"] = as_fmt.float()
        t[f"{name}_mldtypes"] = torch.from_numpy(codes.numpy().view(mdt).astype(np.float32))
        x = midpoint_sweep(t[f"{name}_torch"].numpy())
        if name == "e8m0":
            x = np.concatenate([x, E8M0_SPECIALS])
        t[f"{name}_sweep"] = torch.from_numpy(x)
        t[f"{name}_sweep_torch"] = torch.from_numpy(x).to(tdt).view(torch.uint8)
        t[f"{name}_sweep_mldtypes"] = torch.from_numpy(x.astype(mdt).view(np.uint8))
    # Overflow: what each library does past the largest finite value (the
    # midpoint sweeps stop at it). torch 2.15's float8_e4m3fn saturates finite
    # overflow and infinities to 448 (torch/headeronly/util/Float8_e4m3fn.h,
    # fp8e4m3fn_from_fp32_value), its e5m2 gives inf; ml_dtypes gives NaN/inf.
    over = np.array([448.0, 464.0, np.nextafter(np.float32(464.0), np.float32(np.inf)), 479.0, 480.0, 1000.0, 1e30,
                     57344.0, 61440.0, np.nextafter(np.float32(61440.0), np.float32(np.inf)), 1e6,
                     np.inf, np.nan], dtype=np.float32)
    over = np.concatenate([over, -over])
    for name, tdt, mdt in (("e4m3", torch.float8_e4m3fn, ml_dtypes.float8_e4m3fn),
                           ("e5m2", torch.float8_e5m2, ml_dtypes.float8_e5m2)):
        t[f"{name}_overflow"] = torch.from_numpy(over)
        t[f"{name}_overflow_torch"] = torch.from_numpy(over).to(tdt).view(torch.uint8)
        t[f"{name}_overflow_mldtypes"] = torch.from_numpy(over.astype(mdt).view(np.uint8))
    # E2M1: ml_dtypes' float4_e2m1fn (one code a byte) and packed FP4 (low nibble first).
    c4 = np.arange(16, dtype=np.uint8)
    t["e2m1_codes"] = torch.from_numpy(c4)
    t["e2m1_mldtypes"] = torch.from_numpy(c4.view(ml_dtypes.float4_e2m1fn).astype(np.float32))
    x = midpoint_sweep(t["e2m1_mldtypes"].numpy())
    t["e2m1_sweep"] = torch.from_numpy(x)
    t["e2m1_sweep_mldtypes"] = torch.from_numpy(x.astype(ml_dtypes.float4_e2m1fn).view(np.uint8))
    t["fp4_packed"] = torch.from_numpy((c4[0::2] | (c4[1::2] << 4)).astype(np.uint8))
    g = torch.Generator().manual_seed(14)
    r = torch.randn(64, generator=g) * 100
    t["bf16"], t["bf16_f32"] = r.bfloat16(), r.bfloat16().float()
    t["f16"], t["f16_f32"] = r.half(), r.half().float()
    t["i32"] = torch.arange(-5, 59, dtype=torch.int32) * 65537
    t["i64"] = torch.arange(-5, 59, dtype=torch.int64) * (1 << 40)
    meta = {
        "generator": "python/tests/gen_format_vectors.py",
        "torch": torch.__version__,
        "ml_dtypes": ml_dtypes.__version__,
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
    }
    save_file({k: v.contiguous().clone() for k, v in t.items()}, OUT, metadata=meta)
    print(f"wrote {os.path.normpath(OUT)}: {len(t)} tensors; {meta}", file=sys.stderr)


if __name__ == "__main__":
    main()
