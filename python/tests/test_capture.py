"""kcheck.capture without an engine: selection, files, budget, failures, activation.

The engine calls here are a small Python function registered as an op of
the hook's table (what the hook does with vLLM's decode_attention_fwd it
does with any Python entry point); test_capture_e2e.py runs vLLM's own.
"""

import ast
import errno
import importlib.util
import os
import subprocess
import sys
import types

import pytest
import torch

from kcheck import capture
from kcheck.capture import ops as opsmod
from kcheck.capture.select import SelectionError, from_env
from kcheck.capture.store import CaptureError, Store


@pytest.mark.parametrize(
    "env, want",
    [
        ({}, None),
        ({"KCHECK_CAPTURE": "/d"}, dict(layers={0}, steps={0, 1, 2, 3}, max_bytes=1 << 30, pipeline_steps=4, calls=True)),
        ({"KCHECK_CAPTURE": "/d", "KCHECK_CAPTURE_LAYERS": "0,2-3", "KCHECK_CAPTURE_STEPS": "all", "KCHECK_CAPTURE_MAX_BYTES": "500M",
          "KCHECK_CAPTURE_PIPELINE": "0", "KCHECK_CAPTURE_CALLS": "0", "KCHECK_CAPTURE_OPS": "concat_and_cache_mla"},
         dict(layers={0, 2, 3}, steps=None, max_bytes=500 << 20, pipeline_steps=0, calls=False, ops={"concat_and_cache_mla"})),
    ],
)
def test_selection_from_env(env, want):
    sel = from_env(env)
    if want is None:
        assert sel is None
        return
    for k, v in want.items():
        assert getattr(sel, k) == v, k


@pytest.mark.parametrize(
    "env, says",
    [
        ({"KCHECK_CAPTURE_LAYERS": "1-"}, "KCHECK_CAPTURE_LAYERS = '1-'"),
        ({"KCHECK_CAPTURE_STEPS": "5-2"}, "runs backwards"),
        ({"KCHECK_CAPTURE_MAX_BYTES": "lots"}, "KCHECK_CAPTURE_MAX_BYTES"),
        ({"KCHECK_CAPTURE_OPS": "nosuch_op"}, "unknown op nosuch_op"),
        ({"KCHECK_CAPTURE_CALLS": "yes"}, "want 0 or 1"),
        ({"KCHECK_CAPTURE_PIPELINE": "-1"}, "KCHECK_CAPTURE_PIPELINE"),
    ],
)
def test_selection_errors_name_the_variable(env, says):
    with pytest.raises(SelectionError, match=says.replace("(", r"\(").replace("[", r"\[")):
        from_env({"KCHECK_CAPTURE": "/d", **env})


def test_start_from_env_never_raises(capsys):
    assert capture.start_from_env({"KCHECK_CAPTURE": "/d", "KCHECK_CAPTURE_STEPS": "x"}, who="test") is None
    assert "not capturing: KCHECK_CAPTURE_STEPS" in capsys.readouterr().err
    assert capture.active() is None


def test_store_never_replaces_a_file(tmp_path):
    s = Store(str(tmp_path), None)
    (tmp_path / "x.safetensors").write_bytes(b"someone else's file")
    p = s.write("x", {"a": torch.arange(3)}, {"kcheck.format": "1"})
    assert p.endswith("x.1.safetensors")
    assert (tmp_path / "x.safetensors").read_bytes() == b"someone else's file"
    assert [f.name for f in tmp_path.iterdir() if f.name.startswith(".")] == []  # no temporary left


def test_store_disk_full_is_a_capture_error(tmp_path, monkeypatch):
    import safetensors.torch as st

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(st, "save_file", full)
    with pytest.raises(CaptureError, match="no space left"):
        Store(str(tmp_path), None).write("x", {"a": torch.arange(3)}, {})
    assert list(tmp_path.iterdir()) == []


# --- the recorder around a Python entry point --------------------------------

def _toy_module():
    """A stand-in engine module: an attention-like call that reads a cache
    and writes an output buffer, and a cache write in place."""
    m = types.ModuleType("kcheck_toy_engine")

    def write(kv_c, kv_cache, slot_mapping):
        kv_cache.view(-1, kv_cache.shape[-1])[slot_mapping] = kv_c

    def read(q, kv_cache, out):
        out.copy_(q * kv_cache.sum())
        return out

    m.write, m.read = write, read
    sys.modules[m.__name__] = m
    return m


