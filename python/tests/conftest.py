import os
import shutil
import subprocess
import sys

import pytest

# The workers run Triton kernels on the CPU: the interpreter must be on
# before triton is imported anywhere in the test process.
os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.fixture(scope="session")
def kcheck_bin(tmp_path_factory):
    """bin/kcheck, built from the repository (go on PATH), or $KCHECK."""
    if os.environ.get("KCHECK"):
        return os.environ["KCHECK"]
    go = shutil.which("go") or "/usr/local/go/bin/go"
    out = str(tmp_path_factory.mktemp("bin") / "kcheck")
    subprocess.run([go, "build", "-o", out, "./cmd/kcheck"], cwd=ROOT, check=True)
    return out


@pytest.fixture
def worker_env():
    env = dict(os.environ)
    env["KCHECK_PYTHON"] = sys.executable
    env["TRITON_INTERPRET"] = "1"
    # A worker imports torch (seconds on an idle machine, minutes on a
    # loaded one): do not let the 2-minute default turn load into "hang".
    env.setdefault("KCHECK_WORKER_TIMEOUT", "10m")
    return env
