"""Writes reference/mla/testdata/flashmla_ref_model1.json and
flashmla_ref_model1_extra.json: DeepSeek-V4 sparse decodes over MODEL1
(fp8_ds_mla_model1) caches, the second as DeepSeek-V4 runs it (vllm 0.33.0
vllm/models/deepseek_v4/nvidia/flashmla.py:248-263): a sliding-window cache
with topk_length and an attention sink, and a compressed cache as the extra
KV scope with its own page size, indices and extra_topk_length. The answers
are computed by
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

TESTDATA = os.path.join(os.path.dirname(__file__), "..", "..", "reference", "mla", "testdata")

NB, P, H, D, TOPK = 3, 8, 4, 512, 12
XNB, XP, XTOPK = 4, 2, 6  # the extra scope: pages of 2 tokens, as FlashMLA's tests try


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
    lay = quant.FP8KVCacheLayout.MODEL1_FP8Sparse

    def model1_cache(nb, p):
        """A MODEL1 cache of nb blocks of p tokens as quant.py writes it, and
        its rows as quant.py reads them back."""
        k = torch.randn(nb, p, 1, D, generator=g)
        k[..., :448] *= torch.pow(2.0, torch.randint(-6, 4, (nb, p, 1, 7), generator=g).float()).repeat_interleave(64, dim=-1)
        cache = quant.quantize_k_cache(k.to(torch.bfloat16), lay)  # [nb, p, 1, 584], block-split
        cache = cache.contiguous().view(torch.uint8).view(nb, p * 584).clone()
        cache[:, p * 576 + 7::8] = 0  # the pad bytes quant.py leaves unwritten
        return cache, quant.dequantize_k_cache(cache.view(nb, p, 1, 584).view(torch.float8_e4m3fn), lay)

    def indices(n, topk, invalid):
        idx = torch.randperm(n, generator=g)[:topk].to(torch.int32)
        idx[topk - invalid:] = -1  # FlashMLA's only invalid index
        return idx.view(1, 1, topk)

    sm_scale = D ** -0.5
    p = types.SimpleNamespace(h_kv=1, decode=types.SimpleNamespace(b=1), s_q=1, d_qk=D, h_q=H, d_v=D)
    cache, blocked_k = model1_cache(NB, P)
    q = (0.5 * torch.randn(1, 1, H, D, generator=g)).to(torch.bfloat16)
    idx = indices(NB * P, TOPK, 3)
    base = {"source": "deepseek-ai/FlashMLA@" + sys.argv[2] + " tests/ref.py ref_sparse_attn_decode over tests/quant.py's MODEL1 caches",
            "torch": torch.__version__, "num_blocks": NB, "page_size": P, "heads": H, "dim": D, "topk": TOPK,
            "softmax_scale": sm_scale, "q_bf16": hexbytes(q), "cache_u8": hexbytes(cache), "indices_i32": hexbytes(idx)}

    t = types.SimpleNamespace(kv_scope=types.SimpleNamespace(indices_in_kvcache=idx, blocked_k=blocked_k, topk_length=None),
                              extra_kv_scope=None, q=q, sm_scale=sm_scale, attn_sink=None)
    out, lse = ref.ref_sparse_attn_decode(p, t)  # out bf16 [1, 1, H, D], lse f32 [1, H, 1]
    write("flashmla_ref_model1.json", dict(base, out_bf16=hexbytes(out), lse_f32=hexbytes(lse.float())))

    xcache, xblocked = model1_cache(XNB, XP)
    xidx = indices(XNB * XP, XTOPK, 1)
    topk_length = torch.tensor([TOPK - 5], dtype=torch.int32)  # drops two valid slots too
    xtopk_length = torch.tensor([XTOPK - 2], dtype=torch.int32)  # drops a valid slot (the last is -1)
    sink = torch.tensor([0.5, -1.0, 2.0, float("-inf")], dtype=torch.float32)  # -inf: no sink
    t = types.SimpleNamespace(
        kv_scope=types.SimpleNamespace(indices_in_kvcache=idx, blocked_k=blocked_k, topk_length=topk_length),
        extra_kv_scope=types.SimpleNamespace(indices_in_kvcache=xidx, blocked_k=xblocked, topk_length=xtopk_length),
        q=q, sm_scale=sm_scale, attn_sink=sink)
    out, lse = ref.ref_sparse_attn_decode(p, t)
    write("flashmla_ref_model1_extra.json", dict(base,
          extra_num_blocks=XNB, extra_page_size=XP, extra_topk=XTOPK,
          extra_cache_u8=hexbytes(xcache), extra_indices_i32=hexbytes(xidx),
          topk_length_i32=hexbytes(topk_length), extra_topk_length_i32=hexbytes(xtopk_length),
          attn_sink_f32=hexbytes(sink), out_bf16=hexbytes(out), lse_f32=hexbytes(lse.float())))


def write(name, doc):
    path = os.path.join(TESTDATA, name)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