@pytest.fixture
def toy(monkeypatch):
    m = _toy_module()
    monkeypatch.setitem(opsmod.OPS, "toy_write", opsmod.Op("toy_write", "vllm", "kv_cache_write", "cache", "py:kcheck_toy_engine:write",
                                                          inplace=("kv_cache",), cache="kv_cache"))
    monkeypatch.setitem(opsmod.OPS, "toy_read", opsmod.Op("toy_read", "vllm", "mla_decode", "attn", "py:kcheck_toy_engine:read",
                                                         outputs=("out",), cache="kv_cache"))
    yield m
    sys.modules.pop(m.__name__, None)


def _steps(m, n=3):
    cache = torch.zeros(2, 4, 8)
    outs = []
    for i in range(n):
        m.write(torch.full((1, 8), float(i + 1)), cache, torch.tensor([i]))
        out = torch.empty(3)
        outs.append(m.read(torch.arange(3.0), cache, out).clone())
    return outs, cache


def test_records_before_and_after_and_leaves_results_alone(toy, tmp_path):
    from safetensors.torch import load_file

    plain = _steps(toy)
    with capture.capture(tmp_path, ops="toy_write,toy_read", steps="all", pipeline_steps=0) as rec:
        hooked = _steps(toy)
    assert all(torch.equal(a, b) for a, b in zip(plain[0], hooked[0])) and torch.equal(plain[1], hooked[1])
    names = sorted(os.path.basename(f) for f in rec.store.files)
    assert names == [f"toy_{k}.s{i}.l0.safetensors" for k in ("read", "write") for i in range(3)]
    w = load_file(str(tmp_path / "toy_write.s1.l0.safetensors"))
    assert w["kv_cache_before"].view(-1, 8)[1].abs().sum() == 0 and torch.equal(w["kv_cache_after"].view(-1, 8)[1], torch.full((8,), 2.0))
    r = load_file(str(tmp_path / "toy_read.s2.l0.safetensors"))
    assert torch.equal(r["out"], hooked[0][2])
    assert toy.write.__name__ == "write" and not hasattr(toy.write, "__kcheck_capture_original__")  # unhooked again


def test_an_unreadable_call_is_said_once_and_capture_turns_off(toy, tmp_path, capsys, monkeypatch):
    from kcheck.capture import recorder

    plain = _steps(toy)

    def broken(t):
        raise RuntimeError("this tensor cannot be copied")

    monkeypatch.setattr(recorder, "_copy", broken)
    with capture.capture(tmp_path, ops="toy_write,toy_read", steps="all") as rec:
        hooked = _steps(toy)
    assert all(torch.equal(a, b) for a, b in zip(plain[0], hooked[0]))
    err = capsys.readouterr().err
    assert err.count("capture turned off") == 1 and "this tensor cannot be copied" in err
    assert rec.store.files == []


def test_disk_full_mid_run_is_said_once(toy, tmp_path, capsys, monkeypatch):
    plain = _steps(toy)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "link", full)
    with capture.capture(tmp_path, ops="toy_write,toy_read", steps="all"):
        hooked = _steps(toy)
    assert all(torch.equal(a, b) for a, b in zip(plain[0], hooked[0]))
    err = capsys.readouterr().err
    assert err.count("capture turned off") == 1 and "no space left on the device" in err


def test_budget_is_never_exceeded(toy, tmp_path, capsys):
    budget = 200 << 10  # room for about two calls (each counts 64 KiB of header slack)
    with capture.capture(tmp_path, ops="toy_write,toy_read", steps="all", max_bytes=budget, pipeline_steps=0) as rec:
        _steps(toy, n=5)
    assert 0 < len(rec.store.files) < 10
    assert sum(os.path.getsize(f) for f in rec.store.files) <= budget
    err = capsys.readouterr().err
    assert err.count("byte budget") == 1 and "KCHECK_CAPTURE_MAX_BYTES" in err


