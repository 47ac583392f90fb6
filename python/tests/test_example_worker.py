"""The worker example of reference/CONTRACTS.md §9.2, run as a user would: taken
from the document itself, through kcheck run --backend exec:."""

import json
import os
import re
import subprocess
import sys

from conftest import ROOT


def _run(kcheck_bin, path, env):
    # Two cases (S = 2 and 4), one worker process each: every process
    # imports torch, tens of seconds on two busy CI cores.
    p = subprocess.run([kcheck_bin, "run", "--json", "--quiet", "--case", "splitk_combine/deepseek-v3/tp8/s2",
                        "--case", "splitk_combine/deepseek-v3/tp8/s4",
                        "--backend", f"exec:'{sys.executable}' '{path}'"], capture_output=True, text=True, env=env)
    return [json.loads(l) for l in p.stdout.splitlines()]


def test_contracts_example_passes_and_a_broken_one_fails(kcheck_bin, tmp_path, worker_env):
    doc = open(os.path.join(ROOT, "reference", "CONTRACTS.md")).read()
    code = re.search(r"```python\n(# my_worker.py.*?)```", doc, re.S).group(1)
    good = tmp_path / "my_worker.py"
    good.write_text(code)
    # A planted bug: every weight 1% high. It cancels in out (the weights
    # are normalised by their sum) and moves lse by log(1.01): the check
    # must fail on lse and nothing else.
    planted = code.replace("w = torch.exp(partial_lse - m)", "w = torch.exp(partial_lse - m) * 1.01")
    assert planted != code, "the example no longer has the line the planted bug edits"
    bad = tmp_path / "bad_worker.py"
    bad.write_text(planted)
    res = {name: _run(kcheck_bin, path, worker_env) for name, path in (("good", good), ("bad", bad))}
    verdicts = {name: [r["verdict"] for r in rs] for name, rs in res.items()}
    print("verdicts:", verdicts)
    assert verdicts["good"] == ["pass"] * 2, res["good"]
    # Every case holds non-empty rows, whose lse the bug moves.
    assert verdicts["bad"] == ["fail"] * 2, verdicts
    for r in res["bad"]:
        if r["verdict"] == "fail":
            by = {c["tensor"]: c["verdict"] for c in r["checks"]}
            assert by.get("lse") == "fail", (r["file"], by)
            print(r["file"], by)
