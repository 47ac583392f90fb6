"""Writes reference/kvcache/testdata/flashmla_model1.json: a small DeepSeek-V4
(FlashMLA "MODEL1") sparse KV cache quantized and dequantized by FlashMLA's own
tests/quant.py, so that kcheck's writer and reader of the fp8_ds_mla_model1
layout are checked against code they did not come from
(reference/kvcache/model1_test.go).

FlashMLA's file is imported from the directory given on the command line, never
copied into this repository:

    git -C <FlashMLA clone> show 9241ae3e:tests/quant.py > /tmp/flashmla/quant.py
    python/.venv/bin/python python/tests/gen_model1_vectors.py /tmp/flashmla 9241ae3e

quantize_k_cache allocates the cache with torch.empty and never writes a
token's eighth scale byte (the pad): the saved copy zeroes those bytes (vLLM's
writer stores 0 there), so the file does not depend on leftover memory. The
cache is saved as torch's .contiguous() copy of quant.py's [NB, P, 1, 584] view,
which is what kcheck's capture hook records: each block's bytes in FlashMLA's
block-split order (P data rows of 576 bytes, then P scale rows of 8), without the
block stride's padding to a multiple of 576.
"""

import json
import os
import sys

import torch

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "reference", "kvcache", "testdata", "flashmla_model1.json")

NB, P, D = 2, 3, 512  # an odd page size, as FlashMLA's tests use (block sizes 61, 69)
NOPE, TILE = 448, 64


def make_input() -> torch.Tensor:
    """bf16 [NB, P, 1, D]: each 64-value tile of a token's NoPE part gets its own
    magnitude, so the cache holds tiles whose amax/448 is under quant.py's 1e-4
    floor (and all zeros), tiles whose amax is exactly 448·2^k (the scale is
    then exactly 2^k), and ordinary and large ones; the RoPE part is random."""
    g = torch.Generator().manual_seed(20261202)
    x = torch.randn(NB, P, 1, D, generator=g, dtype=torch.float32)
    mags = [0.0, 1e-6, 3e-3, 0.04, 0.5, 1.0, 7.0, 300.0, 5000.0]
    for b in range(NB):
        for t in range(P):
            for tile in range(NOPE // TILE):
                k = (b * P + t) * 7 + tile
                m = mags[k % len(mags)]
                seg = x[b, t, 0, tile * TILE:(tile + 1) * TILE]
                seg.mul_(m / seg.abs().max())
                if k % 5 == 0 and m > 0:
                    # amax exactly 448·2^j: the scale quotient is a power of two
                    j = int(torch.floor(torch.log2(torch.tensor(m))).item())
                    seg[k % TILE] = -448.0 * 2.0**j
    return x.to(torch.bfloat16)


def hexbytes(t: torch.Tensor) -> str:
    return t.contiguous().view(torch.uint8).flatten().numpy().tobytes().hex()


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: gen_model1_vectors.py FLASHMLA_TESTS_DIR FLASHMLA_COMMIT")
    sys.path.insert(0, sys.argv[1])
    import quant  # FlashMLA tests/quant.py, from the directory given

    x = make_input()
    lay = quant.FP8KVCacheLayout.MODEL1_FP8Sparse
    q = quant.quantize_k_cache(x, lay)  # [NB, P, 1, 584], block-split with a padded block stride
    assert q.shape == (NB, P, 1, 584), q.shape
    cache = q.contiguous().view(torch.uint8).view(NB, P * 584).clone()
    cache[:, P * 576 + 7::8] = 0  # the never-written pad byte of each token's scales
    deq = quant.dequantize_k_cache(cache.view(NB, P, 1, 584).view(torch.float8_e4m3fn), lay)
    doc = {
        "source": "deepseek-ai/FlashMLA@" + sys.argv[2] + " tests/quant.py quantize_k_cache and dequantize_k_cache, FP8KVCacheLayout.MODEL1_FP8Sparse",
        "torch": torch.__version__,
        "num_blocks": NB,
        "page_size": P,
        "dim": D,
        "input_bf16": hexbytes(x),
        "cache_u8": hexbytes(cache),
        "dequant_bf16": hexbytes(deq),
    }
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
