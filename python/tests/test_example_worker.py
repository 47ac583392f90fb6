"""The worker example of reference/CONTRACTS.md, run as a user would: taken
from the document itself, through kcheck run --backend exec:."""

import json
import os
import re
import subprocess
import sys

from conftest import ROOT


def test_contracts_example_passes_and_a_broken_one_fails(kcheck_bin, tmp_path, worker_env):
    doc = open(os.path.join(ROOT, "reference", "CONTRACTS.md")).read()
    code = re.search(r"```python\n(# my_worker.py.*?)```", doc, re.S).group(1)
    good = tmp_path / "my_worker.py"
    good.write_text(code)
    bad = tmp_path / "bad_worker.py"
    # A planted bug: the weights not normalised by the max (overflow-prone,
    # and wrong for the all-empty row).
    bad.write_text(code.replace("w = torch.exp(partial_lse - m)", "w = torch.exp(partial_lse - m) * 1.01"))
    res = {}
    for name, path in (("good", good), ("bad", bad)):
        p = subprocess.run([kcheck_bin, "run", "--json", "--quiet", "--match", "splitk_combine/deepseek-v3/*",
                            "--backend", f"exec:'{sys.executable}' '{path}'"], capture_output=True, text=True, env=worker_env)
        res[name] = [json.loads(l)["verdict"] for l in p.stdout.splitlines()]
    assert res["good"] == ["pass"] * 5, res
    assert "fail" in res["bad"], res
