"""vLLM's Triton kernels (vllm 0.33.0), called as vLLM's backends call them.

Every vLLM Triton module imports `triton` and `tl` from vllm.triton_utils,
whose importing.py sets HAS_TRITON = False when no GPU driver is active
(vllm/triton_utils/importing.py, "Disabling Triton to prevent runtime
errors"), and then hands out TritonPlaceholder, whose `jit` returns the
Python function undecorated: the kernels cannot be launched, not even by
Triton's interpreter. The shim below replaces exactly those two names of
the real vllm.triton_utils module, `triton` and `tl`, with the real triton
and triton.language, and only when vLLM disabled them; everything else
(the kernel module, vllm.platforms, the launch code) is vLLM's own,
imported from the installed package. On a GPU machine no shim is applied.

Under the interpreter the package's own vllm/__init__.py is not run either
(_vllm_package): its one import, vllm.env_override, takes 15 of the 25 s
`import vllm.triton_utils` costs on a 2-core CPU, importing and patching
torch._inductor and torch._dynamo for torch.compile, which no worker call
uses; the worker fails its run if torch._inductor was imported after all.
"""

import torch

from kcheck.worker import BadInput, Unsupported, device
from kcheck.worker.common import (
    bool_param,
    float_param,
    need,
    param,
    provenance,
    require_convention,
)

SHIM = "vllm.triton_utils.triton/.tl replaced by the real triton/triton.language (vLLM disables Triton without an active GPU driver)"

INIT_SHIM = ("vllm/__init__.py not run: the package is entered without it (its version module run and its four "
             "environment variables set as vllm/env_override.py lines 164-183 set them); env_override's patches of "
             "torch._inductor, for torch.compile, are left out, and torch._inductor was not imported by the run")

# The environment vllm/env_override.py (vllm 0.33.0) sets on `import vllm`,
# lines 164 and 168 unconditionally, 176 and 183 unless set: (name, value,
# overwrite). Its two functions before them (lines 147-148) act only with
# VLLM_ENABLE_CUDA_COMPATIBILITY set or on ROCm, neither of which runs under
# the interpreter.
_ENV_OVERRIDE = (
    ("PYTORCH_NVML_BASED_CUDA_CHECK", "1", True),
    ("TORCHINDUCTOR_COMPILE_THREADS", "1", True),
    ("TRITON_CACHE_AUTOTUNING", "1", False),
    ("TILELANG_CLEANUP_TEMP_FILES", "1", False),
)


def _vllm_package():
    """Enter the installed vllm package without running its __init__.py,
    under the interpreter and when nothing imported vllm yet; returns
    INIT_SHIM when it did, else None.

    vllm/__init__.py (vllm 0.33.0) runs vllm.version, then vllm.env_override
    (lines 7 and 14; the rest is lazy attribute lookup), and env_override,
    past the environment variables above, patches torch._inductor's wrapper
    codegen, scheduler, lowering and cache for torch.compile graphs: 15 s of
    imports a worker process would pay for code it never runs.
    """
    import importlib
    import importlib.util
    import os
    import sys

    if "vllm" in sys.modules or device().type != "cpu":
        return None
    spec = importlib.util.find_spec("vllm")
    if spec is None:
        raise ModuleNotFoundError("No module named 'vllm'", name="vllm")
    pkg = importlib.util.module_from_spec(spec)
    sys.modules["vllm"] = pkg
    version = importlib.import_module("vllm.version")
    pkg.__version__, pkg.__version_tuple__ = version.__version__, version.__version_tuple__
    for name, value, overwrite in _ENV_OVERRIDE:
        if overwrite:
            os.environ[name] = value
        else:
            os.environ.setdefault(name, value)
    return INIT_SHIM


def _check_init_shim(shim):
    """The premise of INIT_SHIM, checked after the kernel ran: nothing the
    run called reached torch.compile's machinery, which env_override patches."""
    import sys

    if shim and INIT_SHIM in shim and "torch._inductor" in sys.modules:
        raise RuntimeError("torch._inductor was imported during the run: vllm.env_override's patches, "
                           "left out by the worker's shim, may have mattered (kcheck.worker.vllm._vllm_package)")


def _load(modname):
    """Import a vLLM kernel module with Triton enabled; returns (module, shim or None)."""
    import importlib
    import sys

    init = _vllm_package()

    import triton
    import triton.language as tl

    import vllm.triton_utils as tu

    shim = None
    if not tu.HAS_TRITON:
        if modname in sys.modules:
            raise RuntimeError(f"{modname} was imported before the shim")
        tu.triton, tu.tl = triton, tl
        shim = SHIM
    return importlib.import_module(modname), "; ".join(x for x in (init, shim) if x) or None


# TRITON_MLA's split count (vllm/v1/attention/backends/mla/triton_mla.py,
# _compute_num_kv_splits and its constants _MIN_WORK_PER_SPLIT = 512,
# _SPLIT_OCCUPANCY_MULTIPLIER = 2): next_power_of_2(max(1, max_seq_len //
# 512)), capped at 2 * the SM count. The option num_kv_splits overrides it
# (the CPU has no SM count; the cap is reported as not applied).
def _triton_mla_splits(max_seq_len):
    n = max(1, max_seq_len // 512)
    return 1 << (n - 1).bit_length()


_PRECISION_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}


