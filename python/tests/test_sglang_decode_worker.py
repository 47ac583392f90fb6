"""SGLang's Triton grouped decode through `kcheck run --backend worker:sglang`.

The worker writes OUT as SGLang's own call (k_buffer, kv_indptr,
kv_indices, num_kv_splits, o, attn_logits, attn_lse) and declares
kcheck.worker.layout = sglang, so kcheck reads it with the table
`--from sglang` reads captures with: the same run and the written capture,
re-checked, are judged alike; the splits SGLang never writes are left out
by that table, the final lse (which SGLang does not compute) is named as
not judged, and a capture edited to read one token off fails.
"""

import subprocess

from safetensors import safe_open
from safetensors.torch import load_file, save_file

from conftest import json_lines

CASE = "mla_decode/deepseek-v3/tp8/bf16/p16/ctx-P+1"


def test_run_and_its_capture_are_read_alike(kcheck_bin, tmp_path, worker_env):
    out = tmp_path / "out"
    p = subprocess.run([kcheck_bin, "run", "--json", "--quiet", "--case", CASE, "--backend", "worker:sglang",
                        "--out", str(out)], capture_output=True, text=True, env=worker_env)
    (run,) = json_lines(p)
    by = {c["tensor"]: c["verdict"] for c in run["checks"]}
    assert run["verdict"] == "pass", (run.get("error"), by, run.get("notes"))
    assert by == {"out": "pass", "partial_out": "pass", "partial_lse": "pass"}, by
    notes = "\n".join(run["notes"])
    assert "read as --from sglang reads a capture" in notes
    assert "splits empty, not judged" in notes
    assert "lse: not judged" in notes

    (capture,) = list(out.rglob("*.safetensors"))
    with safe_open(str(capture), "pt") as f:
        meta = f.metadata()
        names = set(f.keys())
    assert meta["kcheck.worker.layout"] == "sglang"
    assert {"k_buffer", "kv_indptr", "kv_indices", "attn_logits", "attn_lse", "o"} <= names, names
    assert not names & {"kv_cache", "block_table", "partial_out", "out"}, names

    p = subprocess.run([kcheck_bin, "check", "--json", str(capture)], capture_output=True, text=True)
    (again,) = json_lines(p)
    assert again["verdict"] == "pass" and [c["metrics"] for c in again["checks"]] == [c["metrics"] for c in run["checks"]]

    p = subprocess.run([kcheck_bin, "check", "--json", "--from", "vllm", str(capture)], capture_output=True, text=True)
    (other,) = json_lines(p)
    assert other["verdict"] == "error" and "not those --from vllm reads" in other["error"], other

    # Planted: request 0 reads each token from the next token's slot.
    t = load_file(str(capture))
    idx = t["kv_indices"].clone()
    n0 = int(t["kv_indptr"][1])
    idx[: n0 - 1] = t["kv_indices"][1:n0]
    t["kv_indices"] = idx
    shifted = tmp_path / "shifted.safetensors"
    save_file(t, str(shifted), metadata=meta)
    p = subprocess.run([kcheck_bin, "check", "--json", str(shifted)], capture_output=True, text=True)
    (bad,) = json_lines(p)
    assert bad["verdict"] == "fail", bad
    assert {c["tensor"]: c["verdict"] for c in bad["checks"]}["out"] == "fail"
