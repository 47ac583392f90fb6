"""Small MLA decode loops built from vLLM's and SGLang's real code, for the capture tests.

Loop (below) is vLLM's; SGLangLoop (at the end) is SGLang's.

Each step of each prompt runs what a vLLM DeepSeek layer runs for its KV
latent: the activation quantized to NVFP4 (vllm._custom_ops.scaled_fp4_quant,
through torch.ops._C.scaled_fp4_quant.out), the W4A4 projection
(cutlass_scaled_fp4_mm), the cache write (concat_and_cache_mla, through
torch.ops._C_cache_ops), and on decode steps TRITON_MLA's Triton decode
(decode_attention_fwd, stage 1 and stage 2) under Triton's interpreter; the
output is fed forward. Prompts run one after another over a block allocator
that hands a finished prompt's pages to the next one (page reuse).

The op schemas and Python wrappers are vLLM's own (vllm 0.33.0: its
_C_stable_libtorch library registers the schemas on any machine); their CUDA
kernels cannot run here, so CPU kernels are registered for the three ops:
the NVFP4 ones are torchao's (nvfp4_quantize, to_blocked, f4_unpacked_to_f32)
and the cache write is the contract's semantics in a few torch lines. The
Triton decode is vLLM's kernel itself.

Faults are planted beneath the hook, inside the "kernels", as real bugs are:
  nibble_order     the quantizer packs element 2i in the high nibble
  stale_pages      the cache write skips slots whose entry is not all zero
                   (recycled pages taken as already written: kcheck's stale_pages)
  page_off_by_one  the decode reads logical page j >= 1 from the block
                   table's column j - 1
  lse_base_mixed   stage 2 (the split-K combine) weighs splits by 2^(lse - max)
"""

import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

FAULTS = set()
SOFTMAX_SCALE = 192 ** -0.5 * (0.1 * math.log(40) + 1) ** 2  # deepseek-v3 (reference/CONTRACTS.md §6)
L, R, D = 512, 64, 576

_modules = {}


def modules():
    """vLLM's ops and Triton decode module, and the CPU kernels (once)."""
    if _modules:
        return _modules
    import vllm._C_stable_libtorch  # noqa: F401  registers vLLM's op schemas
    from vllm import _custom_ops as ops

    from kcheck.worker import interp
    from kcheck.worker.vllm import _load

    decode, shim = _load("vllm.v1.attention.ops.triton_decode_attention")
    interp.apply()  # also rounds fp32 -> bf16 to nearest even, as a GPU does
    _register_cpu_kernels()
    _modules.update(ops=ops, decode=decode, shim=shim, real_stage2=decode._decode_softmax_reducev_fwd,
                    real_decode=decode.decode_attention_fwd)
    return _modules


def _unswizzle(flat, rows, cols):
    """The 128x4 swizzled scale layout (reference/CONTRACTS.md §5) back to [rows, cols]."""
    nrb, ncb = (rows + 127) // 128, (cols + 3) // 4
    t = flat.reshape(nrb, ncb, 32, 4, 4).permute(0, 3, 2, 1, 4).reshape(nrb * 128, ncb * 4)
    return t[:rows, :cols]


