#!/usr/bin/env python3
"""The numpy check a user would write of a kcheck capture, one per kernel.

Usage: numpy_checks.py FILE...      one JSON line per file
       numpy_checks.py --selftest   the encoders against their definitions

Each FILE is a kcheck evidence file (.safetensors, reference/CONTRACTS.md
§1). The script reads it with its own parser (8-byte header length,
JSON header, data mapped with np.memmap), checks the kernel's outputs against
the contract's semantics (section 3) the way a numpy user would (array_equal
of the unwritten rows, a fancy-index gather and compare, a float64 softmax or
matmul and an allclose), and prints {"file", "kernel", "verdict" ("pass" |
"fail" | "error"), "failing" (elements that fail, per output tensor),
"worst" (the largest error over its tolerance where a tolerance applies),
"seconds" (reading and checking, after the interpreter and numpy have
started), "vmhwm" (this process's peak RSS, bytes), "error"}.

It is written from the contract, independently of kcheck's Go code: bf16 is
widened by its bits; E4M3 and E2M1 are decoded from their definitions (OCP
MX) and encoded by round-to-nearest-even, saturating, as the CUDA writers'
__NV_SATFINITE conversions do; the swizzled 128x4 scale layout is undone with
a reshape and a transpose of section 5. Tolerances are the simple ones a user
would pick for the output dtype: bitwise for cache writes and quantized
codes (a code that differs only where the exact value lies within a few
fp32 ulps of a rounding midpoint is accepted, as section 1.1 says), one to
two units in the last place of the output dtype for the gathers and
dequantize, and for the float64 combine and GEMM answers rtol = 2^-7 plus
2^-8 of the row's rms (a bf16 output's rounding, with room for fp32
accumulation); MLA decode's atol is 2^-8 of sum_j p_j |v_j| instead, twice
the error of rounding P to bf16, for out and each split-K partial_out (section
3.6.1). An lse (MLA decode's and its partial_lse, the combine's) may
differ by what section 1.1 allows a correct fp32 kernel: the stored dtype's
rounding, the fp32 sum of its n terms (Higham's gamma_n, for an order not
known) and, for MLA, the score noise (see lse_close). They are not kcheck's
three-way tolerances; the
harness's test holds each check to kcheck's verdict on passing and failing
captures, which is what makes it a check with teeth.
"""
import json
import os
import struct
import sys
import time

import numpy as np

DTYPES = {
    "BF16": np.dtype("<u2"), "F16": np.dtype("<f2"), "F32": np.dtype("<f4"), "F64": np.dtype("<f8"),
    "U8": np.dtype("u1"), "I8": np.dtype("i1"), "F8_E4M3": np.dtype("u1"), "F8_E5M2": np.dtype("u1"),
    "F8_E8M0": np.dtype("u1"), "I16": np.dtype("<i2"), "I32": np.dtype("<i4"), "I64": np.dtype("<i8"),
    "U16": np.dtype("<u2"), "U32": np.dtype("<u4"), "U64": np.dtype("<u8"), "BOOL": np.dtype("u1"),
}


class Unusable(Exception):
    """A file this script cannot check: named input, named problem."""


def load(path):
    """The tensors (memory-mapped, bf16 as uint16 bits), their dtype names and the metadata."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise Unusable("%s: %d bytes, shorter than a safetensors header length" % (path, size))
        n = struct.unpack("<Q", head)[0]
        if n > min(size - 8, 100 << 20):
            raise Unusable("%s: header length %d does not fit in the file (%d bytes)" % (path, n, size))
        header = json.loads(f.read(n))
    meta = header.pop("__metadata__", {}) or {}
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    base = 8 + n
    tensors, dtypes = {}, {}
    for name, t in header.items():
        dt = DTYPES.get(t["dtype"])
        if dt is None:
            raise Unusable("%s: tensor %s has dtype %s, which this script does not read" % (path, name, t["dtype"]))
        b, e = t["data_offsets"]
        shape = tuple(t["shape"])
        if not 0 <= b <= e <= size - base or (e - b) != dt.itemsize * int(np.prod(shape, dtype=np.int64)):
            raise Unusable("%s: tensor %s: offsets %d..%d do not hold %s %s" % (path, name, b, e, t["dtype"], list(shape)))
        tensors[name] = mm[base + b:base + e].view(dt).reshape(shape)
        dtypes[name] = t["dtype"]
    return tensors, dtypes, meta


def need(t, *names):
    missing = [n for n in names if n not in t]
    if missing:
        raise Unusable("missing tensor(s) %s" % ", ".join(missing))
    return [t[n] for n in names]


# ---- scalar formats ---------------------------------------------------------

def bf16_to_f32(u16):
    return (np.asarray(u16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x):
    """Round float32 to bf16 bits, nearest even (NaN stays NaN)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32)
    r = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), r)


