"""vLLM's Triton sparse MLA decode (ROCM_AITER_MLA_SPARSE's
rocm_sparse_attn_decode_bf16) judged by kcheck through the worker protocol.

One small DeepSeek-V4 bf16 case (two queries of 64 slots, 64 heads, D = V =
512) is run with option num_splits=2: the backend itself would send rows
this short to its single-pass prefill kernel, which the default refuses.
The kernel's output passes; the same kernel handed the slots shifted by one,
or a softmax scale 1.5x the case's, with the case's own inputs put back
beside its output, fails: the check sees what the kernel was given wrong.
"""

import json
import os
import subprocess
import sys

import pytest
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from conftest import catalog_capture, run_worker

CASE = "mla_decode_sparse/v4/deepseek-v4/bf16/topk64/ctx-P+1"
ROPE_CASE = "mla_decode_sparse/glm-5/tp8/bf16/topk64/ctx-P+1"


def _capture(kcheck_bin, tmp_path_factory, case):
    """The case's inputs: the reference backend's capture without its outputs."""
    path = catalog_capture(kcheck_bin, tmp_path_factory, case)
    t, meta = load_file(path), _meta(path)
    assert {"out", "lse"} <= set(t), set(t)
    inputs = os.path.join(os.path.dirname(path), "inputs.safetensors")
    save_file({k: v for k, v in t.items() if k not in ("out", "lse")}, inputs, metadata=meta)
    return inputs


@pytest.fixture(scope="module")
def capture(kcheck_bin, tmp_path_factory):
    return _capture(kcheck_bin, tmp_path_factory, CASE)


def _worker(worker_env, src, dst, *opts):
    return run_worker(worker_env, "vllm", "mla_decode_sparse", src, dst, *opts)


def _check(kcheck_bin, path):
    c = subprocess.run([kcheck_bin, "check", "--json", path], capture_output=True, text=True)
    return json.loads(c.stdout.splitlines()[0])


def _meta(path):
    with safe_open(path, "pt") as f:
        return dict(f.metadata())


def test_passes_and_declares_what_it_bypassed(worker_env, kcheck_bin, capture, tmp_path):
    out = str(tmp_path / "out.safetensors")
    p = _worker(worker_env, capture, out, "num_splits=2")
    assert p.returncode == 0, p.stderr[-3000:]
    r = _check(kcheck_bin, out)
    assert r["verdict"] == "pass", r
    assert {c["tensor"]: c["verdict"] for c in r["checks"]} == {"out": "pass"}
    assert any("lse: not judged" in n for n in r["notes"]), r["notes"]
    m = _meta(out)
    assert m["kcheck.worker.not_written"] == "lse"
    assert m["num_splits_kernel"] == "2" and m["kcheck.worker.num_splits_from"] == "option num_splits"
    assert "rocm_sparse_attn_decode_bf16" in m["kcheck.worker.call"]
    assert "assert not q.is_cpu" in m["kcheck.worker.shim"]
    assert (m["p_dtype"], m["softmax_block"]) == ("bf16", "32")


def _planted(worker_env, kcheck_bin, capture, tmp_path, edit_tensors=None, edit_meta=None):
    """Run the kernel on an edited copy of the case, then put the case's own
    inputs and parameters back beside the kernel's output and judge that."""
    t = load_file(capture)
    meta = _meta(capture)
    bad_t, bad_m = dict(t), dict(meta)
    if edit_tensors:
        edit_tensors(bad_t)
    if edit_meta:
        edit_meta(bad_m)
    src = str(tmp_path / "planted-in.safetensors")
    save_file(bad_t, src, metadata=bad_m)
    out = str(tmp_path / "planted-out.safetensors")
    p = _worker(worker_env, src, out, "num_splits=2")
    assert p.returncode == 0, p.stderr[-3000:]
    o = load_file(out)
    om = _meta(out)
    o.update(t)
    om.update(meta)
    restored = str(tmp_path / "restored.safetensors")
    save_file(o, restored, metadata=om)
    return _check(kcheck_bin, restored)


