"""Writes reference/mla/testdata/flashmla_ref_model1.json: a DeepSeek-V4 sparse
decode over a MODEL1 (fp8_ds_mla_model1) cache, its answer computed by
FlashMLA's own reference, ref_sparse_attn_decode of tests/ref.py, over the
cache as FlashMLA's tests/quant.py quantizes and dequantizes it
(reference/mla/model1_ref_test.go holds kcheck's sparse decode, V = the whole
512-dim row, to it).

FlashMLA's files are imported from the directory given, never copied here:

    mkdir -p /tmp/flashmla
    for f in quant.py ref.py; do git -C <FlashMLA clone> show 9241ae3e:tests/$f > /tmp/flashmla/$f; done
    python/.venv/bin/python python/tests/gen_model1_ref_vectors.py /tmp/flashmla 9241ae3e

ref.py imports its test harness's types from tests/lib.py, which needs the
compiled flash_mla package; ref_sparse_attn_decode only reads attributes of
its arguments, so a stand-in lib module and SimpleNamespace arguments do.
"""

import json
import os
import sys
import types

import torch

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "reference", "mla", "testdata", "flashmla_ref_model1.json")

NB, P, H, D, TOPK = 3, 8, 4, 512, 12


def hexbytes(t):
    return t.reshape(-1).clone().view(torch.uint8).numpy().tobytes().hex()


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: gen_model1_ref_vectors.py FLASHMLA_TESTS_DIR FLASHMLA_COMMIT")
    sys.path.insert(0, sys.argv[1])
    lib = types.ModuleType("lib")
    for name in ("TestParam", "Testcase", "TestcaseForDecode", "KVScope"):
        setattr(lib, name, object)
    sys.modules["lib"] = lib
    import quant
    import ref

    g = torch.Generator().manual_seed(20261203)
    k = torch.randn(NB, P, 1, D, generator=g)
    k[..., :448] *= torch.pow(2.0, torch.randint(-6, 4, (NB, P, 1, 7), generator=g).float()).repeat_interleave(64, dim=-1)
    k = k.to(torch.bfloat16)
    lay = quant.FP8KVCacheLayout.MODEL1_FP8Sparse
    cache = quant.quantize_k_cache(k, lay)  # [NB, P, 1, 584], block-split
    cache = cache.contiguous().view(torch.uint8).view(NB, P * 584).clone()
    cache[:, P * 576 + 7::8] = 0  # the pad bytes quant.py leaves unwritten
    blocked_k = quant.dequantize_k_cache(cache.view(NB, P, 1, 584).view(torch.float8_e4m3fn), lay)
    q = (0.5 * torch.randn(1, 1, H, D, generator=g)).to(torch.bfloat16)
    idx = torch.randperm(NB * P, generator=g)[:TOPK].to(torch.int32)
    idx[-3:] = -1  # FlashMLA's only invalid index
    idx = idx.view(1, 1, TOPK)
    sm_scale = D ** -0.5
    p = types.SimpleNamespace(h_kv=1, decode=types.SimpleNamespace(b=1), s_q=1, d_qk=D, h_q=H, d_v=D)
    t = types.SimpleNamespace(kv_scope=types.SimpleNamespace(indices_in_kvcache=idx, blocked_k=blocked_k, topk_length=None),
                              extra_kv_scope=None, q=q, sm_scale=sm_scale, attn_sink=None)
    out, lse = ref.ref_sparse_attn_decode(p, t)  # out bf16 [1, 1, H, D], lse f32 [1, H, 1]
    doc = {
        "source": "deepseek-ai/FlashMLA@" + sys.argv[2] + " tests/ref.py ref_sparse_attn_decode over tests/quant.py's MODEL1 cache",
        "torch": torch.__version__,
        "num_blocks": NB, "page_size": P, "heads": H, "dim": D, "topk": TOPK, "softmax_scale": sm_scale,
        "q_bf16": hexbytes(q),
        "cache_u8": hexbytes(cache),
        "indices_i32": hexbytes(idx),
        "out_bf16": hexbytes(out),
        "lse_f32": hexbytes(lse.float()),
    }
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
