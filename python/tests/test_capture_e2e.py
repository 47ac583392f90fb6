"""The hook on a decode loop of vLLM's real code (tests/engine_loop.py), end to end.

The loop runs with the hook off and on (bit-identical outputs), its
captures are checked with `kcheck check --from vllm`, and with each planted
fault `kcheck diagnose` must name the stage and the step it is in:

  fault            culprit      why that step
  nibble_order     s0.quant     the first quantized activation (the first prompt's prefill)
  lse_base_mixed   s1.combine   the first decode step (two non-empty splits)
  page_off_by_one  s3.attn      the first step a context needs its second page (14 + 3 > 16)
  stale_pages      s5.cache     the second prompt's prefill, on the first prompt's freed pages
"""

import json
import os
import subprocess
import sys
import time

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import engine_loop  # noqa: E402

from kcheck import capture  # noqa: E402

STEPS = 10  # 2 prompts x (1 prefill + 4 decode steps)


@pytest.fixture(scope="module")
def loop():
    engine_loop.modules()
    return engine_loop.Loop


def _run(loop, directory=None, **sel):
    t = time.perf_counter()
    if directory is None:
        outs, cache = loop().run()
        return outs, cache, time.perf_counter() - t, []
    with capture.capture(directory, steps="all", layers="all", pipeline_steps=STEPS, **sel) as rec:
        outs, cache = loop().run()
    return outs, cache, time.perf_counter() - t, list(rec.store.files)


@pytest.fixture(scope="module")
def healthy(loop, tmp_path_factory):
    d = tmp_path_factory.mktemp("caps")
    off = _run(loop)
    on = _run(loop, d)
    off2 = _run(loop)
    # The overhead, for the record (python/tests/capture_overhead.txt is not
    # asserted on: the machine is shared).
    print(f"\ncapture overhead: off {off[2]:.2f}s / {off2[2]:.2f}s, on {on[2]:.2f}s, {len(on[3])} files, "
          f"{sum(os.path.getsize(f) for f in on[3])} bytes", file=sys.stderr)
    return off, on


def test_hook_off_and_on_give_bit_identical_results(healthy):
    (outs0, cache0, *_), (outs1, cache1, *_) = healthy
    assert len(outs0) == len(outs1) == 8
    assert all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(outs0, outs1))
    assert torch.equal(cache0.view(torch.int16), cache1.view(torch.int16))


def test_every_capture_checks_pass_from_vllm(healthy, kcheck_bin):
    files = healthy[1][3]
    names = sorted(os.path.basename(f) for f in files)
    for op, steps in (("scaled_fp4_quant", range(STEPS)), ("cutlass_scaled_fp4_mm", range(STEPS)),
                      ("concat_and_cache_mla", range(STEPS)), ("decode_attention_fwd", [1, 2, 3, 4, 6, 7, 8, 9])):
        for s in steps:
            assert f"{op}.s{s}.l0.safetensors" in names
    assert "pipeline.l0.s0-9.safetensors" in names
    p = subprocess.run([kcheck_bin, "check", "--json", "--from", "vllm", *files], capture_output=True, text=True)
    results = [json.loads(l) for l in p.stdout.splitlines()]
    bad = [(os.path.basename(r["file"]), r["verdict"], r.get("error"), r.get("stage")) for r in results if r["verdict"] != "pass"]
    assert p.returncode == 0 and not bad, bad
    assert len(results) == len(files)


def test_healthy_pipeline_diagnoses_clean(healthy, kcheck_bin):
    [pipe] = [f for f in healthy[1][3] if "pipeline" in f]
    p = subprocess.run([kcheck_bin, "diagnose", "--json", pipe], capture_output=True, text=True)
    rep = json.loads(p.stdout)
    assert p.returncode == 0, p.stdout
    assert rep["verdict"] == "pass" and rep["stage"] is None
    stages = [r["prefix"] for r in rep["capture"]["stages"]]
    assert stages[:3] == ["s0.quant", "s0.quant2", "s0.cache"] and "s9.combine" in stages
    # A merge may go past its own tolerance against the reference chain by
    # the attention's accepted deviation carried forward (s2.combine here):
    # a measurement, so no step goes wrong and nothing is named as differing.
    assert rep["first_step"] is None and not any(s["off_floor"] for s in rep["steps"]), rep["steps"]
    assert "differs" not in rep["reason"], rep["reason"]


@pytest.mark.parametrize(
    "fault, stage, step",
    [("nibble_order", "s0.quant", 0), ("lse_base_mixed", "s1.combine", 1), ("page_off_by_one", "s3.attn", 3), ("stale_pages", "s5.cache", 5)],
)
def test_planted_fault_is_named_by_stage_and_step(loop, tmp_path, kcheck_bin, fault, stage, step):
    with engine_loop.plant(fault):
        *_, files = _run(loop, tmp_path, calls=False)
    [pipe] = files
    p = subprocess.run([kcheck_bin, "diagnose", "--json", pipe], capture_output=True, text=True)
    rep = json.loads(p.stdout)
    assert p.returncode == 1, p.stdout
    assert (rep["stage"], rep["first_step"]) == (stage, step), rep.get("reason")


def test_disk_full_leaves_the_engine_alone(loop, healthy, tmp_path, capfd, monkeypatch):
    import errno

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "link", full)
    outs, cache, _, files = _run(loop, tmp_path)
    outs0, cache0 = healthy[0][0], healthy[0][1]
    assert all(torch.equal(a, b) for a, b in zip(outs0, outs)) and torch.equal(cache0, cache)
    err = capfd.readouterr().err
    assert err.count("capture turned off") == 1 and "no space left on the device" in err
    assert files == [] and [f for f in os.listdir(tmp_path)] == []


def test_request_rows_selected_check_pass_from_vllm(loop, healthy, tmp_path, kcheck_bin):
    """KCHECK_CAPTURE_REQUESTS=1: the decode calls keep request row 1 only
    (q, block table, seq lens, o, lse, attn_logits), the calls without
    request rows are whole, and every file still checks: a row of a
    decode is a decode."""
    from safetensors import safe_open

    outs, cache, _, files = _run(loop, tmp_path, requests="1")
    assert all(torch.equal(a, b) for a, b in zip(healthy[0][0], outs))
    with safe_open(str(tmp_path / "decode_attention_fwd.s1.l0.safetensors"), "pt") as f:
        meta = f.metadata()
        assert f.get_slice("q").get_shape()[0] == 1 and f.get_slice("req_to_token").get_shape()[0] == 1
        assert torch.equal(f.get_tensor("o"), healthy[0][0][0][1:2])
    assert meta["kcheck.capture.requests"] == "1" and meta["kcheck.capture.batch_rows"] == "2"
    p = subprocess.run([kcheck_bin, "check", "--json", "--from", "vllm", *files], capture_output=True, text=True)
    results = [json.loads(l) for l in p.stdout.splitlines()]
    bad = [(os.path.basename(r["file"]), r["verdict"], r.get("error")) for r in results if r["verdict"] != "pass"]
    assert p.returncode == 0 and not bad and len(results) == len(files), bad