def test_planted_shifted_slots_fail(worker_env, kcheck_bin, capture, tmp_path):
    def shift(t):
        idx = t["indices"].clone()
        valid = idx >= 0
        idx[valid] = idx[valid] + 1
        t["indices"] = idx

    r = _planted(worker_env, kcheck_bin, capture, tmp_path, edit_tensors=shift)
    assert r["verdict"] == "fail", r
    assert {c["tensor"]: c["verdict"] for c in r["checks"]}["out"] == "fail"


def test_planted_wrong_scale_fails(worker_env, kcheck_bin, capture, tmp_path):
    def scale(m):
        m["softmax_scale"] = repr(float(m["softmax_scale"]) * 1.5)

    r = _planted(worker_env, kcheck_bin, capture, tmp_path, edit_meta=scale)
    assert r["verdict"] == "fail", r
    assert {c["tensor"]: c["verdict"] for c in r["checks"]}["out"] == "fail"


def test_refusals_name_the_value_and_the_line(worker_env, kcheck_bin, capture, tmp_path_factory, tmp_path):
    # rows of 64 slots: the backend's split count is 1, its prefill kernel's case
    p = _worker(worker_env, capture, str(tmp_path / "a.safetensors"))
    assert p.returncode == 4, p.stderr[-2000:]
    assert "attends 64 slots" in p.stderr and "_SPARSE_DECODE_BF16_MIN_SPLIT_LEN = 512" in p.stderr, p.stderr[-2000:]
    # D = 576: the reduce's tl.arange(0, COMB_DIM) is not a power of two
    rope = _capture(kcheck_bin, tmp_path_factory, ROPE_CASE)
    p = _worker(worker_env, rope, str(tmp_path / "b.safetensors"), "num_splits=2")
    assert p.returncode == 4, p.stderr[-2000:]
    assert "head dim D = 576" in p.stderr and "line 3407" in p.stderr, p.stderr[-2000:]


def test_d576_finding_reproduces(worker_env):
    """fixtures/engines/vllm_sparse_decode_bf16_d576.py still shows the
    engine's limit the D = 576 refusal rests on: 512 runs, 576 does not."""
    from conftest import ROOT

    env = dict(worker_env, PYTHONPATH=os.path.join(ROOT, "python"))
    p = subprocess.run([sys.executable, os.path.join(ROOT, "fixtures", "engines", "vllm_sparse_decode_bf16_d576.py")],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "head_dim 512: ran, out finite: True" in p.stdout, p.stdout
    assert "head_dim 576:" in p.stdout and "arange's range must be a power of 2" in p.stdout, p.stdout


@pytest.mark.parametrize("dense, limits, want", [
    # -1 padding after the valid slots: each row its leading slots, as the backend's stream
    ([[5, 9, -1, -1], [7, 3, 2, 1]], [4, 4], [[5, 9], [7, 3, 2, 1]]),
    # topk_length cuts a row before its padding
    ([[5, 9, 4, -1], [7, 3, 2, 1]], [2, 3], [[5, 9], [7, 3, 2]]),
    # a row with no valid slot is empty (the kernel writes it 0)
    ([[-1, -1, -1, -1]], [4], [[]]),
    # a slot past the cache stays: the kernel masks it itself (slot < num_kv)
    ([[5, 10**6, -1, -1]], [4], [[5, 10**6]]),
    # a valid slot after a -1 has no backend stream (vLLM reads slot 0 there): refused
    ([[5, -1, 9, -1]], [4], "slot 9 at position 2 follows an invalid entry at 1"),
    # ... unless topk_length ends the row before it
    ([[5, -1, 9, -1]], [2], [[5]]),
])
def test_sparse_rows(dense, limits, want):
    import torch

    from kcheck.worker import Unsupported
    from kcheck.worker.vllm import _sparse_rows

    t = torch.tensor(dense, dtype=torch.int64)
    if isinstance(want, str):
        with pytest.raises(Unsupported, match=want):
            _sparse_rows(t, limits)
        return
    rows, counts = _sparse_rows(t, limits)
    assert [r.tolist() for r in rows] == want
    assert counts == [len(w) for w in want]
