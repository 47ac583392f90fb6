"""The worker side of the protocol: list, usage errors and exit statuses."""

import subprocess
import sys

import pytest

from kcheck import engines
from kcheck.worker import WORKERS


def worker(*args):
    return subprocess.run([sys.executable, "-m", "kcheck.worker", *args], capture_output=True, text=True)


def test_list_names_every_worker_without_importing_engines():
    p = worker("list")
    assert p.returncode == 0
    names = [l.split("\t")[0] for l in p.stdout.splitlines()]
    assert names == sorted(WORKERS)
    # listing must stay cheap: kcheck runs it to validate worker:NAME
    check = subprocess.run([sys.executable, "-c", "import sys, kcheck.worker; kcheck.worker.main(['list']); print('torch' in sys.modules)"], capture_output=True, text=True)
    assert check.stdout.strip().endswith("False")


@pytest.mark.parametrize(
    "args, code, says",
    [
        ([], 2, "no arguments"),
        (["vllm"], 2, "expected 'run'"),
        (["vllm", "--set", "x"], 2, "KEY=VALUE"),
        (["vllm", "run", "--kernel", "mla_decode"], 2, "missing --in"),
        (["nosuch", "run", "--kernel", "k", "--in", "a", "--out", "b"], 2, "no worker 'nosuch'"),
        (["torchao", "run", "--kernel", "mla_decode", "--in", "a", "--out", "b"], 4, "has no kernel mla_decode"),
    ],
)
def test_usage_errors(args, code, says):
    p = worker(*args)
    assert p.returncode == code, p.stderr
    assert says in p.stderr


def test_unreadable_input_is_bad_input(tmp_path):
    bad = tmp_path / "in.safetensors"
    bad.write_bytes(b"not a safetensors file")
    p = worker("torchao", "run", "--kernel", "nvfp4_quantize", "--in", str(bad), "--out", str(tmp_path / "out.safetensors"))
    assert p.returncode == 2, p.stderr
    assert "bad input" in p.stderr


def test_engine_table_is_the_go_table():
    # engines.json is generated from internal/engines (a Go test keeps it
    # identical); the workers read the engines' conventions from it.
    assert engines.convention("flashinfer", "splitk_combine", "lse_base") == "2"
    assert engines.convention("vllm", "mla_decode", "lse_base") == "e"
    assert engines.convention("vllm", "nvfp4_dequantize", "scale_layout") == "swizzled_128x4"
    # a quantize capture's layout is read from its call or its shape (the Go
    # table's fp4QuantLayout fix), never a default
    assert engines.convention("vllm", "nvfp4_quantize", "scale_layout") is None
    with pytest.raises(KeyError, match="known"):
        engines.engine("nosuch")
