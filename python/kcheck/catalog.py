"""Judge each engine worker over (a subset of) kcheck's case catalog.

    python -m kcheck.catalog [--subset ci|full] [--kcheck bin/kcheck] [--json FILE]
        [--only LABEL]... [--md FILE [--append]]

Runs `kcheck run --backend worker:... --json` for every entry of RUNS (and
the worker protocol then `kcheck check` for every entry of DERIVED) and
prints one Markdown table row per entry: cases run, pass / fail /
inconclusive / error counts, and the refused cases (worker exit 4,
`unsupported`) with the worker's reason. The `ci` subset is what .ci/run
runs: one case for each worker and kernel (every worker process imports its
engine, 20-120 s on two busy cores), fourteen in all; `full` is every catalog
case the kernel maps to, except where an entry's note says why not.
--only runs the entries whose label holds any of the given strings, and
--append adds this run's block to an --md file written by an earlier one.
"""

import argparse
import concurrent.futures
import collections
import json
import os
import re
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BASE2_SMALL = os.path.join(HERE, "..", "cases", "flashinfer-base2-small.json")

# (label, backend, kernel, cases file or None, ci globs, full globs, what the
# run shows). A glob list is run as one kcheck run per glob; None: not run in
# that subset. "full" is every catalog case the engine kernel maps to, except
# where the note says why not.
RUNS = [
    ("vLLM TRITON_MLA decode_attention_fwd, fp32 lse buffer", "worker:vllm,lse_dtype=f32,partials=off", "mla_decode", None,
     ["mla_decode/deepseek-v3/tp8/fp8_e4m3/p16/ctx-P+1"], ["mla_decode/*/tp8/*", "mla_decode/mtp/*"],
     "out (bf16) and lse; tp1 (128 heads) not in the full run: 8x the interpreter time of tp8"),
    ("vLLM TRITON_MLA decode_attention_fwd, as forward_mqa calls it", "worker:vllm", "mla_decode", None,
     None, ["mla_decode/deepseek-v3/tp8/bf16/p16/ctx-P+1", "mla_decode/fp16/*", "mla_decode/split/deepseek-v3/tp8/s4/*"],
     "o and lse in the query's dtype (bf16, or fp16 over an fp16 cache) and attn_logits partials, read as --from vllm"
     " reads a capture (the splits the kernel never writes unjudged)"),
    ("vLLM Triton merge_attn_states", "worker:vllm", "splitk_combine", None,
     ["splitk_combine/deepseek-v3/tp8/s2"], ["splitk_combine/*"], "two states only (S = 2)"),
    ("SGLang Triton grouped decode decode_attention_fwd_grouped", "worker:sglang", "mla_decode", None,
     ["mla_decode/deepseek-v3/tp8/bf16/p16/ctx-P+1"],
     ["mla_decode/deepseek-v3/tp8/bf16/*", "mla_decode/split/deepseek-v3/tp8/s4/*", "mla_decode/deepseek-v3/tp8/fp8_e4m3/p16/ctx-P+1",
      "mla_decode/mtp/deepseek-v3/sq2/bf16/ctx-3"],
     "no final lse (stage 2 stores o only: declared in kcheck.worker.not_written, out and the partials judged);"
     " fp8 and s_q > 1 refused"),
    ("SGLang Triton merge_state", "worker:sglang", "splitk_combine", None,
     ["splitk_combine/deepseek-v3/tp8/s2"], ["splitk_combine/*"], "two states only (S = 2)"),
    ("SGLang DSA fp8_ds_mla quantizer", "worker:sglang", "kv_cache_write", None,
     ["kv_cache_write/fp8_ds_mla/p16/amax"], ["kv_cache_write/fp8_ds_mla/*/amax"], "fp8_ds_mla, amax scales"),
    ("SGLang MLA pool write (PyTorch cast, set_mla_kv_buffer_triton)", "worker:sglang", "kv_cache_write", None,
     ["kv_cache_write/bf16/p16/amax"], ["kv_cache_write/bf16/*", "kv_cache_write/fp16/*"],
     "bf16 and fp16 pools; the catalog's fp8_e4m3 cases divide by a k_scale SGLang's pool does not have (refused; the"
     " corpus's fixtures/engines/corpus/sglang/pool_write_fp8_e4m3 is its fp8 write)"),
    ("FlashInfer Triton cascade merge_states", "worker:flashinfer", "splitk_combine", BASE2_SMALL,
     ["splitk_combine-base2-small/h4/l16/s2"], ["splitk_combine-base2-small/*"],
     "base 2, small shapes (python/cases/flashinfer-base2-small.json): its scalar loop over every element takes"
     " over 20 minutes a case of the catalog's 32 x 512 in the interpreter (python/cases/flashinfer-base2.json holds those)"),
    ("vLLM Triton paged MQA logits (DSA indexer) rocm_fp8_paged_mqa_logits_triton, then vLLM's torch top-k", "worker:vllm",
     "dsa_indexer", None, ["dsa_indexer/glm-5/p64/ctx-P+1"], ["dsa_indexer/*"],
     "the catalog's BF16 q and cache lie off the fp8 grid the kernel reads: refused, not quantized;"
     " the same cases on the fp8 grid are judged in the next entry; the dsa_indexer/fp8/* cases are the kernel's own"
     " layout (fp8 q, block-split fp8 cache), handed to it as they are"),
    ("vLLM ROCM_AITER_MLA_SPARSE Triton sparse decode rocm_sparse_attn_decode_bf16", "worker:vllm", "mla_decode_sparse", None,
     ["mla_decode_sparse/v4/deepseek-v4/bf16/topk512/ctx-4000"], ["mla_decode_sparse/*"],
     "out only (the kernel writes no lse: kcheck.worker.not_written); the split count the backend computes, run where"
     " it is above 1 (a row of 512 slots or more: fewer go to rocm_sparse_attn_prefill, refused); D = 576 (DeepSeek-V3.2,"
     " GLM-5) refused (the reduce's tl.arange(0, D) needs a power of two), and fp8 caches (AITER's, not this kernel)"),
    ("vLLM ROCM_AITER_MLA_SPARSE Triton sparse decode rocm_sparse_attn_decode_bf16, 3 splits forced", "worker:vllm,num_splits=3",
     "mla_decode_sparse", None, None, ["mla_decode_sparse/v4/deepseek-v4/bf16/*"],
     "the same kernel with option num_splits=3 on the bf16 cases the backend would send to its single-pass prefill"
     " kernel (rows under 512 slots): split boundaries off the 32-slot tiles"),
    ("torchao nvfp4_quantize", "worker:torchao", "nvfp4_quantize", None,
     ["nvfp4_quantize/m16/k2048/swizzled_128x4"], ["nvfp4_quantize/*"], "linear and to_blocked scales"),
    ("torchao NVFP4Tensor.dequantize", "worker:torchao", "nvfp4_dequantize", None,
     ["nvfp4_dequantize/m16/k2048/swizzled_128x4/dequant"], ["nvfp4_dequantize/*"], "dequant-direction global only"),
    ("ModelOpt NVFP4QTensor.quantize", "worker:modelopt", "nvfp4_quantize", None,
     ["nvfp4_quantize/m16/k2048/linear"], ["nvfp4_quantize/*"], "linear scales only"),
    ("ModelOpt NVFP4QTensor.dequantize", "worker:modelopt", "nvfp4_dequantize", None,
     ["nvfp4_dequantize/m16/k2048/linear/dequant"], ["nvfp4_dequantize/*"], "linear scales, dequant-direction global only"),
]