def _triton_mla_precision(q_dtype, cache_dtype):
    """The declared precision of _fwd_grouped_kernel_stage1 (vllm 0.33.0,
    vllm/v1/attention/ops/triton_decode_attention.py), which the Expected
    reference then emulates:

    - acc_dtype f32: `qk = tl.dot(q, k.to(q.dtype))` (line 393) and
      `acc += tl.dot(p.to(v.dtype), v)` (line 437) accumulate in fp32
      (tl.dot's default out dtype for 16-bit operands);
    - kv_dequant_dtype = q's dtype: an fp8 row is `(k.to(tl.float32) *
      ks).to(q.dtype)` (lines 391-392; kpe likewise, 402-403);
    - p_dtype = V's dtype, and with is_mla V is the (dequantized) K block
      itself, `v = tl.trans(k)` (line 431): q's dtype for an fp8 cache,
      the cache's own for a 16-bit one;
    - softmax_block 32: the running max e_max advances once per BLOCK_N =
      32-token tile (_decode_grouped_att_m_fwd, `BLOCK = 32`, line 505;
      16 on ROCm, which this worker does not run), so P is rounded
      against a max kept per 32 tokens.

    The softmax itself is natural-base, `p = tl.exp(qk - n_e_max)` on
    qk = fp32(dot * sm_scale) (lines 405, 435), where kcheck's model is
    FlashMLA's exp2f(fma(s, scale*log2e, -m*scale*log2e)); the two differ
    by a few fp32 ulp of P, below P's bf16 rounding, so it is not declared.
    """
    q_name = _PRECISION_DTYPES.get(q_dtype)
    if q_name is None:
        raise Unsupported(f"q dtype {q_dtype}: TRITON_MLA runs bf16/fp16 queries")
    fp8 = cache_dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    return {
        "acc_dtype": "f32",
        "kv_dequant_dtype": q_name,
        "p_dtype": q_name if fp8 else _PRECISION_DTYPES.get(cache_dtype, q_name),
        "softmax_block": "32",
        # stage 2 stores acc / e_sum with both still 0 for a request with no
        # token (lines 599-601, 626-633): NaN, declared (reference/CONTRACTS.md §3.6)
        "empty_row": "nan",
        "kcheck.worker.precision_source": "vllm/v1/attention/ops/triton_decode_attention.py (vllm 0.33.0) lines 391-437, 505, 599-633",
    }


def mla_decode(tensors, meta, opts):
    """TRITON_MLA's forward_mqa (vllm/v1/attention/backends/mla/triton_mla.py):
    o = zeros(B, H, kv_lora_rank, q.dtype), lse = zeros(B, H, q.dtype),
    attn_logits = empty(B, H, num_kv_splits, kv_lora_rank + 1, float32),
    decode_attention_fwd(q, kv_cache.unsqueeze(2), kv_cache.unsqueeze(2)[..., :L],
    o, lse, block_table, seq_lens, attn_logits, num_kv_splits, scale,
    PAGE_SIZE, k_scale=, v_scale=k_scale, is_mla=True).

    OUT is the call as TRITON_MLA made it, in vLLM's names, and declares
    kcheck.worker.layout = vllm: kcheck reads it with the engine table
    `--from vllm` reads a capture with (internal/engines withTritonMLA,
    tritonAttnLogits, tritonMLAPrecision), the same names a capture of
    forward_mqa has (python/kcheck/corpus/decode.py): q [rows, H, D],
    kv_c_and_k_pe_cache [NB, P, D] (before forward_mqa's unsqueeze(2)),
    block_table and seq_lens per row, k_scale, o [rows, H, L], lse [rows, H]
    in the dtype the buffer had (option lse_dtype: `query`, TRITON_MLA's, or
    `f32`, the same kernel handed an fp32 buffer), attn_logits [rows, H, S,
    L+1] (option partials=off leaves it out), and the layer's scale,
    num_kv_splits, kv_cache_dtype (vLLM's: auto for a 16-bit cache),
    page_size and kv_lora_rank. attn_logits is filled with NaN before the
    call, as torch.empty may leave anything there; the table leaves the
    splits the kernel never writes (`if split_kv_end > split_kv_start`)
    unjudged. With s_q > 1 the rows are forward_mqa's (request, query)
    pairs, each judged against its own block table and length.
    """
    require_convention(meta, "vllm", "mla_decode", "lse_base", "e")
    kind = param(meta, "kv_cache_dtype", "bf16")
    if kind not in ("bf16", "fp16", "auto", "fp8_e4m3"):
        raise Unsupported(f"kv_cache_dtype {kind}: TRITON_MLA reads bf16/fp16 or per-tensor fp8 caches (supported_kv_cache_dtypes, vllm 0.33.0 vllm/v1/attention/backends/mla/triton_mla.py:101-107), not {kind}")
    lse_dtype = opts.get("lse_dtype", "query")
    if lse_dtype not in ("query", "f32"):
        raise BadInput(f"option lse_dtype={lse_dtype}: want query or f32")
    partials = opts.get("partials", "on")
    if partials not in ("on", "off"):
        raise BadInput(f"option partials={partials}: want on or off")

    q = need(tensors, "q")
    cache = need(tensors, "kv_cache")
    block_table = need(tensors, "block_table").to(torch.int32)
    seq_lens = need(tensors, "seq_lens").to(torch.int32)
    if q.dim() != 4:
        raise BadInput(f"q has shape {tuple(q.shape)}; want [B, s_q, H, D]")
    B, s_q, H, D = q.shape
    if cache.dim() != 3 or cache.shape[2] != D:
        raise BadInput(f"kv_cache has shape {tuple(cache.shape)}; want [NB, P, {D}]")
    L = int(param(meta, "latent_dim", "512"))
    P = cache.shape[1]
    scale = float_param(meta, "softmax_scale")
    causal = bool_param(meta, "causal", False)
    k_scale = None
    if kind == "fp8_e4m3":
        cache = cache.view(torch.float8_e4m3fn)
        k_scale = need(tensors, "k_scale").to(torch.float32).reshape(())
    else:
        # a 16-bit cache: auto is its own dtype (kcheck's contract, as vLLM's
        # auto is the model's), bf16/fp16 must agree with it
        want = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(kind, cache.dtype)
        if cache.dtype not in (torch.bfloat16, torch.float16) or cache.dtype != want:
            raise BadInput(f"kv_cache has dtype {cache.dtype}; kv_cache_dtype {kind} wants a {want} cache")

    mod, shim = _load("vllm.v1.attention.ops.triton_decode_attention")

    # forward_mqa's multi-token decode (triton_mla.py, query_len > 1): rows
    # are (request, query) pairs, each with the request's block table and,
    # when causal, a context shortened by the queries after it.
    qf = q.reshape(B * s_q, H, D).contiguous()
    bt = block_table.repeat_interleave(s_q, dim=0) if s_q > 1 else block_table
    if s_q > 1 and causal:
        offs = torch.arange(1 - s_q, 1, dtype=seq_lens.dtype, device=seq_lens.device)
        sl = (seq_lens.unsqueeze(1) + offs).flatten().clamp(min=0)
    else:
        sl = seq_lens.repeat_interleave(s_q) if s_q > 1 else seq_lens
    max_len = int(seq_lens.max().item()) if seq_lens.numel() else 0
    # The split count: the option, else the case's own (a split-K case asks
    # for S splits: the kernel takes any num_kv_splits), else TRITON_MLA's.
    if "num_kv_splits" in opts:
        S, why = int(opts["num_kv_splits"]), "option num_kv_splits"
    elif meta.get("num_splits"):
        S, why = int(meta["num_splits"]), "the case's num_splits"
    else:
        S, why = _triton_mla_splits(max_len), "TRITON_MLA _compute_num_kv_splits (no SM cap on the CPU)"
    if S < 1:
        raise BadInput(f"num_kv_splits = {S}: want at least 1")

    rows = B * s_q
    o = torch.zeros(rows, H, L, dtype=q.dtype, device=q.device)
    lse = torch.zeros(rows, H, dtype=q.dtype if lse_dtype == "query" else torch.float32, device=q.device)
    attn_logits = torch.full((rows, H, S, L + 1), float("nan"), dtype=torch.float32, device=q.device)
    kv = cache.unsqueeze(2)
    mod.decode_attention_fwd(
        qf, kv, kv[..., :L], o, lse, bt, sl, attn_logits, S, scale, P,
        k_scale=k_scale, v_scale=k_scale, is_mla=True,
    )
    outs = {"q": qf, "kv_c_and_k_pe_cache": need(tensors, "kv_cache"), "block_table": bt, "seq_lens": sl, "o": o, "lse": lse}
    if k_scale is not None:
        outs["k_scale"] = k_scale
    if partials == "on":
        outs["attn_logits"] = attn_logits
    m = provenance("vllm", "vllm", "vllm.v1.attention.ops.triton_decode_attention.decode_attention_fwd (as TRITON_MLA forward_mqa)", shim)
    m.update({"kcheck.kernel": "mla_decode", "kcheck.worker.layout": "vllm", "scale": repr(scale), "page_size": str(P),
              "kv_lora_rank": str(L), "kv_cache_dtype": "fp8_e4m3" if kind == "fp8_e4m3" else "auto"})
    m["num_kv_splits"] = str(S)
    m["kcheck.worker.num_kv_splits_from"] = why
    m["kcheck.worker.lse_dtype"] = str(lse.dtype).replace("torch.", "")
    m.update(_triton_mla_precision(q.dtype, cache.dtype))
    return outs, m


