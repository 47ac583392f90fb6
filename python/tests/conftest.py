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


# Helpers the worker tests share (imported as `from conftest import ...`).


def json_lines(p):
    """The JSON results a `kcheck ... --json` run printed, one a line."""
    import json

    return [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]


def catalog_capture(kcheck_bin, tmp_path_factory, case):
    """The reference backend's capture of one catalog case: its path."""
    out = tmp_path_factory.mktemp("ref")
    p = subprocess.run([kcheck_bin, "run", "--quiet", "--case", case, "--out", str(out)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    (f,) = os.listdir(out)
    return str(out / f)


def run_worker(worker_env, engine, kernel, src, dst, *opts):
    """`python -m kcheck.worker ENGINE [--set OPT ...] run --kernel KERNEL`."""
    cmd = [sys.executable, "-m", "kcheck.worker", engine]
    for o in opts:
        cmd += ["--set", o]
    cmd += ["run", "--kernel", kernel, "--in", src, "--out", dst]
    return subprocess.run(cmd, capture_output=True, text=True, env=worker_env)
