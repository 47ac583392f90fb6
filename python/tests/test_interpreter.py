"""The Triton interpreter's two defects and kcheck.worker.interp's fixes.

Each test first shows the defect (so the fix is known to be needed with the
pinned triton), then that the fix removes it.
"""

import subprocess
import sys

SCRIPT = """
from kcheck.worker import interp
print(interp.dot_error(), interp.cast_error())
interp.apply()
print(interp.dot_error(), interp.cast_error(), interp.dot_error("float16"))
"""


def test_bf16_dot_and_fp8_cast_fixed(worker_env):
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=worker_env)
    assert p.returncode == 0, p.stderr
    before, after = [l.split() for l in p.stdout.strip().splitlines()]
    assert float(before[0]) > 1.0, "the interpreter's bf16 tl.dot is right now: drop the fix"
    assert int(before[1]) > 0, "the interpreter's fp8 cast is right now: drop the fix"
    assert float(after[0]) < 1e-3
    assert int(after[1]) == 0
    assert float(after[2]) < 1e-3  # fp16 dots unchanged and right
