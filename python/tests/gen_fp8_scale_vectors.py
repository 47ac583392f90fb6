"""Writes reference/kvcache/testdata/fp8_scale_dequant.json: every E4M3 code
dequantized by torch (on the CPU) the two ways FlashInfer's FP8 MLA kernels
do it (flashinfer-python 0.7.2.post1,
flashinfer/data/include/flashinfer/attention/mla.cuh:312-377 and
mla_hopper.cuh:353-436), so that kcheck's fp8_e4m3 reader with Scales
(reference/kvcache/scales.go) is checked against arithmetic it did not come
from:

- bf16_scale: a per-tensor scale (ckv_scale, kpe_scale) is cast to bf16 and
  the code, cast to bf16, is multiplied by it in bf16 (__hmul2 on bf16
  pairs); torch's CPU bf16 multiply rounds the product once to bf16, as
  __hmul2 does.
- f32_product: a per-tile scale (ckv_scale_arr) multiplies the code in fp32
  and the product is cast to bf16.

Nothing of FlashInfer is copied or imported: the two lines the kernels
compute are restated in torch below.

    /work/main/python/.venv/bin/python python/tests/gen_fp8_scale_vectors.py
"""

import json
import os
import struct

import torch

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "reference", "kvcache", "testdata", "fp8_scale_dequant.json")

# Scales whose bf16 rounding matters: an arbitrary calibration value, a tie
# (1 + 2^-8 rounds to even, 1), one that rounds up (1 + 3*2^-9 -> 1 + 2^-7),
# an amax/448 quotient, a power of two (exact in bf16) and a tiny one.
SCALES = [0.0173, 1 + 2**-8, 1 + 3 * 2**-9, 2.7 / 448, 0.03125, 3.1e-5]


def bits16(t: torch.Tensor) -> list:
    return [int(v) for v in t.view(torch.int16).to(torch.int32).bitwise_and(0xFFFF)]


def main() -> None:
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    cases = []
    for s in SCALES:
        s32 = torch.tensor(s, dtype=torch.float32)  # the binding's static_cast<float>(double)
        hmul = codes.to(torch.bfloat16) * s32.to(torch.bfloat16)
        f32p = (codes.to(torch.float32) * s32).to(torch.bfloat16)
        f32_bits = struct.unpack("<I", struct.pack("<f", float(s32)))[0]
        cases.append({"scale_f32_bits": f32_bits, "mode": "bf16_scale", "bf16_bits": bits16(hmul)})
        cases.append({"scale_f32_bits": f32_bits, "mode": "f32_product", "bf16_bits": bits16(f32p)})
    doc = {"source": "python/tests/gen_fp8_scale_vectors.py", "torch": torch.__version__, "cases": cases}
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=None, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
