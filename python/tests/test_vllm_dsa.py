"""vLLM's Triton paged MQA logits (the DSA indexer) judged by kcheck.

The catalog's dsa_indexer inputs are BF16 values off the fp8 grid: the
worker refuses them (exit 4) rather than quantize. The same case moved onto
the fp8 grid (kcheck.fp8grid) is what the kernel reads exactly, and kcheck
judges the kernel's scores and vLLM's top-k on it.
"""

import json
import os
import subprocess
import sys

import pytest

CASE = "dsa_indexer/glm-5/p64/ctx-P+1"


@pytest.fixture(scope="module")
def reference_capture(kcheck_bin, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref")
    p = subprocess.run([kcheck_bin, "run", "--quiet", "--case", CASE, "--out", str(out)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    (f,) = os.listdir(out)
    return str(out / f)


def _worker(worker_env, src, dst, *opts):
    cmd = [sys.executable, "-m", "kcheck.worker", "vllm"]
    for o in opts:
        cmd += ["--set", o]
    cmd += ["run", "--kernel", "dsa_indexer", "--in", src, "--out", dst]
    return subprocess.run(cmd, capture_output=True, text=True, env=worker_env)


def test_catalog_case_refused_not_quantized(worker_env, reference_capture, tmp_path):
    p = _worker(worker_env, reference_capture, str(tmp_path / "out.safetensors"))
    assert p.returncode == 4, p.stderr[-2000:]
    assert "tensor q:" in p.stderr and "not an e4m3 code times a power-of-two scale" in p.stderr, p.stderr[-2000:]
    assert not (tmp_path / "out.safetensors").exists()


def test_fp8_grid_case_judged(worker_env, kcheck_bin, reference_capture, tmp_path):
    grid = str(tmp_path / "grid.safetensors")
    subprocess.run([sys.executable, "-m", "kcheck.fp8grid", reference_capture, grid], check=True, env=worker_env)
    out = str(tmp_path / "out.safetensors")
    p = _worker(worker_env, grid, out)
    assert p.returncode == 0, p.stderr[-3000:]
    c = subprocess.run([kcheck_bin, "check", "--json", out], capture_output=True, text=True)
    r = json.loads(c.stdout.splitlines()[0])
    assert r["verdict"] == "pass", c.stdout
    assert {ch["tensor"] for ch in r["checks"]} == {"scores", "topk_indices"}
    from safetensors import safe_open

    with safe_open(out, "pt") as f:
        meta = f.metadata()
    assert "rocm_fp8_paged_mqa_logits_triton" in meta["kcheck.worker.call"]
    assert meta["kcheck.worker.past_seq_len"] == "nan"
