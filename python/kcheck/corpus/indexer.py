"""The DSA lightning indexer's decode as vLLM calls it (issue 16 item 5):
vLLM 0.33.0's Triton paged MQA logits, its torch top-k and, for the
FLASHMLA_SPARSE capture, its conversion of the top-k to global cache slots,
all engine code under Triton's interpreter, saved in vLLM's own argument
names and layouts (`kcheck check --from vllm` reads them; internal/engines
indexer.go).

The inputs are built in the layouts vLLM's source gives them (the kernels
are vLLM's; the inputs are what a caller hands them): q_fp8 e4m3 codes [B,
next_n, H, D] with the query scale folded into weights; the uint8 indexer
cache [NB, P, 132] in the block-split layout the Triton kernel reads (each
block's P*128 e4m3 codes, then its P f32 scales), each token written with
vLLM's ue8m0 scale, 2^ceil(log2(max(amax, 1e-4) / 448)) (the formula of
rocm_aiter_mla_sparse.py:150-158; vLLM's own Triton writer,
indexer_k_quant_and_cache_triton, stores the SHUFFLE layout for pages above
one token, :196, which this kernel does not read, so the bytes are laid out
here), and viewed [NB, P, 1, 132] for the call as vLLM does (:1362).
"""

import math

import torch

from kcheck.corpus import run

LOGITS = ("vllm/v1/attention/ops/rocm_aiter_mla_sparse.py@0.33.0:624-692 (rocm_fp8_paged_mqa_logits_triton(q_fp8 [B,next_n,H,D], "
          "kv_cache_fp8 uint8 [NB,P,1,D+4], weights f32 [B*next_n,H], context_lens, block_tables, max_model_len); ctx_per_row False "
          "when context_lens numbers B :647-648), :542-621 (_fp8_paged_mqa_logits_decode_kernel: row n sees seq_len - NEXT_N + n + 1 "
          "tokens :576-581, block-split codes then scales :600-614, s = sum_h relu(k.q_h) w_h, times the token's scale :616-620, "
          "stores only pos < seq_len :597, :621), :1357-1391 (the decode call: kv_cache.unsqueeze(-2), q [B, next_n, H, D]); "
          "vllm/v1/worker/workspace.py:264 (the logits buffer is torch.empty)")
TOPK = ("vllm/model_executor/layers/indexer_topk.py@0.33.0:302-372 (SparseIndexerTopk.forward(logits, seq_lens, next_n, topk_indices, "
        "topk_tokens, max_seq_len), the torch backend :359-372), :279-299 (_row_ends: seq_lens [B, 1] -> each row's causal end)")
CONVERT = ("vllm/v1/attention/backends/mla/sparse_utils.py@0.33.0:493-637 (triton_convert_req_index_to_global_index(req_id, "
           "block_table, token_indices, BLOCK_SIZE, NUM_TOPK_TOKENS, return_valid_counts=True) -> (out, valid_counts)); "
           "vllm/v1/attention/backends/mla/flashmla_sparse.py@0.33.0:914-922 (FLASHMLA_SPARSE's call, the result reassigned to "
           "topk_indices, topk_length)")

B, NEXT_N, H, D, P = 2, 2, 16, 128, 64
LENS = (200, 131)   # request 1's last page partly used; next_n 2: rows see 199, 200, 130, 131 tokens
MAX_MODEL_LEN, TOPK_TOKENS = 256, 128


_loaded = []


