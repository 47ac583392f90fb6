"""The dsa_indexer worker with the next_n causal limit dropped, a planted
bug for test_vllm_dsa.py: vLLM's own kernel and top-k are handed per-row
context lengths that are each the request's whole seq_len, as an
integration that fills vLLM's per-row (B, next_n) lengths (CTX_PER_ROW,
rocm_aiter_mla_sparse.py line 578; indexer_topk.py _row_ends, line 288)
with the context length would. Every query row then sees the draft tokens
after its own position.

    python dsa_causal_dropped.py IN OUT
"""
import sys

import torch

from kcheck.worker import files
from kcheck.worker import vllm as w

src, dst = sys.argv[1], sys.argv[2]
from kcheck.worker import interp

interp.apply()  # the interpreter fixes the worker applies (kcheck/worker/__init__.py)
load = w._load_without_runtime


def patched(modname):
    mod, shim = load(modname)
    if modname.endswith("rocm_aiter_mla_sparse"):
        real = mod.rocm_fp8_paged_mqa_logits_triton

        def logits(q, cache, weights, context_lens, block_tables, max_model_len):
            full = context_lens.reshape(-1).repeat_interleave(q.shape[1])
            return real(q, cache, weights, full, block_tables, max_model_len)

        mod.rocm_fp8_paged_mqa_logits_triton = logits
        from vllm.model_executor.layers.indexer_topk import SparseIndexerTopk

        forward = SparseIndexerTopk.forward

        def topk_forward(self, logits, seq_lens, next_n, *a, **k):
            full = seq_lens.reshape(-1, 1).expand(-1, next_n).contiguous()
            return forward(self, logits, full, next_n, *a, **k)

        SparseIndexerTopk.forward = topk_forward
    return mod, shim


w._load_without_runtime = patched
tensors, meta = files.read(src)
outs, m = w.dsa_indexer(tensors, meta, {"past_seq_len": "-inf"})
m["kcheck.planted"] = "next_n causal limit dropped (per-row context lengths = seq_len)"
files.write(dst, {k: v for k, v in tensors.items() if k not in outs}, outs, meta, m)
