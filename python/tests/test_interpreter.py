"""The Triton interpreter's four defects and kcheck.worker.interp's fixes.

Each test first shows the defect (so the fix is known to be needed with the
pinned triton), then that the fix removes it.
"""

import subprocess
import sys

SCRIPT = """
from kcheck.worker import interp
print(interp.dot_error(), interp.cast_error("float8_e4m3fn"), interp.cast_error("bfloat16"), interp.mask_error())
interp.apply()
print(interp.dot_error(), interp.cast_error("float8_e4m3fn"), interp.cast_error("bfloat16"), interp.dot_error("float16"), interp.mask_error())
"""


def test_bf16_dot_bf16_cast_fp8_cast_and_int_mask_fixed(worker_env):
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=worker_env)
    assert p.returncode == 0, p.stderr
    before, after = [l.split() for l in p.stdout.strip().splitlines()]
    assert float(before[0]) > 1.0, "the interpreter's bf16 tl.dot is right now: drop the fix"
    assert int(before[1]) > 0, "the interpreter's fp8 cast is right now: drop the fix"
    # fp32 -> bf16 truncates: about half of 4096 normal values round differently
    assert int(before[2]) > 1000, "the interpreter's bf16 cast is right now: drop the fix"
    assert before[3] == "True", "the interpreter takes a (tensor < n) & (i < n) mask now: drop the fix"
    assert float(after[0]) < 1e-3
    assert int(after[1]) == 0
    assert int(after[2]) == 0
    assert float(after[3]) < 1e-3  # fp16 dots unchanged and right
    assert after[4] == "False"


def test_findings_reproduce(worker_env):
    """Each reproduction in python/findings still shows its defect (without the fix)."""
    import os

    from conftest import ROOT

    for name, marker in (("triton_interpreter_bf16_cast.py", "<- differs"), ("triton_interpreter_fp8_cast.py", "<- differs"),
                         ("triton_interpreter_int_mask.py", "mask has unsupported dtype")):
        p = subprocess.run([sys.executable, os.path.join(ROOT, "python", "findings", name)], capture_output=True, text=True, env=worker_env)
        assert p.returncode == 0, p.stderr
        assert marker in p.stdout, (name, p.stdout)