def _modules():
    """(kernel module, sparse_utils, workspace module, shim note), loaded once
    (the shim refuses a module imported before it, as a second load would be)."""
    if _loaded:
        return _loaded[0]
    run.interpreter()
    from kcheck.worker.vllm import _load_without_runtime

    mod, shim = _load_without_runtime("vllm.v1.attention.ops.rocm_aiter_mla_sparse")
    su, su_shim = _load_without_runtime("vllm.v1.attention.backends.mla.sparse_utils")
    import vllm.v1.worker.workspace as ws

    if not ws.is_workspace_manager_initialized():
        ws.init_workspace_manager(torch.device("cpu"))
    _loaded.append((mod, su, ws, "; ".join(dict.fromkeys(x for x in (shim, su_shim) if x))))
    return _loaded[0]


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    nblk = [-(-n // P) for n in LENS]
    NB = sum(nblk) + 3
    perm = torch.randperm(NB, generator=g).to(torch.int32)
    block_tables = torch.zeros(B, max(nblk), dtype=torch.int32)
    used = 0
    for b, n in enumerate(nblk):
        block_tables[b, :n] = perm[used:used + n]
        used += n
    # keys with a spread of magnitudes, so that the tokens' ue8m0 scales differ
    k = torch.randn(NB * P, D, generator=g) * torch.exp2(torch.randint(-3, 4, (NB * P, 1), generator=g).float())
    amax = k.abs().amax(dim=1)
    scale = torch.exp2(torch.ceil(torch.log2(amax.clamp(min=1e-4) / 448.0)))
    codes = (k / scale[:, None]).to(torch.float8_e4m3fn)
    cache = torch.cat([codes.view(torch.uint8).reshape(NB, P * D),
                       scale.to(torch.float32).contiguous().view(torch.uint8).reshape(NB, P * 4)], dim=1).reshape(NB, P, D + 4)
    q_fp8 = (torch.randn(B, NEXT_N, H, D, generator=g) * 2).to(torch.float8_e4m3fn)
    weights = torch.randn(B * NEXT_N, H, generator=g) * 0.05
    context_lens = torch.tensor(LENS, dtype=torch.int32).reshape(B, 1)   # [B, 1], as the CUDA path passes it
    return q_fp8, cache, weights, context_lens, block_tables


def vllm_indexer(c, kind, fault, seed):
    """kind request: the indexer's top-k (token positions); global: after
    FLASHMLA_SPARSE's conversion to cache slots."""
    mod, su, ws, shim = _modules()
    q_fp8, cache, weights, context_lens, block_tables = _inputs(seed)
    feed_lens = context_lens
    if fault == "causal_mask_dropped":
        # a caller handing every query row its request's whole length
        # (per-row lengths [B, next_n] all seq_len): each MTP row sees its
        # own future draft tokens, in the logits and in the top-k
        feed_lens = context_lens.repeat(1, NEXT_N).contiguous()
    (buf,) = ws.current_workspace_manager().get_simultaneous(((B * NEXT_N, MAX_MODEL_LEN), torch.float32))
    # The request pair fills the buffer with -inf before the call, as vLLM's
    # torch reference allocates it (rocm_aiter_mla_sparse.py:454-459), and
    # says so (logits_past_len = -inf): every logit is judged, a future
    # token's too. The global pair leaves it as vLLM's torch.empty would
    # (NaN here, visibly not data): the columns the kernel never writes are
    # not judged.
    fill = -math.inf if kind == "request" else math.nan
    buf.fill_(fill)
    kv = cache.unsqueeze(-2)
    logits = mod.rocm_fp8_paged_mqa_logits_triton(q_fp8, kv, weights, feed_lens, block_tables, MAX_MODEL_LEN)
    if logits.data_ptr() != buf.data_ptr():
        raise RuntimeError("the kernel's logits are not the workspace buffer filled here")
    logits = logits.clone()
    from vllm.model_executor.layers.indexer_topk import SparseIndexerTopk

    topk_indices = torch.full((B * NEXT_N, TOPK_TOKENS), -2, dtype=torch.int32)
    SparseIndexerTopk("torch").forward(logits, feed_lens, NEXT_N, topk_indices, TOPK_TOKENS, MAX_MODEL_LEN)
    tensors = {"q_fp8": q_fp8, "kv_cache": kv, "weights": weights, "context_lens": context_lens,
               "block_tables": block_tables, "logits": logits}
    function = ("vllm.v1.attention.ops.rocm_aiter_mla_sparse.rocm_fp8_paged_mqa_logits_triton, then "
                "vllm.model_executor.layers.indexer_topk.SparseIndexerTopk('torch')")
    source = LOGITS + "; " + TOPK
    if kind == "global":
        req_id = torch.arange(B, dtype=torch.int32).repeat_interleave(NEXT_N)
        feed_req = req_id
        if fault == "req_id_swapped":
            feed_req = req_id.flip(0).contiguous()   # each row converted with the other request's block table
        slots, topk_length = su.triton_convert_req_index_to_global_index(
            feed_req, block_tables, topk_indices, BLOCK_SIZE=P, NUM_TOPK_TOKENS=TOPK_TOKENS, return_valid_counts=True)
        tensors.update(req_id=req_id, topk_indices=slots, topk_length=topk_length)
        function += ", then vllm.v1.attention.backends.mla.sparse_utils.triton_convert_req_index_to_global_index (as FLASHMLA_SPARSE)"
        source += "; " + CONVERT
    else:
        tensors["topk_indices"] = topk_indices
    base = f"vllm/dsa_indexer_mtp_{kind}"
    twin_fault = {"request": "causal_mask_dropped", "global": "req_id_swapped"}[kind]
    meta = {"kcheck.kernel": "dsa_indexer", "max_model_len": MAX_MODEL_LEN, "topk_tokens": TOPK_TOKENS, "scale_fmt": "ue8m0",
            "kcheck.corpus.shim": shim, "kcheck.corpus.n_splits": str(mod._decode_cu_count()),
            "kcheck.corpus.logits_fill": ("-inf (filled before the call, as vLLM's torch reference allocates it)" if kind == "request" else
                                          "nan (torch.empty in the engine; columns past each row's length the kernel never writes keep it)"),
            "kcheck.corpus.inputs": "q_fp8 e4m3 codes, weights f32 (q scale folded), the block-split ue8m0 indexer cache laid out per "
                                    "rocm_aiter_mla_sparse.py:150-158, :600-614"}
    if kind == "request":
        meta["logits_past_len"] = "-inf"
    expect = {"verdict": "pass"}
    if fault:
        expect = {"verdict": "fail", "tensor": "logits" if fault == "causal_mask_dropped" else "topk_indices", "stage": None,
                  "signature": "future_tokens_visible" if fault == "causal_mask_dropped" else "slots of another request"}
    c.add(f"{base}{'_' + fault if fault else ''}.safetensors", engine="vllm", from_engine="vllm", kernel="dsa_indexer",
          function=function, source=source, produced_by="engine", tensors=tensors, meta=meta, expect=expect,
          audit=["gap7"], item=5, fault=fault, twin=base + (".safetensors" if fault else f"_{twin_fault}.safetensors"), committed=True,
          notes=f"B={B}, next_n={NEXT_N} (MTP), H={H}, D={D}, P={P}, lens {list(LENS)}, context_lens [B, 1], max_model_len "
                f"{MAX_MODEL_LEN}, topk {TOPK_TOKENS}; logits past each row's length "
                + ("-inf (filled before the call; logits_past_len = -inf: judged)" if kind == "request" else "unwritten (NaN: not judged)")
                + ("; topk_indices converted to global slots, req_id and topk_length beside them" if kind == "global" else ""))


def build(c):
    for kind in ("request", "global"):
        vllm_indexer(c, kind, None, 1660)
    vllm_indexer(c, "request", "causal_mask_dropped", 1660)
    vllm_indexer(c, "global", "req_id_swapped", 1660)