# Entries judged on inputs derived from catalog cases, for engine kernels
# whose input dtypes the contract cannot hold yet: (label, worker, kernel,
# worker options, derivation module, ci globs, full globs, note). Each case
# is built by `kcheck run --backend reference --out`, rewritten by the
# derivation (python -m MODULE IN OUT: exact re-encodings, never the
# engine's arithmetic), run through the worker protocol and judged by
# `kcheck check`.
DERIVED = [
    ("vLLM Triton paged MQA logits (DSA indexer), then vLLM's torch top-k, on fp8-grid inputs", "vllm", "dsa_indexer", [],
     "kcheck.fp8grid", ["dsa_indexer/glm-5/p64/ctx-P+1"], ["dsa_indexer/glm-5/*"],
     "the catalog cases with q and k_cache rounded to e4m3 x power-of-two scales (python -m kcheck.fp8grid), which the"
     " worker hands the kernel exactly"),
]


def _timeout_s(t):
    units = {"s": 1, "m": 60, "h": 3600}
    return float(t[:-1]) * units[t[-1]] if t[-1] in units else float(t)


def run_derived(kcheck, worker, kernel, opts, module, glob, timeout):
    """One DERIVED glob: results shaped like `kcheck run --json`'s."""
    import glob as globmod
    import tempfile

    t0 = time.time()
    results = []
    with tempfile.TemporaryDirectory(prefix="kcheck-derived-") as tmp:
        ref = os.path.join(tmp, "ref")
        p = subprocess.run([kcheck, "run", "--quiet", "--match", glob, "--out", ref], capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"kcheck run --match {glob} --out: exit {p.returncode}: {p.stderr.strip()[-500:]}")
        for src in sorted(globmod.glob(os.path.join(ref, "*.safetensors"))):
            base = os.path.basename(src)
            dst, out = os.path.join(tmp, "in-" + base), os.path.join(tmp, "out-" + base)
            subprocess.run([sys.executable, "-m", module, src, dst], check=True)
            cmd = [sys.executable, "-m", "kcheck.worker", worker]
            for o in opts:
                cmd += ["--set", o]
            cmd += ["run", "--kernel", kernel, "--in", dst, "--out", out]
            try:
                w = subprocess.run(cmd, capture_output=True, text=True, timeout=_timeout_s(timeout))
            except subprocess.TimeoutExpired:
                results.append({"case": base, "verdict": "error", "error": f"kernel {kernel}: hang (over {timeout})"})
                continue
            if w.returncode != 0:
                status = {2: "bad_input", 4: "unsupported", 5: "unavailable"}.get(w.returncode, "crash")
                last = (w.stderr.strip().splitlines() or ["?"])[-1]
                results.append({"case": base, "verdict": "error", "error": f"kernel {kernel}: {status}: {last.split(': ', 1)[-1]}"})
                continue
            c = subprocess.run([kcheck, "check", "--json", out], capture_output=True, text=True)
            r = json.loads(c.stdout.splitlines()[0])
            r["case"] = base
            results.append(r)
    return results, time.time() - t0