mla_decode.options = ("lse_dtype", "partials", "num_kv_splits")


def splitk_combine(tensors, meta, opts):
    """vLLM's Triton merge_attn_states (vllm/v1/attention/ops/
    triton_merge_attn_states.py): output [T, H, D], prefix/suffix outputs
    [T, H, D], lse [H, T], base e. It merges exactly two states, so only
    contract cases with S = 2 map onto it: prefix = split 0, suffix =
    split 1, each contract row a token with one head."""
    require_convention(meta, "vllm", "splitk_combine", "lse_base", "e")
    po = need(tensors, "partial_out")
    pl = need(tensors, "partial_lse")
    if po.dim() != 3 or pl.dim() != 2:
        raise BadInput("partial_out must be [N, S, L] and partial_lse [N, S]")
    N, S, L = po.shape
    if S != 2:
        raise Unsupported(f"merge_attn_states merges two states (prefix, suffix); the case has S = {S}")
    mod, shim = _load("vllm.v1.attention.ops.triton_merge_attn_states")
    out_dtype = torch.bfloat16
    prefix = po[:, 0, :].reshape(N, 1, L).contiguous()
    suffix = po[:, 1, :].reshape(N, 1, L).contiguous()
    output = torch.empty(N, 1, L, dtype=torch.float32, device=po.device)
    output_lse = torch.empty(1, N, dtype=torch.float32, device=po.device)
    mod.merge_attn_states(output, prefix, pl[:, 0].reshape(1, N).contiguous(), suffix, pl[:, 1].reshape(1, N).contiguous(), output_lse)
    m = provenance("vllm", "vllm", "vllm.v1.attention.ops.triton_merge_attn_states.merge_attn_states", shim)
    m["kcheck.worker.note"] = "output buffer fp32 (the contract's partials are fp32; vLLM merges in the partials' dtype)"
    del out_dtype
    return {"out": output.reshape(N, L), "lse": output_lse.reshape(N)}, m


# The vLLM runtime modules rocm_aiter_mla_sparse.py imports at its top
# (lines 14-16, 21) and that no function the dsa_indexer worker calls uses:
# vllm.config's import chain needs cbor2, transformers, openai_harmony and
# more of vLLM's serving dependencies, which requirements.lock does not
# install (it pins the kernels' packages, not vLLM's server).
# vllm.v1.worker.workspace, which the wrapper does use, reaches
# vllm.forward_context through vllm.v1.worker.ubatching only for
# ForwardContext, a type it does not touch on one thread.
#
# vllm.v1.worker.block_table is imported by vllm/v1/attention/backends/mla/
# sparse_utils.py (line 26) for get_block_table_width, which only the
# warm-up keys use (line 288), not triton_convert_req_index_to_global_index;
# its own imports reach vllm.v1.attention.backends.utils and cbor2.
_RUNTIME_ONLY = (
    "vllm.config",
    "vllm.forward_context",
    "vllm.compilation.breakable_cudagraph",
    "vllm.v1.attention.backends.mla.indexer",
    "vllm.v1.worker.block_table",
)

RUNTIME_SHIM = ("vllm.config, vllm.forward_context, vllm.compilation.breakable_cudagraph, "
                "vllm.v1.attention.backends.mla.indexer and vllm.v1.worker.block_table stood in for by placeholders "
                "that raise when used (their imports need vLLM's serving dependencies, not installed; the kernel, its "
                "wrapper, the workspace manager, the top-k and the global-slot conversion do not use them); "
                "eager_break_during_capture, the decorator of rocm_aiter_sparse_attn_indexer (not called), is the "
                "identity it is outside a CUDA-graph capture")


class _Placeholder:
    """A name from a vLLM runtime module that cannot be imported here: any use raises."""

    def __init__(self, name):
        self._name = name

    def _fail(self, *a, **k):
        raise RuntimeError(f"{self._name} is a kcheck placeholder (vLLM's runtime is not installed); the worker's call path must not use it")

    __call__ = _fail

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self._name}.{attr}")

    def __mro_entries__(self, bases):
        self._fail()


