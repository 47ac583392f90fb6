"""vLLM's TRITON_MLA decode through `kcheck run --backend worker:vllm`.

The worker writes OUT as TRITON_MLA's own call (q, kv_c_and_k_pe_cache,
block_table, seq_lens, o, lse, attn_logits: the names a capture of
forward_mqa has) and declares kcheck.worker.layout = vllm, so kcheck reads
it with the table `--from vllm` reads captures with. On a case whose last
split holds no token (3 tokens over 4 splits: vLLM's split k is
[k*cdiv(3, 4), ...), so split 3 is empty) the unwritten split is left
unjudged by that table while the three written ones are judged; the same
run and the written capture, re-checked, are judged alike; and a capture
edited to read one page from the wrong block fails.
"""

import subprocess

from safetensors import safe_open
from safetensors.torch import load_file, save_file

from conftest import json_lines

CASE = "mla_decode/split/deepseek-v3/tp8/s4/ctx-S-1"


def test_run_and_its_capture_are_read_alike(kcheck_bin, tmp_path, worker_env):
    out = tmp_path / "out"
    p = subprocess.run([kcheck_bin, "run", "--json", "--quiet", "--case", CASE, "--backend", "worker:vllm",
                        "--out", str(out)], capture_output=True, text=True, env=worker_env)
    (run,) = json_lines(p)
    by = {c["tensor"]: c["verdict"] for c in run["checks"]}
    assert run["verdict"] == "pass", (run.get("error"), by, run.get("notes"))
    assert by == {"out": "pass", "lse": "pass", "partial_out": "pass", "partial_lse": "pass"}, by
    notes = "\n".join(run["notes"])
    assert "read as --from vllm reads a capture" in notes
    assert "splits empty, not judged: TRITON_MLA" in notes, notes

    (capture,) = list(out.rglob("*.safetensors"))
    with safe_open(str(capture), "pt") as f:
        meta = f.metadata()
        names = set(f.keys())
    assert meta["kcheck.worker.layout"] == "vllm"
    # Under the interpreter vllm/__init__.py is not run, and the output says so.
    assert "vllm/__init__.py not run" in meta["kcheck.worker.shim"], meta["kcheck.worker.shim"]
    assert {"q", "kv_c_and_k_pe_cache", "block_table", "seq_lens", "o", "lse", "attn_logits"} <= names, names
    assert not names & {"kv_cache", "partial_out", "partial_lse", "out"}, names

    p = subprocess.run([kcheck_bin, "check", "--json", str(capture)], capture_output=True, text=True)
    (again,) = json_lines(p)
    assert again["verdict"] == "pass" and [c["metrics"] for c in again["checks"]] == [c["metrics"] for c in run["checks"]]

    # Planted: the first request's first page read from another block.
    t = load_file(str(capture))
    bt = t["block_table"].clone()
    bt[0, 0] = (int(bt[0, 0]) + 1) % t["kv_c_and_k_pe_cache"].shape[0]
    t["block_table"] = bt
    moved = tmp_path / "moved.safetensors"
    save_file(t, str(moved), metadata=meta)
    p = subprocess.run([kcheck_bin, "check", "--json", str(moved)], capture_output=True, text=True)
    (bad,) = json_lines(p)
    assert bad["verdict"] == "fail", bad
    assert {c["tensor"]: c["verdict"] for c in bad["checks"]}["out"] == "fail"


def test_init_shim_fails_a_run_that_reached_torch_compile(monkeypatch):
    """The shim leaves out env_override's torch._inductor patches on the
    premise that no worker call reaches torch.compile: a run after which
    torch._inductor is imported fails rather than passing on that premise."""
    import sys

    import pytest

    from kcheck.worker import vllm as w

    # (other tests of this process may have imported the real one)
    monkeypatch.delitem(sys.modules, "torch._inductor", raising=False)
    w._check_init_shim(w.INIT_SHIM)
    w._check_init_shim(None)
    monkeypatch.setitem(sys.modules, "torch._inductor", object())
    w._check_init_shim(None)  # no shim applied: nothing to check
    with pytest.raises(RuntimeError, match="torch._inductor was imported during the run"):
        w._check_init_shim(w.SHIM + "; " + w.INIT_SHIM)
