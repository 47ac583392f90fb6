#!/usr/bin/env python3
"""numpy float64 implementations of kcheck's benchmark cases.

Usage: numpy_ref.py DIR REPS

DIR holds case.json ({"kernel": ..., "params": {...}}) and the inputs as .npy
files, written by kcheck's internal/bench. The script loads every input into
memory, runs the computation REPS times (timing each, the inputs already in
memory, as the Go side is timed), writes the outputs as np_NAME.npy (float64)
and prints one JSON line: the best time, the peak RSS (ru_maxrss), the input
bytes and the BLAS that numpy runs.

It is the straightforward float64 formulation a numpy user would write
(dequantize or widen to float64, then matmul / softmax), independent of
kcheck's Go code: bf16 is widened by its bits, E2M1 and E4M3 are decoded
from their definitions (OCP MX spec), not from Go's tables.
"""
import json
import os
import resource
import sys
import time

import numpy as np


def bf16_to_f64(u16):
    return (np.asarray(u16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


# E2M1 by code: sign bit 3, exponent bits 2..1 (bias 1), mantissa bit 0.
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def e4m3_table():
    """E4M3FN by code: bias 7, subnormals at exponent 0, S.1111.111 NaN."""
    c = np.arange(256)
    s = np.where(c & 0x80, -1.0, 1.0)
    e = (c >> 3) & 0xF
    m = c & 7
    v = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7.0))
    v = s * v
    v[(c & 0x7F) == 0x7F] = np.nan
    return v


E4M3 = e4m3_table()


def dequant(codes, scales, g):
    rows, half = codes.shape
    c = np.empty((rows, 2 * half), dtype=np.uint8)
    c[:, 0::2] = codes & 0xF  # element 2j: low nibble
    c[:, 1::2] = codes >> 4
    v = E2M1[c]
    v *= np.repeat(E4M3[scales], 16, axis=1)
    v *= g
    return v


def mla_decode(a, p):
    q, cache, bt, sl = a["q"], a["cache"], a["block_table"], a["seq_lens"]
    B, SQ, H, D = q.shape
    L, P, scale = p["L"], cache.shape[1], p["scale"]
    out = np.empty((B, SQ, H, L))
    lse = np.empty((B, H, SQ))
    for b in range(B):
        n = int(sl[b])
        k = bf16_to_f64(cache[bt[b, :(n + P - 1) // P]].reshape(-1, D)[:n])
        s = (q[b, 0] @ k.T) * scale
        m = s.max(axis=1, keepdims=True)
        e = np.exp(s - m)
        den = e.sum(axis=1)
        out[b, 0] = (e @ k[:, :L]) / den[:, None]
        lse[b, :, 0] = m[:, 0] + np.log(den)
    return {"out": out, "lse": lse}


def splitk_combine(a, p):
    o, lse = a["partial_out"], a["partial_lse"]
    m = lse.max(axis=1, keepdims=True)
    w = np.exp(lse - m)
    den = w.sum(axis=1)
    out = np.matmul(w[:, None, :], o)[:, 0, :] / den[:, None]
    return {"out": out, "lse": m[:, 0] + np.log(den)}


def nvfp4_gemm(a, p):
    x = dequant(a["a_codes"], a["a_scales"], p["a_global"])
    w = dequant(a["b_codes"], a["b_scales"], p["b_global"])
    return {"out": x @ w.T}


def nvfp4_dequantize(a, p):
    return {"out": dequant(a["w_codes"], a["w_scales"], p["global"])}


def blas_info():
    """The BLAS library numpy loaded and, for OpenBLAS, its kernel."""
    import ctypes
    path = ""
    with open("/proc/self/maps") as f:
        for line in f:
            f6 = line.split()
            if len(f6) >= 6 and "blas" in os.path.basename(f6[-1]).lower():
                path = f6[-1]
                break
    info = {"blas": path, "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE", ""),
            "OPENBLAS_L2_SIZE": os.environ.get("OPENBLAS_L2_SIZE", "")}
    try:
        lib = ctypes.CDLL(path)
        lib.openblas_get_corename.restype = ctypes.c_char_p
        lib.openblas_get_config.restype = ctypes.c_char_p
        info["core"] = lib.openblas_get_corename().decode()
        info["config"] = lib.openblas_get_config().decode()
        info["threads"] = lib.openblas_get_num_threads()
    except (OSError, AttributeError):
        pass
    return info


def cpu_time():
    """User plus system CPU seconds of this process, all threads."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main():
    d, reps = sys.argv[1], int(sys.argv[2])
    with open(os.path.join(d, "case.json")) as f:
        case = json.load(f)
    fn = globals()[case["kernel"]]
    arrays = {}
    for name in sorted(os.listdir(d)):
        if name.endswith(".npy") and not name.startswith(("go_", "np_")):
            arrays[name[:-4]] = np.load(os.path.join(d, name))
    nbytes = sum(x.nbytes for x in arrays.values())
    best = best_cpu = None
    for _ in range(reps):
        t, c = time.perf_counter(), cpu_time()
        res = fn(arrays, case.get("params", {}))
        dt = time.perf_counter() - t
        if best is None or dt < best:
            best, best_cpu = dt, cpu_time() - c
    for name, v in res.items():
        np.save(os.path.join(d, "np_" + name + ".npy"), np.ascontiguousarray(v, dtype=np.float64))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"seconds": best, "cpu": best_cpu, "rss": rss, "input_bytes": nbytes,
                      "numpy": np.__version__, **blas_info()}))


if __name__ == "__main__":
    main()
