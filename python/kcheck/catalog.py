"""Judge each engine worker over (a subset of) kcheck's case catalog.

    python -m kcheck.catalog [--subset ci|full] [--kcheck bin/kcheck] [--json FILE]

Runs `kcheck run --backend worker:... --json` for every entry of RUNS and
prints one Markdown table row per entry: cases run, pass / fail /
inconclusive / error counts, and the refused cases (worker exit 4,
`unsupported`) with the worker's reason. The `ci` subset is what .ci/run
runs: one case for each worker and kernel (every worker process imports its
engine, 20-50 s on two busy cores), ten in all; `full` is every catalog case
the kernel maps to, except where an entry's note says why not.
"""

import argparse
import collections
import json
import os
import re
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
     None, ["mla_decode/deepseek-v3/tp8/bf16/p16/ctx-P+1", "mla_decode/split/deepseek-v3/tp8/s4/*"],
     "bf16 lse and attn_logits partials: needs issue 16; the full run is a few cases, every one ends in the same contract error"),
    ("vLLM Triton merge_attn_states", "worker:vllm", "splitk_combine", None,
     ["splitk_combine/deepseek-v3/tp8/s2"], ["splitk_combine/*"], "two states only (S = 2)"),
    ("SGLang Triton grouped decode decode_attention_fwd_grouped", "worker:sglang", "mla_decode", None,
     ["mla_decode/deepseek-v3/tp8/bf16/p16/ctx-P+1"],
     ["mla_decode/deepseek-v3/tp8/bf16/*", "mla_decode/split/deepseek-v3/tp8/s4/*", "mla_decode/deepseek-v3/tp8/fp8_e4m3/p16/ctx-P+1",
      "mla_decode/mtp/deepseek-v3/sq2/bf16/ctx-3"],
     "no final lse: every run ends in 'no tensor lse' until mla_decode's lse is optional (issue 16); fp8 and s_q > 1 refused"),
    ("SGLang Triton merge_state", "worker:sglang", "splitk_combine", None,
     ["splitk_combine/deepseek-v3/tp8/s2"], ["splitk_combine/*"], "two states only (S = 2)"),
    ("SGLang DSA fp8_ds_mla quantizer", "worker:sglang", "kv_cache_write", None,
     ["kv_cache_write/fp8_ds_mla/p16/amax"], ["kv_cache_write/*"], "fp8_ds_mla, amax scales"),
    ("FlashInfer Triton cascade merge_states", "worker:flashinfer", "splitk_combine", BASE2_SMALL,
     ["splitk_combine-base2-small/h4/l16/s2"], ["splitk_combine-base2-small/*"],
     "base 2, small shapes (python/cases/flashinfer-base2-small.json): its scalar loop over every element takes"
     " over 20 minutes a case of the catalog's 32 x 512 in the interpreter (python/cases/flashinfer-base2.json holds those)"),
    ("torchao nvfp4_quantize", "worker:torchao", "nvfp4_quantize", None,
     ["nvfp4_quantize/m16/k2048/swizzled_128x4"], ["nvfp4_quantize/*"], "linear and to_blocked scales"),
    ("torchao NVFP4Tensor.dequantize", "worker:torchao", "nvfp4_dequantize", None,
     ["nvfp4_dequantize/m16/k2048/swizzled_128x4/dequant"], ["nvfp4_dequantize/*"], "dequant-direction global only"),
    ("ModelOpt NVFP4QTensor.quantize", "worker:modelopt", "nvfp4_quantize", None,
     ["nvfp4_quantize/m16/k2048/linear"], ["nvfp4_quantize/*"], "linear scales only"),
    ("ModelOpt NVFP4QTensor.dequantize", "worker:modelopt", "nvfp4_dequantize", None,
     ["nvfp4_dequantize/m16/k2048/linear/dequant"], ["nvfp4_dequantize/*"], "linear scales, dequant-direction global only"),
]


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
    ap.add_argument("--only", default="", help="run only entries whose label contains this")
    ap.add_argument("--json", help="also write the raw results here")
    ap.add_argument("--md", help="also write the table, the command and the versions here (rewritten after each entry)")
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
        f"Generated by `python -m kcheck.catalog {' '.join(argv if argv is not None else sys.argv[1:])}`"
        f" (make engines-{a.subset}) on {time.strftime('%Y-%m-%d %H:%M')}, load average {os.getloadavg()[0]:.1f}"
        f" on {os.cpu_count()} cores, TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')}; {_versions()}.",
        "",
    ]

    def emit(line):
        print(line, flush=True)
        lines.append(line)
        if a.md:
            with open(a.md + ".tmp", "w") as f:
                f.write("\n".join(head + lines) + "\n")
            os.replace(a.md + ".tmp", a.md)

    for l in lines:
        print(l)
    raw = {}
    for label, backend, kernel, cf, ci, full, note in RUNS:
        globs = ci if a.subset == "ci" else full
        if (a.only and a.only not in label) or globs is None:
            continue
        results, secs = [], 0.0
        for glob in globs:
            r, t = run_one(a.kcheck, backend, cf, glob, a.timeout)
            results += r
            secs += t
        raw[label] = results
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
        if a.json:
            with open(a.json, "w") as f:
                json.dump(raw, f, indent=1)
    # Exit 0: a fail or an inconclusive verdict is a result to report, not
    # a broken run; the pytest suite asserts the verdicts it expects.
    return 0


if __name__ == "__main__":
    sys.exit(main())