def test_cuda_graph_capture_is_detected_and_the_flags_named(toy, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with capture.capture(tmp_path, ops="toy_write,toy_read", steps="all") as rec:
        _steps(toy)
    err = capsys.readouterr().err
    assert err.count("a CUDA graph is being captured") == 1 and "--enforce-eager" in err and "--disable-decode-cuda-graph" in err
    assert rec.store.files == []


def test_steps_and_pipeline_links_from_identity(toy, tmp_path):
    from safetensors import safe_open

    monkey = opsmod.OPS["toy_read"]
    # The toy read as a contract stage that reads the cache it was given.
    monkey.contract = lambda c: [opsmod.Part("attn", "mla_decode", {"kv_cache": (c.before["kv_cache"], c.identity("kv_cache"))}, set())]
    opsmod.OPS["toy_write"].contract = lambda c: [opsmod.Part("cache", "kv_cache_write", {
        "cache_before": (c.before["kv_cache"], c.identity("kv_cache")), "cache_after": (c.after["kv_cache"], c.identity("kv_cache@after"))}, {"cache_after"})]
    try:
        with capture.capture(tmp_path, ops="toy_write,toy_read", steps="all", pipeline_steps=3, calls=False) as rec:
            _steps(toy)
    finally:
        monkey.contract = opsmod.OPS["toy_write"].contract = None
    [p] = rec.store.files
    meta = safe_open(p, "pt").metadata()
    assert meta["kcheck.stages"] == "s0.cache,s0.attn,s1.cache,s1.attn,s2.cache,s2.attn"
    assert meta["kcheck.s0.attn.from.kv_cache"] == "s0.cache.cache_after"
    assert meta["kcheck.s1.cache.from.cache_before"] == "s0.cache.cache_after"
    assert meta["kcheck.s2.attn.from.kv_cache"] == "s2.cache.cache_after"
    with safe_open(p, "pt") as f:
        assert "s1.cache.cache_before" not in f.keys() and "s0.cache.cache_before" in f.keys()


# --- activation ----------------------------------------------------------------

def test_engines_find_the_plugin_entry_points():
    from importlib.metadata import entry_points

    assert "kcheck.capture.plugin:vllm" in [e.value for e in entry_points(group="vllm.general_plugins")]
    assert "kcheck.capture.plugin:sglang" in [e.value for e in entry_points(group="sglang.srt.plugins")]


def test_pth_line_imports_nothing_unless_asked():
    code = "import sys; print('kcheck.capture.autoload' in sys.modules, 'torch' in sys.modules)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCHECK_CAPTURE")}
    off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    on = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**env, "KCHECK_CAPTURE": "/tmp/x"})
    assert off.stdout.split() == ["False", "False"], off.stderr
    assert on.stdout.split() == ["True", "False"], on.stderr  # waits for an engine before importing torch