def _placeholder_module(modname):
    import types

    mod = types.ModuleType(modname, "kcheck placeholder for a vLLM runtime module that cannot be imported here")

    def getattr_(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        if attr == "eager_break_during_capture":
            # breakable_cudagraph.py: outside a capture context the
            # decorated function "executes normally".
            return lambda fn: fn
        return _Placeholder(f"{modname}.{attr}")

    mod.__getattr__ = getattr_
    return mod


def _load_without_runtime(modname):
    """_load, and when vLLM's runtime modules cannot be imported (their
    dependencies are not installed), again with placeholders for exactly
    the _RUNTIME_ONLY modules. Returns (module, shim note or None)."""
    import importlib
    import sys

    try:
        return _load(modname)
    except ImportError as e:
        missing = getattr(e, "name", None) or str(e)
        if missing and missing.startswith("vllm"):
            raise
    placeholders = []
    for m in _RUNTIME_ONLY:
        try:
            importlib.import_module(m)
        except ImportError:
            sys.modules[m] = _placeholder_module(m)
            placeholders.append(m)
    mod, shim = _load(modname)
    note = "; ".join(x for x in (shim, RUNTIME_SHIM if placeholders else None) if x)
    return mod, note or None


def _e4m3_pow2(x, rows_read, what):
    """Re-encode x [..., D] (bf16) as e4m3 codes times one power-of-two
    scale per row, exactly, or refuse. The scale is vLLM's ue8m0 choice,
    2^ceil(log2(max(amax, 1e-4) / 448)) (rocm_aiter_mla_sparse.py lines
    151-158, indexer_k_quant_and_cache with USE_UE8M0): with a power of two
    the decoded value e4m3 * scale is the bf16 value itself, so the kernel
    sees exactly the contract's inputs and nothing is quantized. rows_read
    masks the rows the kernel reads (a cache's unattended rows may hold
    anything, NaN included)."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1).nan_to_num(0.0)
    scale = torch.exp2(torch.ceil(torch.log2(amax.clamp(min=1e-4) / 448.0)))
    codes = (xf / scale.unsqueeze(-1)).to(torch.float8_e4m3fn)
    back = codes.float() * scale.unsqueeze(-1)
    bad = (back != xf) & rows_read.unsqueeze(-1)
    n = int(bad.sum())
    if n:
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise Unsupported(
            f"tensor {what}: {n} of {int(rows_read.sum()) * x.shape[-1]} values read are not an e4m3 code times a power-of-two "
            f"scale per row (first at {list(idx)}: {xf[idx].item()!r}); the Triton kernel reads fp8 q and an fp8 cache with a "
            "per-token f32 scale (rocm_aiter_mla_sparse.py lines 543-546), kcheck's dsa_indexer contract gives BF16 ones, and "
            "quantizing them would be kcheck computing: give the capture in that layout instead (k_cache_dtype fp8_e4m3, an F8_E4M3 q: reference/CONTRACTS.md §3.9)")
    return codes, scale


def _int_param(meta, name, default):
    v = param(meta, name, default)
    try:
        return int(v)
    except (TypeError, ValueError):
        raise BadInput(f"parameter {name} = {v!r} is not an integer") from None


def dsa_indexer(tensors, meta, opts):
    """vLLM's Triton paged MQA logits, rocm_fp8_paged_mqa_logits_triton
    (vllm/v1/attention/ops/rocm_aiter_mla_sparse.py lines 624-692, kernel
    _fp8_paged_mqa_logits_decode_kernel lines 542-621), then vLLM's "torch"
    top-k backend (SparseIndexerTopk, vllm/model_executor/layers/
    indexer_topk.py, selected by --kernel-config
    sparse_indexer_topk_backend=torch: mask columns >= seq_len to -inf,
    torch.topk, -1 past seq_len).

    vLLM calls this Triton wrapper on ROCm gfx942/gfx950 for DeepSeek-V4's
    block-flat C4A indexer cache with pages a multiple of 64
    (rocm_fp8_paged_mqa_logits, lines 794-806). Its inputs: q_fp8 [B,
    next_n, H, D] e4m3 (the query's scale folded into weights by the
    caller), kv_cache uint8 [NB, P, 1, D+4] block-split (each block P*D e4m3
    codes, then P f32 scales), weights f32 [B*next_n, H], context_lens [B],
    block_tables, max_model_len. Its output: logits f32 [B*next_n,
    max_model_len], written only where pos < seq_len (mask_pos, lines 597,
    621): the rest is the workspace buffer as it was.

    The contract's BF16 q and cache map onto it only exactly (see
    _e4m3_pow2): each (request, head) row of q and each cache token
    becomes e4m3 codes times a power-of-two scale, q's folded into weights
    (exact in fp32), else the case is refused. Outputs: scores = logits[:,
    :max_seq]; topk_indices from vLLM's torch top-k. max_model_len is
    max(max_seq, topk), as in a deployment (the model length is never below
    the top-k; vLLM's torch top-k needs as many columns as topk).

    next_n > 1 (an MTP step; reference/CONTRACTS.md section 3.9): q and
    weights have B*next_n rows, request-major, q passed as [B, next_n, H,
    D]; seq_lens stays [B] (the wrapper then derives each row's length,
    `ctx_per_row` False, kernel line 580), and the top-k gets seq_lens
    [B, 1] with next_n (indexer_topk.py _row_ends, lines 288-297).

    topk_index = global_slot: the top-k goes through vLLM's
    triton_convert_req_index_to_global_index (vllm/v1/attention/backends/
    mla/sparse_utils.py lines 493-637) as FLASHMLA_SPARSE calls it
    (flashmla_sparse.py lines 914-922: req_id per token, the block table,
    BLOCK_SIZE = the page size, NUM_TOPK_TOKENS = topk,
    return_valid_counts=True), with BLOCK_STRIDE_ROWS left at its default,
    the page size (a cache whose blocks are contiguous).

    Option past_seq_len: `nan` (default) fills the workspace with NaN before
    the call, so what the kernel leaves unwritten is visibly not data
    (vLLM's workspace is torch.empty, vllm/v1/worker/workspace.py line 264);
    `-inf` fills it with -inf, what vLLM's torch reference
    fp8_paged_mqa_logits_torch (lines 454-459) allocates, so only the values the
    kernel writes are judged.
    """
    past = opts.get("past_seq_len", "nan")
    if past not in ("nan", "-inf"):
        raise BadInput(f"option past_seq_len={past}: want nan or -inf")
    next_n = _int_param(meta, "next_n", "1")
    if next_n < 1:
        raise BadInput(f"parameter next_n = {next_n}: want at least 1 query a request")
    index_kind = param(meta, "topk_index", "request")
    if index_kind not in ("request", "global_slot"):
        raise BadInput(f"parameter topk_index = {index_kind!r}: want request or global_slot")
    q = need(tensors, "q")
    kc = need(tensors, "k_cache")
    w = need(tensors, "weights").to(torch.float32)
    block_table = need(tensors, "block_table").to(torch.int32)
    seq_lens = need(tensors, "seq_lens").to(torch.int32)
    if q.dim() != 3:
        raise BadInput(f"tensor q has shape {tuple(q.shape)}; want [B*next_n, Hi, Dk]")
    R, H, D = q.shape
    # seq_lens [B, next_n] are per-row lengths (vLLM's native speculative
    # decode): the kernel reads them as they are (CTX_PER_ROW, line 578),
    # and so does the top-k (_row_ends, indexer_topk.py lines 288-289); a
    # request's pages hold its longest row.
    row_lens = None
    if seq_lens.dim() == 2:
        if seq_lens.shape[1] != next_n:
            raise BadInput(f"tensor seq_lens has shape {tuple(seq_lens.shape)}; per-row lengths are [B, next_n = {next_n}]")
        row_lens = seq_lens.contiguous()
        seq_lens = row_lens.amax(dim=1) if row_lens.numel() else row_lens.reshape(-1)
    B = seq_lens.shape[0] if seq_lens.dim() == 1 else -1
    if B * next_n != R:
        raise BadInput(f"tensor q has {R} rows; seq_lens {tuple(seq_lens.shape)} with next_n = {next_n} wants {B * next_n if B >= 0 else 'a [B] tensor'}")
    # k_cache_dtype fp8_e4m3 is this kernel's own layout (the contract's
    # section 3.9): the capture's bytes go to the kernel as they are.
    native = meta.get("k_cache_dtype", "bf16") == "fp8_e4m3"
    if native:
        if kc.dim() != 3 or kc.shape[2] != D + 4 or kc.dtype != torch.uint8:
            raise BadInput(f"tensor k_cache is {kc.dtype} {tuple(kc.shape)}; an fp8 indexer cache is uint8 [NB, P, {D + 4}]")
    elif kc.dim() != 3 or kc.shape[2] != D:
        raise BadInput(f"tensor k_cache has shape {tuple(kc.shape)}; want [NB, P, {D}]")
    if tuple(w.shape) != (R, H):
        raise BadInput(f"tensor weights has shape {tuple(w.shape)}; want [{R}, {H}]")
    if seq_lens.shape != (B,) or block_table.dim() != 2 or block_table.shape[0] != B:
        raise BadInput(f"seq_lens {tuple(seq_lens.shape)} and block_table {tuple(block_table.shape)} must be [{B}] and [{B}, max_blocks]")
    NB, P, _ = kc.shape
    # The wrapper's own limits (line 637 assert; tl.arange, lines 583-584; line 571).
    if P % 64:
        raise Unsupported(f"page size {P}: rocm_fp8_paged_mqa_logits_triton tiles 64 tokens and asserts block_size % 64 == 0 (line 637)")
    if H & (H - 1) or D & (D - 1) or D % 4:
        raise Unsupported(f"{H} heads of dim {D}: the kernel's tl.arange(0, NUM_HEADS) and (0, HEAD_SIZE) need powers of two, HEAD_SIZE % 4 == 0 (lines 571, 583-584)")
    longest = int(seq_lens.max().item()) if B else 0
    topk, max_seq = _int_param(meta, "topk", None), _int_param(meta, "max_seq", longest)
    if topk <= 0:
        raise BadInput(f"parameter topk = {topk}: want a positive count")
    if int(seq_lens.min().item()) < 0 or longest > max_seq:
        raise BadInput(f"seq_lens {seq_lens.tolist()} must lie in [0, max_seq = {max_seq}]")
    blocks_used = -(-seq_lens.long() // P)
    if int(blocks_used.max().item()) > block_table.shape[1]:
        raise BadInput(f"block_table has {block_table.shape[1]} columns; seq_lens need {int(blocks_used.max().item())}")
    # Which cache rows the kernel reads: the pages of each request's tokens.
    read = torch.zeros(NB, P, dtype=torch.bool, device=kc.device)
    for b in range(B):
        n = int(seq_lens[b])
        for j in range(-(-n // P)):
            blk = int(block_table[b, j])
            if not 0 <= blk < NB:
                raise BadInput(f"block_table[{b}, {j}] = {blk} is outside the cache's {NB} blocks")
            read[blk, : min(P, n - j * P)] = True

    if q.dtype == torch.float8_e4m3fn:
        q8, w_folded = q, w  # an fp8 query's scale is in the weights already
    else:
        q8, q_scale = _e4m3_pow2(q, torch.ones(R, H, dtype=torch.bool, device=q.device), "q")
        w_folded = w * q_scale
        if not torch.equal(w_folded / q_scale, w) or not torch.isfinite(w_folded).all():
            raise Unsupported("weights times q's power-of-two scales is not exact in fp32 (over- or underflow)")
    if native:
        cache = kc.contiguous().reshape(NB, P, 1, D + 4)
    else:
        k8, k_scale = _e4m3_pow2(kc, read, "k_cache")
        # vLLM's block-split cache: per block P*D e4m3 bytes, then P f32 scales.
        cache = torch.cat([k8.view(torch.uint8).reshape(NB, P * D), k_scale.to(torch.float32).contiguous().view(torch.uint8).reshape(NB, P * 4)], dim=1)
        cache = cache.reshape(NB, P, 1, D + 4)

    mod, shim = _load_without_runtime("vllm.v1.attention.ops.rocm_aiter_mla_sparse")
    import vllm.v1.worker.workspace as ws

    if not ws.is_workspace_manager_initialized():
        ws.init_workspace_manager(q.device)
    max_model_len = max(max_seq, topk)
    (buf,) = ws.current_workspace_manager().get_simultaneous(((R, max_model_len), torch.float32))
    buf.fill_(float("nan") if past == "nan" else float("-inf"))
    ctx = seq_lens if row_lens is None else row_lens
    logits = mod.rocm_fp8_paged_mqa_logits_triton(
        q8.reshape(B, next_n, H, D), cache, w_folded.contiguous(), ctx, block_table, max_model_len,
    )
    if logits.data_ptr() != buf.data_ptr():
        raise RuntimeError("the wrapper's logits are not the workspace buffer the worker initialized")
    scores = logits[:, :max_seq].clone()

    from vllm.model_executor.layers.indexer_topk import SparseIndexerTopk

    topk_indices = torch.full((R, topk), -2, dtype=torch.int32, device=q.device)
    SparseIndexerTopk("torch").forward(logits, seq_lens.reshape(B, 1) if row_lens is None else row_lens, next_n,
                                       topk_indices, topk, max_model_len)
    call = ("vllm.v1.attention.ops.rocm_aiter_mla_sparse.rocm_fp8_paged_mqa_logits_triton, "
            "then vllm.model_executor.layers.indexer_topk.SparseIndexerTopk('torch')")
    if index_kind == "global_slot":
        # sparse_utils.py line 549: NUM_TOPK_TOKENS % BLOCK_N == 0, BLOCK_N 128 as FLASHMLA_SPARSE leaves it
        if topk % 128:
            raise Unsupported(f"topk {topk}: triton_convert_req_index_to_global_index asserts NUM_TOPK_TOKENS % BLOCK_N == 0 (BLOCK_N = 128, sparse_utils.py)")
        su, su_shim = _load_without_runtime("vllm.v1.attention.backends.mla.sparse_utils")
        shim = "; ".join(dict.fromkeys(x for x in (shim, su_shim) if x)) or None
        req_id = torch.arange(B, dtype=torch.int32, device=q.device).repeat_interleave(next_n)
        topk_indices, _valid = su.triton_convert_req_index_to_global_index(
            req_id, block_table.contiguous(), topk_indices, BLOCK_SIZE=P, NUM_TOPK_TOKENS=topk, return_valid_counts=True,
        )
        call += ", then vllm.v1.attention.backends.mla.sparse_utils.triton_convert_req_index_to_global_index (as FLASHMLA_SPARSE)"

    m = provenance("vllm", "vllm", call, shim)
    m["kcheck.worker.past_seq_len"] = past
    m["kcheck.worker.max_model_len"] = str(max_model_len)
    how = ("the capture's fp8 q and block-split fp8 k_cache passed as they are" if native and q.dtype == torch.float8_e4m3fn else
           "q and k_cache re-encoded exactly as e4m3 codes times power-of-two scales (q's folded into weights)" if not native else
           "the capture's block-split fp8 k_cache passed as it is; q re-encoded exactly as e4m3 codes times power-of-two scales folded into weights")
    m["kcheck.worker.note"] = f"{how}; N_SPLITS from _decode_cu_count() = {mod._decode_cu_count()} (no GPU: its fallback)"
    # The kernel's arithmetic (lines 608-620): fp8 x fp8 tl.dot with fp32
    # accumulation (products exact), relu, times w, summed over heads in
    # fp32, times the token's scale: the contract's Expected model (fp32
    # dot, relu, fp32 weighted head sum; reference/dsa) with the scales
    # exact powers of two. Nothing to declare beyond the contract's.
    m["kcheck.worker.precision_source"] = "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py (vllm 0.33.0) lines 608-620"
    return {"scores": scores, "topk_indices": topk_indices}, m


dsa_indexer.options = ("past_seq_len",)


def _without_cpu_assert(mod, name):
    """mod.NAME recompiled from the installed package's own source with its
    one `assert not q.is_cpu and ...` statement dropped, and nothing else:
    the launcher refuses CPU tensors, which are what Triton's interpreter
    runs on. Returns (function, line of the dropped assert). Refuses
    (RuntimeError) unless exactly one such statement is found, so a vLLM
    that moves or adds one is noticed, not silently half-patched."""
    import ast
    import inspect
    import types

    fn = getattr(mod, name)
    lines, first = inspect.getsourcelines(fn)
    tree = ast.parse("".join(lines))
    ast.increment_lineno(tree, first - 1)
    (fdef,) = tree.body
    cpu_asserts = [n for n in fdef.body if isinstance(n, ast.Assert)
                   and any(isinstance(a, ast.Attribute) and a.attr == "is_cpu" for a in ast.walk(n.test))]
    if len(cpu_asserts) != 1:
        raise RuntimeError(f"{name}: found {len(cpu_asserts)} is_cpu asserts at its top level, want exactly 1 to drop")
    fdef.body = [n for n in fdef.body if n is not cpu_asserts[0]]
    ns = dict(mod.__dict__)  # the def's annotations resolve against the module's names
    exec(compile(tree, inspect.getsourcefile(fn), "exec"), ns)
    built = ns[name]
    patched = types.FunctionType(built.__code__, mod.__dict__, name, built.__defaults__, built.__closure__)
    patched.__kwdefaults__ = built.__kwdefaults__
    return patched, cpu_asserts[0].lineno


def _sparse_rows(dense, limits):
    """The ragged stream ROCM_AITER_MLA_SPARSE hands its decode, built from
    the contract's dense global slots [R, topk]: row r is its first n_r
    slots, n_r the position of its first negative entry (or limits[r]).

    vLLM builds it so (vllm 0.33.0, backends/mla/rocm_aiter_mla_sparse.py):
    generate_sparse_seqlen_kernel (lines 295-322) gives each query
    min(seq_len, topk_tokens) slots, the cumsum of which is paged_kv_indptr
    (line 638), and triton_convert_req_index_to_global_index (lines 226-292)
    copies that many leading top-k entries into paged_kv_indices, a -1
    among them becoming slot 0 (`tl.where(is_invalid_tok | ~valid_block, 0,
    ...)`, lines 205, 216-218): the indexer's top-k puts its -1 past seq_len. A
    row with a valid slot after a -1 has no such stream (vLLM would attend
    slot 0 in the hole), so it is refused, not repaired."""
    R, topk = dense.shape
    rows, counts = [], []
    for r in range(R):
        lim = int(limits[r])
        row = dense[r, :lim]
        neg = (row < 0).nonzero()
        n = int(neg[0]) if len(neg) else lim
        after = row[n:]
        if bool((after >= 0).any()):
            j = n + int((after >= 0).nonzero()[0])
            raise Unsupported(
                f"tensor indices row {r}: slot {int(row[j])} at position {j} follows an invalid entry at {n}; ROCM_AITER_MLA_SPARSE's "
                "ragged stream is each query's first min(seq_len, topk) top-k entries, a -1 among them read as slot 0 "
                "(backends/mla/rocm_aiter_mla_sparse.py lines 205, 216-218, 295-322), so only -1 padding after the valid slots maps onto it")
        rows.append(row[:n])
        counts.append(n)
    return rows, counts


def mla_decode_sparse(tensors, meta, opts):
    """ROCM_AITER_MLA_SPARSE's Triton sparse decode, rocm_sparse_attn_decode_bf16
    (vllm/v1/attention/ops/rocm_aiter_mla_sparse.py lines 4495-4558), called
    as _forward_mla calls it (vllm/v1/attention/backends/mla/
    rocm_aiter_mla_sparse.py lines 926-963), all line numbers vllm 0.33.0:

    - q [R, H, D], R = B * s_q rows, one a query token (forward_mqa concatenates
      ql_nope | q_pe, lines 1168-1180; the sparse decode takes a row per
      token, qo_indptr = arange, line 485);
    - kv = the cache viewed as [NB * P, 1, D] rows (line 940, after
      flat_kv_row_view, sparse_utils.py lines 50-69: a slot is block *
      block_stride_rows + offset, block_stride_rows = P for a cache whose
      blocks are contiguous, which is the contract's global slot);
    - scale = self.scale (line 953), the contract's softmax_scale;
    - head_dim = D, nope_head_dim = kv_lora_rank, rope_head_dim = D -
      kv_lora_rank (lines 954-956), output [R, H, kv_lora_rank] in
      attn_out_dtype (lines 928-932): the contract's V columns, so
      nope = V, rope = D - V, output q's dtype;
    - ragged_indices / ragged_indptr: see _sparse_rows;
    - num_splits = rocm_sparse_decode_bf16_num_splits(R, H, min(max_seq_len,
      topk_tokens)) (lines 941-949), the longest ragged row here; at 1 the
      backend calls rocm_sparse_attn_prefill instead (lines 964-977), and
      the case is refused unless option num_splits sets a count;
    - attn_sink: the case's, [H] F32 (the backend's triton_sinks, lines
      933-939, sliced to H by the wrapper, line 4551).

    Outputs: out [B, s_q, H, V]. The kernel computes no lse (the reduce,
    lines 3371-3531, stores the output only): kcheck.worker.not_written =
    lse. An empty row (all splits hold m = -FLT_MAX, l = 0) is written as
    0 (line 3488): the contract's empty row.
    """
    kind = param(meta, "kv_cache_dtype", "bf16")
    if kind not in ("bf16", "fp16", "auto"):
        raise Unsupported(f"kv_cache_dtype {kind}: ROCM_AITER_MLA_SPARSE takes its Triton path only for a cache that is not fp8 "
                          "(_use_rocm_sparse_triton, backends/mla/rocm_aiter_mla_sparse.py line 68); fp8 caches go to AITER's kernels")
    for name in ("extra_k_cache", "extra_indices_in_kvcache", "extra_topk_length"):
        if name in tensors:
            raise Unsupported(f"tensor {name}: rocm_sparse_attn_decode_bf16 attends one cache (rocm_aiter_mla_sparse.py lines 4495-4507), "
                              "no extra KV scope")
    splits_opt = opts.get("num_splits")
    q = need(tensors, "q")
    cache = need(tensors, "kv_cache")
    indices = need(tensors, "indices")
    if q.dim() != 4:
        raise BadInput(f"tensor q has shape {tuple(q.shape)}; want [B, s_q, H, D]")
    B, s_q, H, D = q.shape
    if cache.dim() != 3 or cache.shape[2] != D:
        raise BadInput(f"tensor kv_cache has shape {tuple(cache.shape)}; want [NB, P, {D}]")
    if indices.dim() != 3 or tuple(indices.shape[:2]) != (B, s_q):
        raise BadInput(f"tensor indices has shape {tuple(indices.shape)}; want [{B}, {s_q}, topk]")
    want = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(kind, cache.dtype)
    if cache.dtype not in (torch.bfloat16, torch.float16) or cache.dtype != want:
        raise BadInput(f"tensor kv_cache has dtype {cache.dtype}; kv_cache_dtype {kind} wants a {want} cache")
    if q.dtype != cache.dtype:
        raise Unsupported(f"q is {q.dtype} over a {cache.dtype} cache: the partial kernel's tl.dot(q, tl.trans(kv)) (line 2354) takes "
                          "both in the model's dtype, as the backend's bf16 path feeds them")
    L = _int_param(meta, "latent_dim", str(D - 64 if D > 64 else D))
    V = _int_param(meta, "head_dim_v", str(L))
    if not 1 <= V <= D:
        raise BadInput(f"parameter head_dim_v = {V}: want 1 <= V <= D = {D}")
    if D & (D - 1):
        raise Unsupported(f"head dim D = {D}: the reduce kernel's tl.arange(0, COMB_DIM) with COMB_DIM = nope + rope = D "
                          "(rocm_aiter_mla_sparse.py line 3407; launched with COMB_DIM=comb_dim, line 4003) needs a power of two, and Triton "
                          "refuses it ('arange's range must be a power of 2'); see fixtures/engines/README.md, sparse MLA decode")
    sink = tensors.get("attn_sink")
    if V < D and sink is None:
        raise Unsupported(f"head_dim_v {V} < D {D} with no attn_sink: ROCM_AITER_MLA_SPARSE takes the Triton path with rope dims only as "
                          "its sink fallback (triton_sink_fallback, backends/mla/rocm_aiter_mla_sparse.py lines 892-905); a rope-free head "
                          "(head_size == kv_lora_rank, line 69) is its sinkless Triton path, V = D")
    topk = indices.shape[2]
    R = B * s_q
    dense = indices.reshape(R, topk).to(torch.int64)
    limits = [topk] * R
    if "topk_length" in tensors:
        tl_ = need(tensors, "topk_length").to(torch.int64).reshape(-1)
        if tl_.numel() != B:
            raise BadInput(f"tensor topk_length has {tl_.numel()} values; want [{B}]")
        limits = [min(max(int(tl_[r // s_q]), 0), topk) for r in range(R)]
    rows, counts = _sparse_rows(dense, limits)
    NB, P, _ = cache.shape
    kv = cache.contiguous().reshape(NB * P, 1, D)
    ragged = torch.cat(rows).to(torch.int32) if rows else torch.zeros(0, dtype=torch.int32)
    indptr = torch.zeros(R + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor(counts, dtype=torch.int64), 0).to(torch.int32)
    ragged, indptr = ragged.to(q.device), indptr.to(q.device)
    if sink is not None:
        sink = sink.to(q.device, torch.float32).reshape(-1)
        if sink.numel() != H:
            raise BadInput(f"tensor attn_sink has {sink.numel()} values; want [{H}]")

    mod, shim = _load_without_runtime("vllm.v1.attention.ops.rocm_aiter_mla_sparse")
    sparse_len = max(counts) if counts else 0
    if splits_opt is not None:
        try:
            S = int(splits_opt)
        except ValueError:
            raise BadInput(f"option num_splits={splits_opt!r} is not an integer") from None
        if S < 1:
            raise BadInput(f"option num_splits={S}: want at least 1")
        why = "option num_splits"
    else:
        S = mod.rocm_sparse_decode_bf16_num_splits(R, H, sparse_len)
        why = f"rocm_sparse_decode_bf16_num_splits({R}, {H}, {sparse_len}) with _decode_cu_count() = {mod._decode_cu_count()}"
        if S <= 1:
            raise Unsupported(f"the longest row attends {sparse_len} slots: rocm_sparse_decode_bf16_num_splits returns 1 below "
                              f"_SPARSE_DECODE_BF16_MIN_SPLIT_LEN = {mod._SPARSE_DECODE_BF16_MIN_SPLIT_LEN} (rocm_aiter_mla_sparse.py lines "
                              "3842, 3861), and then the backend calls rocm_sparse_attn_prefill, not this kernel (backends/mla/"
                              "rocm_aiter_mla_sparse.py lines 950, 964-977); option num_splits=N runs it anyway")
    bypass = None
    if q.is_cpu:
        launcher, line = _without_cpu_assert(mod, "_rocm_sparse_attn_decode_ragged_bf16_triton")
        mod._rocm_sparse_attn_decode_ragged_bf16_triton = launcher
        bypass = (f"_rocm_sparse_attn_decode_ragged_bf16_triton run without its line {line} `assert not q.is_cpu and not kv.is_cpu "
                  "and not indices.is_cpu and not indptr.is_cpu` (recompiled from the installed source with that one statement "
                  "dropped; Triton's interpreter runs on CPU tensors), the rest of it and of rocm_sparse_attn_decode_bf16 as installed")
    qf = q.reshape(R, H, D).contiguous()
    # NaN, so a value the kernel never stores is visibly not data.
    out = torch.full((R, H, V), float("nan"), dtype=q.dtype, device=q.device)
    mod.rocm_sparse_attn_decode_bf16(
        q=qf, kv=kv, scale=float_param(meta, "softmax_scale"), head_dim=D, nope_head_dim=V, rope_head_dim=D - V,
        attn_sink=sink, output=out, ragged_indices=ragged, ragged_indptr=indptr, num_splits=S,
    )
    m = provenance("vllm", "vllm", "vllm.v1.attention.ops.rocm_aiter_mla_sparse.rocm_sparse_attn_decode_bf16 "
                   "(as ROCM_AITER_MLA_SPARSE _forward_mla calls it)",
                   "; ".join(x for x in (shim, bypass) if x) or None)
    m["kcheck.worker.not_written"] = "lse"
    m["num_splits_kernel"] = str(S)
    m["kcheck.worker.num_splits_from"] = why
    m["kcheck.worker.note"] = (f"ragged rows {counts} (the leading valid slots of each query); nope_head_dim {V}, rope_head_dim {D - V}; "
                               "q heads not padded (AiterMLAHelper.get_mla_padded_q, rocm_aiter_mla.py lines 2084-2107, repeats heads, "
                               "and each head is computed alone: head_mask only)")
    m.update(_sparse_bf16_precision(cache.dtype))
    return {"out": out.reshape(B, s_q, H, V)}, m


mla_decode_sparse.options = ("num_splits",)


def _sparse_bf16_precision(cache_dtype):
    """The declared precision of _sparse_attn_decode_ragged_bf16_partial_kernel
    and _sparse_attn_decode_reduce_kernel (vllm 0.33.0,
    vllm/v1/attention/ops/rocm_aiter_mla_sparse.py):

    - acc_dtype f32: `scores = tl.dot(q, tl.trans(kv)) * scale` (line 2354)
      and `acc = acc * alpha[:, None] + tl.dot(p.to(kv.dtype), kv)` (line
      2364) accumulate in fp32, and the reduce sums the splits' fp32
      partials in fp32 (lines 3448, 3486-3488);
    - p_dtype = the cache's dtype: `p.to(kv.dtype)` (line 2364);
    - softmax_block 32: the running max m_i advances once per BLOCK_K =
      _SPARSE_DECODE_BF16_BLOCK_K = 32 slots (lines 2335, 2357-2358, 3844),
      from each split's first slot.

    The softmax is natural-base, `p = tl.exp(scores - m_new)` (line 2360),
    where kcheck's model is exp2 of log2e-scaled scores: a few fp32 ulp of
    P, below its 16-bit rounding, not declared.
    """
    p = _PRECISION_DTYPES.get(cache_dtype)
    return {
        "acc_dtype": "f32",
        "p_dtype": p,
        "softmax_block": "32",
        "kcheck.worker.precision_source": "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py (vllm 0.33.0) lines 2335, 2354-2364, 3448, 3486-3488, 3844",
    }


def _checked(fn):
    """fn, failing its run when _vllm_package's premise did not hold."""
    import functools

    @functools.wraps(fn)
    def run(tensors, meta, opts):
        outs, m = fn(tensors, meta, opts)
        _check_init_shim(m.get("kcheck.worker.shim"))
        return outs, m

    return run


def kernels(name):
    return {k: _checked(fn) for k, fn in {"mla_decode": mla_decode, "mla_decode_sparse": mla_decode_sparse,
                                          "splitk_combine": splitk_combine, "dsa_indexer": dsa_indexer}.items()}