def _fp4_values(packed, scales_bytes, rows, K):
    from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32, unpack_uint4

    codes = f4_unpacked_to_f32(unpack_uint4(packed.contiguous())).reshape(rows, K // 16, 16)
    s = _unswizzle(scales_bytes.reshape(-1), rows, K // 16).contiguous().view(torch.float8_e4m3fn).float()
    return (codes * s.unsqueeze(-1)).reshape(rows, K)


def _register_cpu_kernels():
    from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize
    from torchao.prototype.mx_formats.utils import to_blocked

    global _libs
    c = torch.library.Library("_C", "IMPL")
    cc = torch.library.Library("_C_cache_ops", "IMPL")
    _libs = (c, cc)

    def quant_out(input, input_scale, is_sf_swizzled_layout, *, output, output_scale):
        # torchao's per_tensor_scale is the dequant direction: 1 / vLLM's global scale.
        scales, packed = nvfp4_quantize(input.contiguous(), 16, per_tensor_scale=(1.0 / input_scale.float()).reshape(1))
        if "nibble_order" in FAULTS:
            packed = ((packed & 0x0F) << 4) | (packed >> 4)
        output.copy_(packed.view(torch.uint8))
        blocked = to_blocked(scales.view(torch.uint8)).reshape(-1)
        output_scale.view(torch.uint8).view(-1).copy_(blocked)

    def fp4_mm(out, a, b, block_scale_a, block_scale_b, alpha):
        K = a.shape[1] * 2
        av = _fp4_values(a, block_scale_a.view(torch.uint8), a.shape[0], K)
        bv = _fp4_values(b, block_scale_b.view(torch.uint8), b.shape[0], K)
        out.copy_((av @ bv.t() * alpha.float()).to(out.dtype))

    def concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale, skip_scale=False):
        assert kv_cache_dtype == "auto"
        flat = kv_cache.view(-1, kv_cache.shape[-1])
        rows = torch.cat([kv_c, k_pe], dim=-1).to(kv_cache.dtype)
        for i, slot in enumerate(slot_mapping.tolist()):
            if slot < 0:
                continue
            if "stale_pages" in FAULTS and bool((flat[slot] != 0).any()):
                continue
            flat[slot] = rows[i]

    c.impl("scaled_fp4_quant.out", quant_out, "CPU")
    c.impl("cutlass_scaled_fp4_mm", fp4_mm, "CPU")
    cc.impl("concat_and_cache_mla", concat_and_cache_mla, "CPU")


def _faulty_decode(real):
    def decode_attention_fwd(q, k_buffer, v_buffer, o, lse, req_to_token, b_seq_len, attn_logits, num_kv_splits, sm_scale, page_size=1, logit_cap=0.0, k_scale=None, v_scale=None, is_mla=False):
        bt = req_to_token.clone()
        bt[:, 1:] = req_to_token[:, :-1]
        return real(q, k_buffer, v_buffer, o, lse, bt, b_seq_len, attn_logits, num_kv_splits, sm_scale, page_size, logit_cap, k_scale, v_scale, is_mla)

    return decode_attention_fwd


def _faulty_stage2(real):
    def _decode_softmax_reducev_fwd(logits, q, o, lse, v_buffer, b_seq_len, num_kv_splits):
        mixed = logits.clone()
        mixed[..., -1] *= math.log(2.0)
        return real(mixed, q, o, lse, v_buffer, b_seq_len, num_kv_splits)

    return _decode_softmax_reducev_fwd


class plant:
    """with plant("name"): the loop's kernels carry that fault."""

    def __init__(self, *names):
        self.names = set(names)

    def __enter__(self):
        m = modules()
        FAULTS.update(self.names)
        if "page_off_by_one" in self.names:
            m["decode"].decode_attention_fwd = _faulty_decode(m["real_decode"])
        if "lse_base_mixed" in self.names:
            m["decode"]._decode_softmax_reducev_fwd = _faulty_stage2(m["real_stage2"])
        return self

    def __exit__(self, *exc):
        m = modules()
        FAULTS.difference_update(self.names)
        m["decode"].decode_attention_fwd = m["real_decode"]
        m["decode"]._decode_softmax_reducev_fwd = m["real_stage2"]


def _nvfp4_weight(w):
    """A ModelOpt-style NVFP4 weight (torchao's quantizer), outside the hook:
    engines load weights quantized."""
    from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize
    from torchao.prototype.mx_formats.utils import to_blocked

    gs = torch.tensor(448.0 * 6.0, dtype=torch.float32) / w.float().abs().max()
    scales, packed = nvfp4_quantize(w.contiguous(), 16, per_tensor_scale=(1.0 / gs).reshape(1))
    blocked = to_blocked(scales.view(torch.uint8)).reshape(((w.shape[0] + 127) // 128) * 128, -1)
    return packed.view(torch.uint8), blocked.view(torch.float8_e4m3fn), gs


class Loop:
    """prompts x (one prefill step + `decode_steps` decode steps), B requests."""

    def __init__(self, B=2, H=4, K=64, P=16, NB=8, S=2, prompt_lens=(14, 9), decode_steps=4, prompts=2, seed=0):
        self.B, self.H, self.K, self.P, self.NB, self.S = B, H, K, P, NB, S
        self.prompt_lens, self.decode_steps, self.prompts = prompt_lens, decode_steps, prompts
        g = torch.Generator().manual_seed(seed)
        self.w_kv = _nvfp4_weight((torch.randn(L, K, generator=g) / math.sqrt(K)).bfloat16())
        self.w_pe = (torch.randn(K, R, generator=g) / math.sqrt(K)).bfloat16()
        self.w_q = (torch.randn(K, H * D, generator=g) / math.sqrt(K)).bfloat16()
        self.w_o = (torch.randn(H * L, K, generator=g) / math.sqrt(H * L)).bfloat16()
        self.x0 = [[torch.randn(n, K, generator=g).bfloat16() for n in prompt_lens] for _ in range(prompts)]

    def _project(self, ops, x):
        """The latent projection as vLLM's NVFP4 linear runs it: quantize the
        activation, then the W4A4 GEMM."""
        gs = (torch.tensor(448.0 * 6.0) / x.float().abs().max()).reshape(1)
        a, a_scale = ops.scaled_fp4_quant(x, gs)
        b, b_scale, gw = self.w_kv
        alpha = (1.0 / (gs * gw)).reshape(())
        kv_c = ops.cutlass_scaled_fp4_mm(a, b, a_scale, b_scale, alpha, torch.bfloat16)
        k_pe = (x @ self.w_pe).bfloat16()
        return kv_c, k_pe

    def run(self):
        """Runs every prompt; returns every decode output (o), in order."""
        m = modules()
        ops, dec = m["ops"], m["decode"]
        B, H, P = self.B, self.H, self.P
        cache = torch.zeros(self.NB, P, D, dtype=torch.bfloat16)
        free = list(range(self.NB))[::-1]
        outs = []
        for prompt in range(self.prompts):
            lens = list(self.prompt_lens)
            pages = max((n + self.decode_steps + P - 1) // P for n in lens)
            blocks = [[free.pop() for _ in range(pages)] for _ in range(B)]
            block_table = torch.tensor(blocks, dtype=torch.int32)
            # Prefill: every prompt token's latent written to the cache.
            x = torch.cat(self.x0[prompt])
            slots = torch.tensor([blocks[b][t // P] * P + t % P for b in range(B) for t in range(lens[b])], dtype=torch.int64)
            kv_c, k_pe = self._project(ops, x)
            ops.concat_and_cache_mla(kv_c, k_pe, cache, slots, "auto", torch.tensor(1.0))
            ends = torch.tensor(lens).cumsum(0) - 1
            h = x[ends]  # each request's last token
            for _ in range(self.decode_steps):
                pos = lens
                slots = torch.tensor([blocks[b][pos[b] // P] * P + pos[b] % P for b in range(B)], dtype=torch.int64)
                kv_c, k_pe = self._project(ops, h)
                ops.concat_and_cache_mla(kv_c, k_pe, cache, slots, "auto", torch.tensor(1.0))
                lens = [n + 1 for n in lens]
                q = (h @ self.w_q).bfloat16().reshape(B, H, D)
                o = torch.zeros(B, H, L, dtype=torch.bfloat16)
                # vLLM's forward_mqa allocates lse in q's dtype (triton_mla.py
                # line 265); kcheck reads an F32 lse only until issue 16, so
                # the loop hands the kernel an fp32 buffer.
                lse = torch.zeros(B, H, dtype=torch.float32)
                logits = torch.empty(B, H, self.S, L + 1, dtype=torch.float32)
                kv = cache.unsqueeze(2)
                dec.decode_attention_fwd(q, kv, kv[..., :L], o, lse, block_table, torch.tensor(lens, dtype=torch.int32),
                                         logits, self.S, SOFTMAX_SCALE, P, is_mla=True)
                outs.append(o.clone())
                h = (o.reshape(B, H * L) @ self.w_o).bfloat16()
                h = (h.float() / h.float().pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-6)).bfloat16()
            for b in range(B):
                free.extend(reversed(blocks[b]))  # freed pages go back, to be reused first
        return outs, cache


# --- SGLang -------------------------------------------------------------------
#
# The same model, served as SGLang 0.5.23's TritonAttnBackend serves an MLA
# layer in decode with decode-context parallelism over two ranks (dcp_size
# 2, triton_backend.py forward_decode, lines 2422-2466): each rank holds
# its share of every request's tokens in its own token-major pool
# (MLATokenToKVPool: [tokens, 1, 576], page size 1, here token t on rank t %
# 2), runs decode_attention_fwd_grouped over its token lists (kv_indptr /
# kv_indices) into an fp32 o with attn_lse filled with -inf first, and takes
# local_lse = torch.logsumexp(attn_lse, -1); the ranks' states are then
# merged. SGLang merges them across ranks (cp_lse_ag_out_rs_mha); one
# process has both states at hand, so the loop merges them with SGLang's
# merge_state (sglang/srt/layers/attention/merge_state.py, its Triton kernel
# on the CPU), the same two-state merge. The pool write is SGLang's Python
# scatter (set_mla_kv_buffer), not a kernel the hook sees.
#
# decode_attention_fwd_grouped is called as TritonAttnBackend calls it for
# MLA (kcheck.worker.sglang.mla_decode does the same): v_buffer the pool's
# first L columns, num_kv_splits filled with max_kv_splits (the CPU has no
# core count: get_num_kv_splits, line 450), sm_scale_withk the layer's
# scaling (bf16 pool: k_scale 1), v_scale 1, has_mla.
#
# Faults, beneath the hook:
#   token_off_by_one  the decode reads position p >= 36 of a request's
#                     token list from position p - 1 (a token-list
#                     off-by-one: first shows when a rank holds 37 tokens
#                     of a request, request 1 on rank 0 at step 2)
#   lse_base_mixed    stage 2 (the split-K combine) weighs splits by
#                     2^(lse - max)

SGL_FAULTS = set()
_sgl = {}


def sglang_modules():
    if _sgl:
        return _sgl
    from sglang.kernels.ops.attention import decode_attention as dec
    from sglang.srt.layers.attention import merge_state as ms

    from kcheck.worker import interp

    interp.apply()
    _sgl.update(decode=dec, merge=ms, real_decode=dec.decode_attention_fwd_grouped, real_stage2=dec._decode_softmax_reducev_fwd)
    return _sgl


def _sgl_faulty_decode(real):
    def decode_attention_fwd_grouped(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse, num_kv_splits,
                                     max_kv_splits, sm_scale_withk, v_scale, *args, **kwargs):
        shifted = kv_indices.clone()
        p = kv_indptr.tolist()
        for b in range(len(p) - 1):
            lo, hi = p[b], p[b + 1]
            if hi - lo > 36:
                shifted[lo + 36:hi] = kv_indices[lo + 35:hi - 1]
        return real(q, k_buffer, v_buffer, o, kv_indptr, shifted, attn_logits, attn_lse, num_kv_splits, max_kv_splits,
                    sm_scale_withk, v_scale, *args, **kwargs)

    return decode_attention_fwd_grouped


def _sgl_faulty_stage2(real):
    def _decode_softmax_reducev_fwd(logits, lse, *args, **kwargs):
        return real(logits, lse * math.log(2.0), *args, **kwargs)

    return _decode_softmax_reducev_fwd


class sglang_plant:
    """with sglang_plant("name"): the SGLang loop's kernels carry that fault."""

    def __init__(self, *names):
        self.names = set(names)

    def __enter__(self):
        m = sglang_modules()
        SGL_FAULTS.update(self.names)
        if "token_off_by_one" in self.names:
            m["decode"].decode_attention_fwd_grouped = _sgl_faulty_decode(m["real_decode"])
        if "lse_base_mixed" in self.names:
            m["decode"]._decode_softmax_reducev_fwd = _sgl_faulty_stage2(m["real_stage2"])
        return self

    def __exit__(self, *exc):
        m = sglang_modules()
        SGL_FAULTS.difference_update(self.names)
        m["decode"].decode_attention_fwd_grouped = m["real_decode"]
        m["decode"]._decode_softmax_reducev_fwd = m["real_stage2"]


class SGLangLoop:
    """One prompt of B requests, prefill written to the pools, then
    `decode_steps` decode steps over two DCP ranks; S = max_kv_splits."""

    RANKS = 2

    def __init__(self, B=2, H=2, K=64, S=2, prompt_lens=(66, 70), decode_steps=3, seed=1):
        self.B, self.H, self.K, self.S = B, H, K, S
        self.prompt_lens, self.decode_steps = prompt_lens, decode_steps
        g = torch.Generator().manual_seed(seed)
        self.w_kv = (torch.randn(K, D, generator=g) / math.sqrt(K)).bfloat16()
        self.w_q = (torch.randn(K, H * D, generator=g) / math.sqrt(K)).bfloat16()
        self.w_o = (torch.randn(H * L, K, generator=g) / math.sqrt(H * L)).bfloat16()
        self.x0 = [torch.randn(n, K, generator=g).bfloat16() for n in prompt_lens]

    def run(self):
        """Returns every decode step's merged output and the pools."""
        m = sglang_modules()
        dec, ms = m["decode"], m["merge"]
        B, H, S, R = self.B, self.H, self.S, self.RANKS
        size = sum(self.prompt_lens) + B * self.decode_steps
        # MLATokenToKVPool: size + page_size rows, slot 0 the padding slot.
        pools = [torch.zeros(size // R + B + 1, 1, D, dtype=torch.bfloat16) for _ in range(R)]
        next_slot = [1] * R
        slots = [[[] for _ in range(B)] for _ in range(R)]  # rank -> request -> its tokens' slots

        def write(b, t, latent):
            r = t % R
            s = next_slot[r]
            next_slot[r] += 1
            slots[r][b].append(s)
            pools[r][s, 0] = latent  # set_mla_kv_buffer: the pool's scatter

        for b, x in enumerate(self.x0):
            for t, latent in enumerate((x @ self.w_kv).bfloat16()):
                write(b, t, latent)
        lens = list(self.prompt_lens)
        h = torch.stack([x[-1] for x in self.x0])
        outs = []
        for _ in range(self.decode_steps):
            for b, latent in enumerate((h @ self.w_kv).bfloat16()):
                write(b, lens[b], latent)
            lens = [n + 1 for n in lens]
            q = (h @ self.w_q).bfloat16().reshape(B, H, D)
            states = []
            for r in range(R):
                n = [len(slots[r][b]) for b in range(B)]
                kv_indptr = torch.zeros(B + 1, dtype=torch.int32)
                kv_indptr[1:] = torch.tensor(n).cumsum(0).to(torch.int32)
                kv_indices = torch.tensor([s for b in range(B) for s in slots[r][b]], dtype=torch.int64)
                attn_logits = torch.empty(B, H, S, L, dtype=torch.float32)
                attn_lse = torch.empty(B, H, S, dtype=torch.float32)
                attn_lse.fill_(-float("inf"))
                num_kv_splits = torch.empty(B, dtype=torch.int32)
                num_kv_splits.fill_(S)
                o = torch.empty(B, H, L, dtype=torch.float32)
                kv = pools[r]
                dec.decode_attention_fwd_grouped(q, kv, kv[..., :L], o, kv_indptr, kv_indices, attn_logits, attn_lse,
                                                 num_kv_splits, S, SOFTMAX_SCALE, 1.0, has_mla=True)
                states.append((o, torch.logsumexp(attn_lse, dim=-1)))
            (o0, l0), (o1, l1) = states
            o, _ = ms.merge_state(o0, l0, o1, l1)
            outs.append(o.clone())
            h = (o.reshape(B, H * L).bfloat16() @ self.w_o).bfloat16()
            h = (h.float() / h.float().pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-6)).bfloat16()
        return outs, pools