def _params(path, qual):
    """A function's parameter names, read from the installed source (no import)."""
    tree = ast.parse(open(path).read())
    *cls, name = qual.split(".")
    body = tree.body
    for c in cls:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == c).body
    fns = [n for n in body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert fns, f"{qual} is not defined in {path}"
    a = fns[-1].args
    return [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]


@pytest.mark.parametrize("name", sorted(n for n, o in opsmod.OPS.items() if o.target.startswith("py:")))
def test_python_entry_points_have_the_names_the_hook_reads(name):
    op = opsmod.OPS[name]
    module, qual = op.target[3:].split(":")
    spec = importlib.util.find_spec(module.split(".")[0])
    if spec is None:
        pytest.skip(f"{module.split('.')[0]} is not installed")
    path = os.path.join(list(spec.submodule_search_locations)[0], *module.split(".")[1:]) + ".py"
    params = _params(path, qual)
    named = [*(op.cache or "").split("|"), *op.inplace, *op.outputs, *op.views, *op.rows, *(n for pair in op.csr for n in pair)]
    named += [k.split(".")[0] for k in op.rename] if op.target.startswith("py:") else []
    for n in named:
        if n and n not in op.returns and n not in op.rename.values():
            assert n in params, f"{qual} has no parameter {n} ({params})"


# --- request rows ---------------------------------------------------------------

@pytest.fixture
def rowed(toy, monkeypatch):
    """The toy engine with an attention-like call that carries request rows
    (q, block_table and out have one row a request)."""

    def attend(q, block_table, kv_cache, out):
        out.copy_(q * kv_cache.sum() + block_table.float())
        return out

    toy.attend = attend
    monkeypatch.setitem(opsmod.OPS, "toy_attend", opsmod.Op("toy_attend", "vllm", "mla_decode", "attn", "py:kcheck_toy_engine:attend",
                                                           outputs=("out",), cache="kv_cache", rows=("q", "block_table", "out")))
    return toy


def _rowed_steps(m, n=2, B=3):
    cache = torch.zeros(2, 4, 8)
    outs = []
    for i in range(n):
        m.write(torch.full((1, 8), float(i + 1)), cache, torch.tensor([i]))
        q = torch.arange(B * 2.0).reshape(B, 2) + i
        bt = torch.arange(B * 2).reshape(B, 2)
        outs.append(m.attend(q, bt, cache, torch.empty(B, 2)).clone())
    return outs, cache


@pytest.mark.parametrize("requests, rows", [("1", [1]), ("0,2", [0, 2]), ("2-9", [2]), ("all", None)])
def test_request_rows_keep_the_selected_batch_rows(rowed, tmp_path, capsys, requests, rows):
    from safetensors import safe_open

    plain = _rowed_steps(rowed)
    with capture.capture(tmp_path, ops="toy_write,toy_attend", steps="all", pipeline_steps=0, requests=requests) as rec:
        hooked = _rowed_steps(rowed)
    assert all(torch.equal(a, b) for a, b in zip(plain[0], hooked[0])) and torch.equal(plain[1], hooked[1])
    with safe_open(str(tmp_path / "toy_attend.s1.l0.safetensors"), "pt") as f:
        got = {k: f.get_tensor(k) for k in f.keys()}
        meta = f.metadata()
    keep = list(range(3)) if rows is None else rows
    q = torch.arange(6.0).reshape(3, 2) + 1
    assert torch.equal(got["q"], q[keep]) and torch.equal(got["out"], hooked[0][1][keep])
    assert torch.equal(got["block_table"], torch.arange(6).reshape(3, 2)[keep])
    assert torch.equal(got["kv_cache"], plain[1])  # the cache has no request rows: whole
    err = capsys.readouterr().err
    if rows is None:
        assert "kcheck.capture.requests" not in meta and "KCHECK_CAPTURE_REQUESTS" not in err
        return
    assert meta["kcheck.capture.requests"] == ",".join(map(str, rows)) and meta["kcheck.capture.batch_rows"] == "3"
    with safe_open(str(tmp_path / "toy_write.s1.l0.safetensors"), "pt") as f:
        assert "kcheck.capture.requests" not in f.metadata()
    assert err.count("toy_write carries no request row") == 1


def test_request_rows_outside_every_call_capture_none_of_it(rowed, tmp_path, capsys):
    with capture.capture(tmp_path, ops="toy_write,toy_attend", steps="all", pipeline_steps=0, requests="7") as rec:
        _rowed_steps(rowed)
    names = sorted(os.path.basename(f) for f in rec.store.files)
    assert names == ["toy_write.s0.l0.safetensors", "toy_write.s1.l0.safetensors"]
    assert capsys.readouterr().err.count("has 3 request rows, none of them selected") == 1


def test_request_rows_cut_token_lists_by_segment(tmp_path, monkeypatch):
    """A CSR token list (SGLang's kv_indptr / kv_indices) keeps the selected
    requests' segments, in order, under a new indptr."""
    from kcheck.capture.recorder import Call

    op = opsmod.Op("t", "sglang", "mla_decode", "attn", "py:x:y", rows=("q",), csr=(("kv_indptr", "kv_indices"),))
    c = Call(op, {}, {}, [])
    c.rows = [0, 2]
    c.before = {"kv_indptr": torch.tensor([0, 3, 5, 9], dtype=torch.int32), "kv_indices": torch.arange(10, 20)}
    c.ids_before = {"kv_indptr": ("a",), "kv_indices": ("b",)}
    c.select_csr()
    assert c.before["kv_indptr"].tolist() == [0, 3, 7] and c.before["kv_indptr"].dtype == torch.int32
    assert c.before["kv_indices"].tolist() == [10, 11, 12, 15, 16, 17, 18]
