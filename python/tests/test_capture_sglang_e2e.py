"""The hook on a decode loop of SGLang's real code (engine_loop.SGLangLoop), end to end.

SGLang 0.5.23's Triton MLA decode (decode_attention_fwd_grouped, stage 1
and stage 2) over two decode-context-parallel ranks and its merge_state,
under Triton's interpreter. The loop runs with the hook off and on
(bit-identical), its captures are checked with `kcheck check --from
sglang`, and with each planted fault `kcheck diagnose` names the stage and
the step:

  fault             culprit     why that step
  token_off_by_one  s2.attn     rank 0 first holds 35 tokens of a request at step 2
  lse_base_mixed    s0.combine  the first decode step (two non-empty splits)

What checks and what cannot: SGLang's decode stores no final lse (stage 2
writes o only), so neither its file nor its pipeline stages have one to
check; every output SGLang does write is checked (stage 1's partials, stage
2's o, merge_state's output and lse). kcheck's mla_decode contract lists
lse as an output; a capture without it is checked on the outputs it holds.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import engine_loop  # noqa: E402

from kcheck import capture  # noqa: E402

STEPS = 3


def _run(directory=None, **sel):
    loop = engine_loop.SGLangLoop(decode_steps=STEPS)
    if directory is None:
        return (*loop.run(), [])
    with capture.capture(directory, steps="all", layers="all", pipeline_steps=STEPS, **sel) as rec:
        outs, pools = loop.run()
    return outs, pools, list(rec.store.files)


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    engine_loop.sglang_modules()
    off = _run()
    on = _run(tmp_path_factory.mktemp("sgl"))
    return off, on


def test_hook_off_and_on_give_bit_identical_results(healthy):
    (outs0, pools0, _), (outs1, pools1, _) = healthy
    assert len(outs0) == len(outs1) == STEPS
    assert all(torch.equal(a, b) for a, b in zip(outs0, outs1))
    assert all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(pools0, pools1))


def test_every_capture_checks_from_sglang(healthy, kcheck_bin):
    files = healthy[1][2]
    names = sorted(os.path.basename(f) for f in files)
    want = [f"sglang_decode_attention_fwd_grouped.s{s}.l{r}.safetensors" for s in range(STEPS) for r in (0, 1)]
    want += [f"sglang_merge_state.s{s}.l0.safetensors" for s in range(STEPS)]
    want += [f"pipeline.l{r}.s0-{STEPS - 1}.safetensors" for r in (0, 1)]
    assert sorted(want) == names
    p = subprocess.run([kcheck_bin, "check", "--json", "--from", "sglang", *files], capture_output=True, text=True)
    results = {os.path.basename(r["file"]): r for r in map(json.loads, p.stdout.splitlines())}
    bad = {n: (r["verdict"], r.get("error")) for n, r in results.items() if r["verdict"] != "pass"}
    assert p.returncode == 0 and not bad and len(results) == len(files), bad
    # What each checked: the decode's partials and o, never an lse it does not have.
    dec = results["sglang_decode_attention_fwd_grouped.s0.l0.safetensors"]
    checked = {st["prefix"]: sorted(c["tensor"] for c in st["local"]) for st in dec["stages"]}
    assert checked == {"attn": ["partial_lse", "partial_out"], "combine": ["out"]}, checked
    merged = results["sglang_merge_state.s0.l0.safetensors"]
    assert sorted(c["tensor"] for c in merged["checks"]) == ["lse", "out"]


def test_healthy_pipeline_diagnoses_clean(healthy, kcheck_bin):
    pipe = [f for f in healthy[1][2] if os.path.basename(f).startswith("pipeline.l0.")][0]
    p = subprocess.run([kcheck_bin, "diagnose", "--json", pipe], capture_output=True, text=True)
    rep = json.loads(p.stdout)
    assert p.returncode == 0 and rep["verdict"] == "pass" and rep["stage"] is None, p.stdout[-2000:]
    # The merges' propagated excess is the attention's accepted deviation
    # carried forward: no step goes wrong, and nothing says an input differs.
    assert rep["first_step"] is None and not any(s["off_floor"] for s in rep["steps"]), rep["steps"]
    assert "not a fault" in rep["reason"], rep["reason"]
    assert "differs" not in rep["reason"], rep["reason"]
    stages = [r["prefix"] for r in rep["capture"]["stages"]]
    assert stages[:3] == ["s0.attn", "s0.combine", "s0.combine2"], stages


@pytest.mark.parametrize("fault, stage, step", [("token_off_by_one", "s2.attn", 2), ("lse_base_mixed", "s0.combine", 0)])
def test_planted_fault_is_named_by_stage_and_step(tmp_path, kcheck_bin, fault, stage, step):
    with engine_loop.sglang_plant(fault):
        *_, files = _run(tmp_path, calls=False)
    pipe = [f for f in files if os.path.basename(f).startswith("pipeline.l0.")][0]
    p = subprocess.run([kcheck_bin, "diagnose", "--json", pipe], capture_output=True, text=True)
    rep = json.loads(p.stdout)
    assert p.returncode == 1, p.stdout[-2000:]
    assert (rep["stage"], rep["first_step"]) == (stage, step), rep.get("reason")
