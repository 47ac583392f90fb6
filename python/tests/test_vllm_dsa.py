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
import torch

from conftest import catalog_capture, run_worker

CASE = "dsa_indexer/glm-5/p64/ctx-P+1"
# next_n = 2 over the fp8 indexer cache, top-k as global slots
MTP_CASE = "dsa_indexer/mtp/glm-5/p64/ctx-P+1"
HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def reference_capture(kcheck_bin, tmp_path_factory):
    return catalog_capture(kcheck_bin, tmp_path_factory, CASE)


@pytest.fixture(scope="module")
def mtp_capture(kcheck_bin, tmp_path_factory):
    return catalog_capture(kcheck_bin, tmp_path_factory, MTP_CASE)


def _worker(worker_env, src, dst, *opts):
    return run_worker(worker_env, "vllm", "dsa_indexer", src, dst, *opts)


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


def _check(kcheck_bin, path):
    c = subprocess.run([kcheck_bin, "check", "--json", path], capture_output=True, text=True)
    return json.loads(c.stdout.splitlines()[0])


def test_mtp_step_global_slots_judged(worker_env, kcheck_bin, mtp_capture, tmp_path):
    """vLLM's kernel with NEXT_N = 2, its torch top-k with next_n, then its
    triton_convert_req_index_to_global_index: kcheck's causal rows and
    block-table slots agree. Columns past a row's end are left unwritten by
    the kernel, so they are filled as vLLM's torch reference fills them."""
    out = str(tmp_path / "out.safetensors")
    p = _worker(worker_env, mtp_capture, out, "past_seq_len=-inf")
    assert p.returncode == 0, p.stderr[-3000:]
    r = _check(kcheck_bin, out)
    assert r["verdict"] == "pass", r
    from safetensors import safe_open

    with safe_open(out, "pt") as f:
        meta = f.metadata()
        top = f.get_tensor("topk_indices")
    assert "triton_convert_req_index_to_global_index" in meta["kcheck.worker.call"]
    assert top.shape == (4, 2048) and int(top.max()) >= 64  # slots, not positions < seq_len = 65 alone


def _per_row_lens(t, m):
    # row 0 of each request sees two tokens fewer than its request, row 1 all
    sl = t["seq_lens"].to(torch.int32)
    t["seq_lens"] = torch.stack([sl - 2, sl], dim=1).contiguous()


def test_mtp_step_per_row_lens_judged(worker_env, kcheck_bin, mtp_capture, tmp_path):
    """seq_lens [B, next_n], vLLM's per-row lengths (CTX_PER_ROW): the kernel
    and the top-k read them as they are, and so does kcheck."""
    src, out = str(tmp_path / "in.safetensors"), str(tmp_path / "out.safetensors")
    _tamper(mtp_capture, src, _per_row_lens)
    p = _worker(worker_env, src, out, "past_seq_len=-inf")
    assert p.returncode == 0, p.stderr[-3000:]
    r = _check(kcheck_bin, out)
    assert r["verdict"] == "pass", r


def test_mtp_step_future_tokens_fail(worker_env, kcheck_bin, mtp_capture, tmp_path):
    """The same kernels with the causal limit dropped (dsa_causal_dropped.py):
    kcheck fails both outputs and names the bug."""
    out = str(tmp_path / "planted.safetensors")
    p = subprocess.run([sys.executable, os.path.join(HERE, "dsa_causal_dropped.py"), mtp_capture, out],
                       capture_output=True, text=True, env=worker_env)
    assert p.returncode == 0, p.stderr[-3000:]
    r = _check(kcheck_bin, out)
    assert r["verdict"] == "fail", r
    sigs = {ch["tensor"]: ch.get("signature", {}).get("pattern") for ch in r["checks"]}
    assert sigs == {"scores": "future_tokens_visible", "topk_indices": "future_tokens_visible"}, r


def _tamper(src, dst, change):
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(src, "pt") as f:
        meta = dict(f.metadata())
        t = {k: f.get_tensor(k) for k in f.keys() if k not in ("scores", "topk_indices")}
    change(t, meta)
    save_file({k: v.contiguous() for k, v in t.items()}, dst, metadata=meta)


def _bt_out_of_range(t, m):
    t["block_table"] = t["block_table"].clone()
    t["block_table"][0, 0] = 1 << 20


@pytest.mark.parametrize("change, rc, message", [
    (lambda t, m: t.update(q=t["q"][0]), 2, "tensor q has shape"),
    (lambda t, m: t.update(weights=t["weights"][:, :3]), 2, "tensor weights has shape"),
    (lambda t, m: m.update(topk="many"), 2, "parameter topk = 'many' is not an integer"),
    (lambda t, m: m.update(max_seq="8"), 2, "must lie in [0, max_seq = 8]"),
    (lambda t, m: m.update(next_n="3"), 2, "tensor q has 2 rows; seq_lens (2,) with next_n = 3 wants 6"),
    (lambda t, m: m.update(next_n="0"), 2, "parameter next_n = 0"),
    (lambda t, m: m.update(topk_index="slots"), 2, "parameter topk_index = 'slots'"),
    (_bt_out_of_range, 2, "is outside the cache's"),
    (lambda t, m: t.update(k_cache=t["k_cache"].reshape(-1, 32, t["k_cache"].shape[2])), 4, "page size 32"),
])
def test_bad_inputs_named(worker_env, reference_capture, tmp_path, change, rc, message):
    src = str(tmp_path / "in.safetensors")
    _tamper(reference_capture, src, change)
    p = _worker(worker_env, src, str(tmp_path / "out.safetensors"))
    assert p.returncode == rc, p.stderr[-2000:]
    assert message in p.stderr, p.stderr[-2000:]