def e4m3_table():
    """E4M3FN value of each code: bias 7, subnormals at exponent 0, S.1111.111 NaN."""
    c = np.arange(256)
    e, m = (c >> 3) & 0xF, c & 7
    v = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7.0))
    v = np.where(c & 0x80, -v, v)
    v[(c & 0x7F) == 0x7F] = np.nan
    return v


E4M3 = e4m3_table()
E4M3_F32 = E4M3.astype(np.float32)
E4M3_POS = E4M3[:0x7F]  # codes 0..126: the finite magnitudes, increasing with the code
E2M1_POS = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
E2M1 = np.concatenate([E2M1_POS, -E2M1_POS])


def e4m3_from_f32(x):
    """E4M3FN codes of float32 values: nearest even, saturating to +-448, NaN 0x7F."""
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32)
    sign = ((u >> 24) & np.uint32(0x80)).astype(np.uint8)
    mag = u & np.uint32(0x7FFFFFFF)
    # normal: keep 3 mantissa bits, rounding to nearest even; rebias 127 -> 7
    rounded = (mag + np.uint32(0x7FFFF) + ((mag >> 20) & np.uint32(1))) >> 20
    normal = rounded.astype(np.int64) - (120 << 3)
    # below 2^-6: multiples of 2^-9 (np.rint rounds half to even)
    a = np.abs(x)
    sub = np.rint(a * np.float32(512)).astype(np.int64)
    code = np.where(a < np.float32(2.0 ** -6), sub, normal)
    code = np.where(a > np.float32(448), 0x7E, code)
    code = np.where(np.isnan(x), 0x7F, np.minimum(code, 0x7E))
    return code.astype(np.uint8) | sign


def nearest_code(values, table, tie_even=True):
    """Codes of the nearest table magnitude (table increasing, code = index), ties to the even code."""
    a = np.abs(values)
    hi = np.clip(np.searchsorted(table, a, side="left"), 1, len(table) - 1)
    lo = hi - 1
    dlo, dhi = a - table[lo], table[hi] - a
    code = np.where(dlo < dhi, lo, hi)
    tie = dlo == dhi
    code = np.where(tie & (lo % 2 == 0), lo, code)
    code = np.where(a >= table[-1], len(table) - 1, code)  # saturate
    return code


def near_midpoint(v, a_val, b_val, ulps=4):
    """|v| lies within `ulps` fp32 ulps of the midpoint of two neighbouring codes' values."""
    mid = (np.abs(a_val) + np.abs(b_val)) / 2
    return np.abs(np.abs(v) - mid) <= ulps * 2.0 ** -23 * np.maximum(mid, 2.0 ** -126)


def neighbours(table, ca, cb):
    return np.abs(ca.astype(np.int64) - cb.astype(np.int64)) == 1