def run_one(kcheck, backend, cases_file, glob, timeout):
    cmd = [kcheck, "run", "--json", "--quiet", "--backend", backend, "--match", glob, "--timeout", timeout]
    if cases_file:
        cmd += ["--cases", cases_file]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    results = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    if not results and p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()[-500:]}")
    return results, time.time() - t0


_STATUS = re.compile(r"kernel \w+: (ok|crash|hang|garbage|unavailable|unsupported|bad_input|canceled)\b")


def summarize(results):
    counts = collections.Counter()
    refused = collections.Counter()
    errors = collections.Counter()
    outputs = collections.defaultdict(collections.Counter)
    for r in results:
        err = r.get("error") or ""
        m = _STATUS.search(err)
        if r["verdict"] == "error" and m and m.group(1) == "unsupported":
            counts["refused"] += 1
            refused[err.split("unsupported: ", 1)[-1].strip()] += 1
            continue
        counts[r["verdict"]] += 1
        if r["verdict"] == "error":
            errors[err[-160:]] += 1
        for c in r.get("checks") or []:
            outputs[c.get("tensor", c.get("name", "?"))][c.get("verdict", "?")] += 1
    return counts, refused, errors, outputs


def _versions():
    import importlib.metadata as md

    out = []
    for d in ("vllm", "sglang", "flashinfer-python", "torchao", "nvidia-modelopt", "torch", "triton"):
        try:
            out.append(f"{d} {md.version(d)}")
        except md.PackageNotFoundError:
            pass
    return ", ".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--subset", choices=("ci", "full"), default="ci")
    ap.add_argument("--kcheck", default=os.environ.get("KCHECK", "bin/kcheck"))
    ap.add_argument("--timeout", default="10m", help="per-case limit passed to kcheck run")
    ap.add_argument("--only", action="append", default=[],
                    help="run only entries whose label contains this (repeatable: any of them)")
    ap.add_argument("--json", help="also write the raw results here")
    ap.add_argument("--jobs", type=int, default=1,
                    help="entries run at once (each is a kcheck run with its own worker processes; the interpreter is single-threaded, "
                         "so two use two cores); the table keeps the entries' order")
    ap.add_argument("--md", help="also write the table, the command and the versions here (rewritten after each entry)")
    ap.add_argument("--append", action="store_true",
                    help="keep what --md already holds and add this run's block after it (runs of separate subsets in one file)")
    a = ap.parse_args(argv)
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("KCHECK_PYTHON", sys.executable)
    # The interpreter is slow (and two CI cores are shared): the per-case
    # limit is --timeout, so the worker's own limit must not be shorter.
    os.environ.setdefault("KCHECK_WORKER_TIMEOUT", a.timeout)
    lines = [
        "| engine kernel | backend | cases | pass | fail | inconclusive | error | refused | per output | time |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    head = [
        f"Generated by `python -m kcheck.catalog {shlex.join(argv if argv is not None else sys.argv[1:])}`"
        f"{'' if a.only else f' (make engines-{a.subset})'} on {time.strftime('%Y-%m-%d %H:%M')}, load average {os.getloadavg()[0]:.1f}"
        f" on {os.cpu_count()} cores, TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')}; {_versions()}.",
        "",
    ]

    before = ""
    if a.md and a.append and os.path.exists(a.md):
        with open(a.md) as f:
            before = f.read().rstrip("\n") + "\n\n"

    def emit(line):
        print(line, flush=True)
        lines.append(line)
        if a.md:
            with open(a.md + ".tmp", "w") as f:
                f.write(before + "\n".join(head + lines) + "\n")
            os.replace(a.md + ".tmp", a.md)

    def report(label, backend, note, results, secs):
        counts, refused, errors, outputs = summarize(results)
        per = "; ".join(f"{t}: " + ", ".join(f"{v} {n}" for v, n in sorted(c.items())) for t, c in sorted(outputs.items()))
        emit(f"| {label} ({note}) | `{backend}` | {len(results)} | {counts['pass']} | {counts['fail']} | {counts['inconclusive']} | {counts['error']} | {counts['refused']} | {per} | {secs:.0f} s |")
        for why, n in refused.items():
            emit(f"|  | refused {n}: {why} | | | | | | | | |")
        for why, n in errors.items():
            emit(f"|  | error {n}: {why} | | | | | | | | |")
        for r in results:
            if r["verdict"] in ("fail", "inconclusive"):
                bad = ", ".join(f"{c.get('tensor')} {c.get('verdict')}" for c in r.get("checks") or [] if c.get("verdict") != "pass")
                emit(f"|  | {r['verdict']}: `{r.get('file') or r.get('case')}` ({bad}) | | | | | | | | |")

    for l in lines:
        print(l)
    tasks = []  # (label, backend shown, note, thunk returning (results, secs))

    def entry(runner, globs, *args):
        def run():
            results, secs = [], 0.0
            for glob in globs:
                r, t = runner(*args, glob, a.timeout)
                results += r
                secs += t
            return results, secs
        return run

    for label, backend, kernel, cf, ci, full, note in RUNS:
        globs = ci if a.subset == "ci" else full
        if (a.only and not any(o in label for o in a.only)) or globs is None:
            continue
        tasks.append((label, backend, note, entry(run_one, globs, a.kcheck, backend, cf)))
    for label, worker, kernel, opts, module, ci, full, note in DERIVED:
        globs = ci if a.subset == "ci" else full
        if (a.only and not any(o in label for o in a.only)) or globs is None:
            continue
        shown = f"python -m kcheck.worker {worker}" + "".join(f" --set {o}" for o in opts) + " (derived inputs)"
        tasks.append((label, shown, note, entry(run_derived, globs, a.kcheck, worker, kernel, opts, module)))
    raw = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        futures = [pool.submit(run) for _, _, _, run in tasks]
        for (label, shown, note, _), fut in zip(tasks, futures):
            results, secs = fut.result()
            raw[label] = results
            report(label, shown, note, results, secs)
            if a.json:
                with open(a.json, "w") as f:
                    json.dump(raw, f, indent=1)
    # Exit 0: a fail or an inconclusive verdict is a result to report, not
    # a broken run; the pytest suite asserts the verdicts it expects.
    return 0


if __name__ == "__main__":
    sys.exit(main())