def unswizzle(s, rows, cols):
    """Section 5: [M_pad/128, K_pad/4, 32, 4, 4] back to the row-major [rows, cols] scales."""
    mp, kp = -(-rows // 128) * 128, -(-cols // 4) * 4
    flat = np.asarray(s).reshape(-1)
    if flat.size != mp * kp:
        raise Unusable("swizzled scales hold %d bytes, want %d for [%d, %d] padded to [%d, %d]" % (flat.size, mp * kp, rows, cols, mp, kp))
    a = flat.reshape(mp // 128, kp // 4, 32, 4, 4).transpose(0, 3, 2, 1, 4).reshape(mp, kp)
    return a[:rows, :cols]


def scales_of(t, meta, rows, cols, key="scale_layout"):
    layout = meta.get(key, "linear")
    if layout == "linear":
        return np.asarray(t).reshape(rows, cols)
    if layout == "swizzled_128x4":
        return unswizzle(t, rows, cols)
    raise Unusable("%s = %r: want linear or swizzled_128x4" % (key, layout))


def scalar(t, name):
    v = np.asarray(t, dtype=np.float64).reshape(-1)
    if v.size != 1:
        raise Unusable("tensor %s holds %d values, want one" % (name, v.size))
    return float(v[0])


def values(t, dtype):
    """Float values of an output tensor (bf16 from its bits)."""
    if dtype == "BF16":
        return bf16_to_f32(t)
    if dtype in ("F16", "F32", "F64"):
        return np.asarray(t)
    raise Unusable("output dtype %s: want BF16, F16 or F32" % dtype)


def ulp_rtol(dtype):
    """A relative tolerance of one to two units in the last place of dtype."""
    return {"BF16": 2.0 ** -7, "F16": 2.0 ** -10, "F32": 2.0 ** -23, "F64": 2.0 ** -52}[dtype]


# ---- checks -----------------------------------------------------------------

class Result:
    def __init__(self):
        self.failing, self.worst = {}, None

    def count(self, name, n):
        self.failing[name] = self.failing.get(name, 0) + int(n)

    def excess(self, w):
        w = float(w)
        self.worst = w if self.worst is None else max(self.worst, w)


def allclose_rows(res, name, actual, ref, rtol, magnitude=None):
    """|actual - ref| <= rtol*|ref| + 2^-8 * magnitude (default: the rms of ref's row,
    the last axis): counts and the worst ratio."""
    ref = np.asarray(ref, dtype=np.float64)
    a = np.asarray(actual, dtype=np.float64)
    if magnitude is None:
        magnitude = np.sqrt(np.mean(ref * ref, axis=-1, keepdims=True))
    tol = rtol * np.abs(ref) + 2.0 ** -8 * magnitude
    with np.errstate(invalid="ignore"):
        err = np.abs(a - ref)
    same_special = (np.isnan(a) & np.isnan(ref)) | (np.isinf(ref) & (a == ref))
    bad = ~((err <= tol) | same_special)
    res.count(name, np.count_nonzero(bad))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(same_special, 0, err / np.where(tol > 0, tol, np.inf))
    res.excess(np.nanmax(np.where(np.isnan(ratio), np.inf, ratio)) if ratio.size else 0)


U32 = 2.0 ** -24  # fp32's unit roundoff: the accumulator of every reduction (section 1.1)


def normal_tail(count, alpha=1e-3):
    """kappa such that the largest of `count` independent normal draws of rms 1 exceeds
    kappa with probability at most alpha: sqrt(2 ln(2 count / alpha))."""
    return np.sqrt(2 * np.log(2 * max(int(count), 1) / alpha))


def lse_close(res, name, actual, dtype, ref, terms, noise=0.0, base2=False):
    """An lse stored as dtype (natural log, or log2 with base2) against the float64
    reference, within what a correct fp32 kernel may differ by (section 1.1), summed:
    - the stored value's rounding: one to two ulps of dtype times |ref| (which also
      covers the fp32 addition m + log(sum));
    - the fp32 sum of `terms` positive numerators: Higham's gamma_n = n u/(1 - n u)
      bounds its relative error whatever the order, and the log moves by as much. No
      tighter bound holds for an order not known: a sequential sum of 131072 tokens,
      half of them under half an ulp of the running sum, errs by 2.7e-4, all one way,
      where the probabilistic lambda sqrt(n) u (lambda ~ 7) allows 1.5e-4;
    - 8 u for the numerators' approximate exp, the exponent's subtraction and the log;
    - the score noise (MLA only): the rms that each score's own fp32 dot, in another
      order, puts into the lse, p-weighted (section 1.1), times the normal tail of the
      element count.
    `terms` and `noise` broadcast against ref."""
    ref = np.asarray(ref, dtype=np.float64)
    a = np.asarray(values(actual, dtype), dtype=np.float64)
    nu = np.asarray(terms, dtype=np.float64) * U32
    with np.errstate(divide="ignore"):
        gamma = np.where(nu < 1, nu / (1 - nu), np.inf)  # past n u = 1 the bound says nothing
    spread = gamma + 8 * U32 + normal_tail(ref.size) * np.asarray(noise, dtype=np.float64)
    if base2:
        spread = spread / np.log(2)
    tol = ulp_rtol(dtype) * np.abs(np.where(np.isfinite(ref), ref, 0)) + spread
    same_special = (np.isinf(ref) & (a == ref)) | (np.isnan(a) & np.isnan(ref))
    with np.errstate(invalid="ignore"):
        err = np.abs(a - ref)
    bad = ~((err <= tol) | same_special)
    res.count(name, np.count_nonzero(bad))
    with np.errstate(invalid="ignore"):
        ratio = np.where(same_special, 0, err / tol)
    res.excess(np.nanmax(np.where(np.isnan(ratio), np.inf, ratio)) if ratio.size else 0)


def fp8_codes_match(res, name, actual, expected, exact_quotient):
    """E4M3 codes against the expected ones; a one-step difference is accepted where
    the exact quotient lies within fp32 rounding of the midpoint of the two codes."""
    diff = actual != expected
    if not diff.any():
        return
    a, e, v = actual[diff], expected[diff], exact_quotient[diff]
    ok = neighbours(E4M3, a & 0x7F, e & 0x7F) & ((a & 0x80) == (e & 0x80)) & near_midpoint(v, E4M3[a], E4M3[e])
    res.count(name, np.count_nonzero(~ok))


def ds_mla_scales(amax, convention):
    """fp8_ds_mla tile scales (float32) from tile amaxes, per ds_mla_scale (CONTRACTS 3.4)."""
    q = (amax.astype(np.float32) / np.float32(448)).astype(np.float32)
    if convention == "amax":
        return np.maximum(q, np.finfo(np.float32).tiny)
    if convention == "pow2":
        q = np.maximum(q, np.float32(1e-4))
        m, e = np.frexp(q.astype(np.float64))
        e = np.where(m == 0.5, e - 1, e)
        return np.ldexp(1.0, e).astype(np.float32)
    raise Unusable("ds_mla_scale = %r: want amax or pow2" % convention)


def kv_cache_write(t, dt, meta, res):
    kind, page = meta.get("kv_cache_dtype", "bf16"), int(meta.get("page_size", "0") or 0)
    before, after, kvc, kpe, slots = need(t, "cache_before", "cache_after", "kv_c", "k_pe", "slot_mapping")
    if before.shape != after.shape or len(before.shape) != 3 or before.shape[1] != page:
        raise Unusable("cache_before %s / cache_after %s: want the same [NB, page_size=%d, W]" % (before.shape, after.shape, page))
    nb, _, width = before.shape
    rows_before, rows_after = before.reshape(nb * page, width), after.reshape(nb * page, width)
    slots = np.asarray(slots, dtype=np.int64)
    if slots.size and slots.max() >= nb * page:
        raise Unusable("slot_mapping holds slot %d, past the cache's %d slots" % (slots.max(), nb * page))
    tok = np.nonzero(slots >= 0)[0]
    s = slots[tok]
    # every unwritten row is unchanged
    unwritten = np.ones(nb * page, dtype=bool)
    unwritten[s] = False
    if not np.array_equal(rows_after[unwritten], rows_before[unwritten]):
        res.count("cache_after", np.count_nonzero(rows_after[unwritten] != rows_before[unwritten]))
    if kind == "bf16":
        # every written row holds [kv_c | k_pe], bit for bit (a fancy-index gather and compare)
        expected = np.concatenate([kvc[tok], kpe[tok]], axis=1)
        got = rows_after[s]
        if not np.array_equal(got, expected):
            res.count("cache_after", np.count_nonzero(got != expected))
        return
    if dt.get("kv_c") != "BF16" or dt.get("k_pe") != "BF16":
        raise Unusable("kv_c %s, k_pe %s: this check reads BF16 inputs" % (dt.get("kv_c"), dt.get("k_pe")))
    chunk = 1 << 15  # tokens at a time: fp8 rows expand fourfold as float32
    if kind == "fp8_e4m3":
        ks = np.float32(scalar(need(t, "k_scale")[0], "k_scale"))
        for i in range(0, len(tok), chunk):
            tk, sl = tok[i:i + chunk], s[i:i + chunk]
            x = bf16_to_f32(np.concatenate([kvc[tk], kpe[tk]], axis=1))
            fp8_codes_match(res, "cache_after", rows_after[sl], e4m3_from_f32(x / ks), x.astype(np.float64) / float(ks))
        return
    if kind == "fp8_ds_mla":
        if width != 656 or kvc.shape[1] != 512 or kpe.shape[1] != 64:
            raise Unusable("fp8_ds_mla wants 656-byte entries of 512 latent and 64 rope values")
        convention = meta.get("ds_mla_scale", "amax")
        for i in range(0, len(tok), chunk):
            tk, sl = tok[i:i + chunk], s[i:i + chunk]
            got = rows_after[sl]
            x = bf16_to_f32(kvc[tk]).reshape(-1, 4, 128)
            scale = ds_mla_scales(np.abs(x).max(axis=2), convention)  # [n, 4]
            want_scale = scale.view(np.uint8).reshape(-1, 16)
            res.count("cache_after", np.count_nonzero(got[:, 512:528] != want_scale))
            q = x / scale[:, :, None]
            fp8_codes_match(res, "cache_after", got[:, :512], e4m3_from_f32(q).reshape(-1, 512),
                            (x.astype(np.float64) / scale[:, :, None].astype(np.float64)).reshape(-1, 512))
            rope = np.ascontiguousarray(kpe[tk]).view(np.uint8).reshape(-1, 128)
            res.count("cache_after", np.count_nonzero(got[:, 528:] != rope))
        return
    raise Unusable("kv_cache_dtype = %r: want bf16, fp8_e4m3 or fp8_ds_mla" % kind)


def decode_cache_rows(rows, kind, t):
    """Float32 [n, 576] of cache rows (the contract's read: e4m3 * scale)."""
    if kind == "bf16":
        return bf16_to_f32(rows)
    if kind == "fp8_e4m3":
        return E4M3_F32[rows] * np.float32(scalar(need(t, "k_scale")[0], "k_scale"))
    if kind == "fp8_ds_mla":
        scale = np.ascontiguousarray(rows[:, 512:528]).view(np.float32)  # [n, 4]
        latent = (E4M3_F32[rows[:, :512]].reshape(-1, 4, 128) * scale[:, :, None]).reshape(-1, 512)
        rope = bf16_to_f32(np.ascontiguousarray(rows[:, 528:656]).view(np.uint16))
        return np.concatenate([latent, rope], axis=1)
    raise Unusable("kv_cache_dtype = %r: want bf16, fp8_e4m3 or fp8_ds_mla" % kind)


def request_rows(cache, bt, n, page):
    """The n cache rows of one request, through its block-table row."""
    nb, _, width = cache.shape
    blocks = np.asarray(bt[:(n + page - 1) // page], dtype=np.int64)
    if blocks.size and (blocks.min() < 0 or blocks.max() >= nb):
        raise Unusable("block_table names block %d of a %d-block cache" % (blocks.max() if blocks.max() >= nb else blocks.min(), nb))
    return cache[blocks].reshape(-1, width)[:n]


def kv_cache_gather(t, dt, meta, res):
    kind, page = meta.get("kv_cache_dtype", "bf16"), int(meta.get("page_size", "0") or 0)
    cache, bt, sl, gathered = need(t, "cache", "block_table", "seq_lens", "gathered")
    sl = np.asarray(sl, dtype=np.int64)
    cu = np.concatenate([[0], np.cumsum(sl)])
    if gathered.shape[0] != cu[-1]:
        raise Unusable("gathered has %d rows, seq_lens sum to %d" % (gathered.shape[0], cu[-1]))
    out_dt = dt["gathered"]
    for b in range(len(sl)):
        rows = request_rows(cache, bt[b], int(sl[b]), page)
        got = gathered[cu[b]:cu[b + 1]]
        if kind == "bf16" and out_dt == "BF16":
            if not np.array_equal(rows, got):
                res.count("gathered", np.count_nonzero(rows != got))
            continue
        want = decode_cache_rows(rows, kind, t)
        if out_dt == "BF16":
            want = bf16_to_f32(f32_to_bf16_bits(want))
        a = values(got, out_dt).astype(np.float32)
        bad = ~(np.abs(a - want) <= ulp_rtol(out_dt) * np.abs(want))
        res.count("gathered", np.count_nonzero(bad))


def attend(s, k, lat, qinf, scale):
    """One request's heads over the tokens of s ([H, n] scaled scores, overwritten): the
    float64 out, sum_j p_j |v_j|, the natural lse and that lse's score noise. No token:
    out 0 and lse -inf, as the contract writes an empty split."""
    heads, n = s.shape
    if n == 0:
        return np.zeros((heads, lat)), np.zeros((heads, lat)), np.full(heads, -np.inf), np.zeros(heads)
    m = s.max(axis=1, keepdims=True)
    e = np.exp(s - m)
    den = e.sum(axis=1)
    out = (e @ k[:, :lat]) / den[:, None]
    # sum_j p_j |v_j|: the scale of the error that rounding P to bf16 (2^-9 of each
    # p_j) makes, which a peaked softmax puts on single tokens' values
    mag = (e @ np.abs(k[:, :lat])) / den[:, None]
    lse = m[:, 0] + np.log(den)
    # section 1.1's score noise, u/sqrt3 (sqrt(D/2) |q|_inf |k_j|_2 + sqrt(D/3) |q.k_j|),
    # p-weighted and times the softmax scale (|s_j| = scale |q.k_j| already carries
    # it); einsum, so that no [n, D] or [H, n] temporary is made
    d = k.shape[1]
    c1, c2 = U32 / np.sqrt(3) * np.sqrt(d / 2), U32 / np.sqrt(3) * np.sqrt(d / 3)
    k_norm = np.sqrt(np.einsum("jd,jd->j", k, k))
    np.abs(s, out=s)
    noise = (c1 * scale * qinf * (e @ k_norm) + c2 * np.einsum("hj,hj->h", e, s)) / den
    return out, mag, lse, noise


def split_bounds(t, meta, sl, splits):
    """[B, S+1] token bounds of the splits (section 3.6.1): split_bounds when given, else
    ceil(seq_len / S) tokens a split, the last fewer, trailing splits empty."""
    if "num_splits" in meta and int(meta["num_splits"]) != splits:
        raise Unusable("num_splits = %s, but the partials hold %d splits" % (meta["num_splits"], splits))
    if "split_bounds" in t:
        sb = np.asarray(t["split_bounds"], dtype=np.int64)
        if sb.shape != (len(sl), splits + 1):
            raise Unusable("split_bounds %s, but the partials hold %d splits of %d requests" % (list(sb.shape), splits, len(sl)))
        if (sb[:, 0] != 0).any() or (np.diff(sb, axis=1) < 0).any() or (sb[:, -1] != sl).any():
            raise Unusable("split_bounds: each row must start at 0, not decrease and end at its seq_len")
        return sb
    per = -(-sl // splits)
    return np.minimum(per[:, None] * np.arange(splits + 1)[None, :], sl[:, None])


def mla_decode(t, dt, meta, res):
    if meta.get("kv_cache_dtype", "bf16") != "bf16":
        raise Unusable("mla_decode over a %s cache: this check reads bf16 caches" % meta.get("kv_cache_dtype"))
    q, cache, bt, sl, out, lse = need(t, "q", "kv_cache", "block_table", "seq_lens", "out", "lse")
    if "softmax_scale" not in meta:
        raise Unusable("metadata softmax_scale missing (the contract gives it no default)")
    bsz, sq, heads, d = q.shape
    if sq != 1:
        raise Unusable("s_q = %d: this check does s_q = 1" % sq)
    page, scale, lat = cache.shape[1], float(meta["softmax_scale"]), out.shape[-1]
    base2 = meta.get("lse_base", "e") == "2"
    sl = np.asarray(sl, dtype=np.int64)
    # split-K partials, [B, s_q, H, S, L] and [B, s_q, H, S], checked when present
    pname = [x for x in ("partial_out", "partial_lse") if x in t]
    splits = t[pname[0]].shape[3] if pname else 0
    bounds = split_bounds(t, meta, sl, splits) if pname else None
    ref_out, ref_mag = np.empty((bsz, sq, heads, lat)), np.empty((bsz, sq, heads, lat))
    ref_lse, lse_noise = np.empty((bsz, heads, sq)), np.empty((bsz, heads, sq))
    p_out, p_mag = np.empty((bsz, sq, heads, splits, lat)), np.empty((bsz, sq, heads, splits, lat))
    p_lse, p_noise = np.empty((bsz, sq, heads, splits)), np.empty((bsz, sq, heads, splits))
    for b in range(bsz):
        n = int(sl[b])
        k = bf16_to_f32(request_rows(cache, bt[b], n, page)).astype(np.float64)
        qb = bf16_to_f32(q[b, 0]).astype(np.float64)
        qinf = np.abs(qb).max(axis=1)
        s = (qb @ k.T) * scale
        for i in range(splits):
            lo, hi = bounds[b, i], bounds[b, i + 1]
            p_out[b, 0, :, i], p_mag[b, 0, :, i], p_lse[b, 0, :, i], p_noise[b, 0, :, i] = \
                attend(s[:, lo:hi].copy(), k[lo:hi], lat, qinf, scale)
        ref_out[b, 0], ref_mag[b, 0], ref_lse[b, :, 0], lse_noise[b, :, 0] = attend(s, k, lat, qinf, scale)
    if base2:
        ref_lse /= np.log(2)
        p_lse /= np.log(2)
    allclose_rows(res, "out", values(out, dt["out"]), ref_out, ulp_rtol(dt["out"]), ref_mag)
    lse_close(res, "lse", lse, dt["lse"], ref_lse, sl[:, None, None], lse_noise, base2)
    if "partial_out" in t:
        allclose_rows(res, "partial_out", values(t["partial_out"], dt["partial_out"]), p_out, ulp_rtol(dt["partial_out"]), p_mag)
    if "partial_lse" in t:
        terms = np.diff(bounds, axis=1)[:, None, None, :]  # each split sums its own tokens
        lse_close(res, "partial_lse", t["partial_lse"], dt["partial_lse"], p_lse, terms, p_noise, base2)


def splitk_combine(t, dt, meta, res):
    po, pl, out, lse = need(t, "partial_out", "partial_lse", "out", "lse")
    po = values(po, dt["partial_out"]).astype(np.float64) if dt["partial_out"] != "F32" else po
    pl = np.asarray(values(pl, dt["partial_lse"]), dtype=np.float64)
    base2 = meta.get("lse_base", "e") == "2"
    m = pl.max(axis=1, keepdims=True)
    empty = np.isneginf(m[:, 0])
    with np.errstate(invalid="ignore"):
        w = np.exp2(pl - m) if base2 else np.exp(pl - m)
    w[empty] = 0
    den = w.sum(axis=1)
    ref_out = np.matmul(w[:, None, :], po)[:, 0, :] / np.where(empty, 1, den)[:, None]
    with np.errstate(divide="ignore"):
        ref_lse = m[:, 0] + (np.log2(den) if base2 else np.log(den))
    ref_lse[empty] = np.inf if meta.get("lse_empty", "-inf") == "+inf" else -np.inf
    allclose_rows(res, "out", values(out, dt["out"]), ref_out, ulp_rtol(dt["out"]))
    # the merge sums S weights, each exp(lse_s - m); the partials are inputs, read exactly
    lse_close(res, "lse", lse, dt["lse"], ref_lse, pl.shape[1], 0.0, base2)


def nvfp4_values(packed, scales, g):
    """float64 [rows, K] = e2m1(code) * e4m3(scale) * g; element 2j in the low nibble."""
    rows, half = packed.shape
    codes = np.empty((rows, 2 * half), dtype=np.uint8)
    codes[:, 0::2] = packed & 0xF
    codes[:, 1::2] = packed >> 4
    v = E2M1[codes]
    v *= np.repeat(E4M3[scales], 16, axis=1)
    v *= g
    return v


def dequant_multiplier(t, name, meta, key):
    g = scalar(t, name)
    kind = meta.get(key, "dequant")
    if kind == "quant":
        return 1.0 / float(np.float32(g))
    if kind != "dequant":
        raise Unusable("%s = %r: want dequant or quant" % (key, kind))
    return float(np.float32(g))


def nvfp4_dequantize(t, dt, meta, res):
    packed, bs, gs, out = need(t, "packed", "block_scale", "global_scale", "out")
    rows, half = packed.shape
    ref = nvfp4_values(packed, scales_of(bs, meta, rows, 2 * half // 16), dequant_multiplier(gs, "global_scale", meta, "global_scale_kind"))
    a = values(out, dt["out"]).astype(np.float64)
    bad = ~(np.abs(a - ref) <= ulp_rtol(dt["out"]) * np.abs(ref))
    res.count("out", np.count_nonzero(bad))


def nvfp4_quantize(t, dt, meta, res):
    x, gs, packed, bs = need(t, "x", "global_scale", "packed", "block_scale")
    rows, k = x.shape
    gs = float(np.float32(scalar(gs, "global_scale")))
    xv = values(x, dt["x"]).astype(np.float64).reshape(rows, k // 16, 16)
    amax = np.abs(xv).max(axis=2)
    # the block scale: e4m3(gs * amax / 6), saturating
    s_exact = gs * amax / 6
    s_want = nearest_code(s_exact, E4M3_POS).astype(np.uint8)
    s_got = np.asarray(scales_of(bs, meta, rows, k // 16))
    diff = s_got != s_want
    ok = np.zeros_like(diff)
    if diff.any():
        sg, sw, v = s_got[diff], s_want[diff], s_exact[diff]
        ok[diff] = neighbours(E4M3, sg, sw) & (sg < 0x80) & near_midpoint(v, E4M3[sg], E4M3[sw])
    res.count("block_scale", np.count_nonzero(diff & ~ok))
    # the codes, against the scale the kernel stored where that scale is right
    s_val = E4M3[s_got].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(s_val[:, :, None] > 0, xv * gs / s_val[:, :, None], 0.0).reshape(rows, k)
    want = nearest_code(v, E2M1_POS)
    got = np.empty((rows, k), dtype=np.uint8)
    got[:, 0::2] = packed & 0xF
    got[:, 1::2] = packed >> 4
    gval = E2M1[got]
    wval = np.where(v < 0, -E2M1_POS[want], E2M1_POS[want])
    bad = gval != wval
    if bad.any():
        gm, wm = np.abs(gval[bad]), np.abs(wval[bad])
        gi, wi = np.searchsorted(E2M1_POS, gm), np.searchsorted(E2M1_POS, wm)
        same_sign = (gval[bad] == 0) | (np.signbit(gval[bad]) == np.signbit(v[bad]))
        tie = (np.abs(gi - wi) == 1) & same_sign & near_midpoint(v[bad], gm, wm)
        bad[bad] = ~tie
    res.count("packed", np.count_nonzero(bad.reshape(rows, k // 2, 2).any(axis=2)))


def nvfp4_gemm(t, dt, meta, res):
    ap, asc, ag, bp, bsc, bg, out = need(t, "a_packed", "a_scale", "a_global", "b_packed", "b_scale", "b_global", "out")
    m, half = ap.shape
    n = bp.shape[0]
    a = nvfp4_values(ap, scales_of(asc, meta, m, 2 * half // 16), dequant_multiplier(ag, "a_global", meta, "a_global_kind"))
    b = nvfp4_values(bp, scales_of(bsc, meta, n, 2 * half // 16), dequant_multiplier(bg, "b_global", meta, "b_global_kind"))
    allclose_rows(res, "out", values(out, dt["out"]), a @ b.T, ulp_rtol(dt["out"]))


CHECKS = {f.__name__: f for f in (kv_cache_write, kv_cache_gather, mla_decode, splitk_combine,
                                   nvfp4_dequantize, nvfp4_quantize, nvfp4_gemm)}


def vmhwm():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def check_file(path):
    start = time.perf_counter()
    out = {"file": path, "kernel": None, "verdict": "error", "failing": {}, "worst": None, "error": None}
    try:
        t, dt, meta = load(path)
        kernel = meta.get("kcheck.kernel")
        out["kernel"] = kernel
        fn = CHECKS.get(kernel)
        if fn is None:
            raise Unusable("kernel %r: this script checks %s" % (kernel, ", ".join(sorted(CHECKS))))
        res = Result()
        fn(t, dt, meta, res)
        out["failing"], out["worst"] = res.failing, res.worst
        out["verdict"] = "fail" if any(res.failing.values()) else "pass"
    except (Unusable, ValueError, KeyError, IndexError, OSError) as e:
        out["error"] = "%s: %s" % (type(e).__name__, e) if not isinstance(e, Unusable) else str(e)
    out["seconds"] = time.perf_counter() - start
    return out


def lse_selftest(n=131072, rows=4):
    """lse_close against a correct fp32 lse of n tokens: scores of rms 3 (half the terms
    under half an ulp of the running sum, as in a 128K decode), their exps summed in
    order in fp32, as one correct kernel does, must pass (it errs by about 3e-4, which a
    fixed 1e-4 does not allow); the same lse moved by twice gamma_n must fail."""
    s = np.random.default_rng(7).standard_normal((rows, n)) * 3
    m = s.max(axis=1, keepdims=True)
    e = np.exp(s - m)
    ref = m[:, 0] + np.log(e.sum(axis=1))
    acc = np.cumsum(e.astype(np.float32), axis=1, dtype=np.float32)[:, -1]
    got = np.float32(m[:, 0]) + np.log(acc.astype(np.float64)).astype(np.float32)
    problems = []
    for delta, want in ((0.0, 0), (2 * n * U32, rows), (-2 * n * U32, rows)):
        res = Result()
        lse_close(res, "lse", (got + np.float32(delta)).astype(np.float32), "F32", ref, n)
        if res.failing["lse"] != want:
            problems.append("lse_close: a sequential fp32 lse of %d tokens moved by %g: %d of %d rows fail, want %d (worst %.3g of tol)"
                            % (n, delta, res.failing["lse"], rows, want, res.worst))
    return problems


def selftest():
    """The fast E4M3 encoder against nearest-even on the code table: every code's value,
    every midpoint and its fp32 neighbours, saturation, and random values."""
    pos = E4M3_POS.astype(np.float32)
    mids = ((E4M3_POS[:-1] + E4M3_POS[1:]) / 2).astype(np.float32)
    probes = np.concatenate([pos, mids, np.nextafter(mids, np.float32(0)), np.nextafter(mids, np.float32(1e9)),
                             np.float32([448, 449, 464, 480, 1e6, 2.0 ** -10, 2.0 ** -9 * 1.5, 0]),
                             np.random.default_rng(1).standard_normal(200000).astype(np.float32) * np.float32(30)])
    probes = np.concatenate([probes, -probes])
    want = nearest_code(probes.astype(np.float64), E4M3_POS).astype(np.uint8) | np.where(np.signbit(probes), 0x80, 0).astype(np.uint8)
    got = e4m3_from_f32(probes)
    bad = np.nonzero(got != want)[0]
    bf = f32_to_bf16_bits(np.float32([1.0, 1.00390625, 1.01171875, -2.5, 3.0e38]))
    problems = []
    if bad.size:
        problems.append("e4m3_from_f32 differs from the table at %d of %d values, e.g. %r -> %#x, want %#x"
                        % (bad.size, probes.size, float(probes[bad[0]]), got[bad[0]], want[bad[0]]))
    if list(bf) != [0x3F80, 0x3F80, 0x3F82, 0xC020, 0x7F62]:
        problems.append("f32_to_bf16_bits: %s" % [hex(b) for b in bf])
    lin = np.arange(256 * 8).reshape(256, 8)
    m, k = np.meshgrid(np.arange(256), np.arange(8), indexing="ij")
    off = ((m // 128) * 2 + k // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + (k % 4)
    swz = np.empty(256 * 8, dtype=np.int64)
    swz[off.reshape(-1)] = lin.reshape(-1)
    if not np.array_equal(unswizzle(swz, 256, 8), lin):
        problems.append("unswizzle does not invert section 5's offsets")
    problems += lse_selftest()
    print(json.dumps({"selftest": "fail" if problems else "pass", "problems": problems, "values": int(probes.size)}))
    return 1 if problems else 0


def main(argv):
    if argv == ["--selftest"]:
        return selftest()
    if not argv:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    code = 0
    for path in argv:
        out = check_file(path)
        out["vmhwm"] = vmhwm()
        print(json.dumps(out), flush=True)
        code = max(code, {"pass": 0, "fail": 1}.get(out["verdict"], 2))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
