"""FlashInfer's MLA wrapper under the hook: plan() and run() captured as one call.

FlashInfer's MLA kernels are CUDA-only (flashinfer-python 0.7.2.post1
compiles them for SM80+ at first use), so the engine object here is a
stand-in: a class with BatchMLAPagedAttentionWrapper's plan and run
signatures exactly as the installed source defines them (read from
flashinfer/mla/_batch_mla/_wrapper.py with ast, not imported), whose run
computes the MLA decode in float64 from the plan's page lists. What is
under test is the hook: that a run's capture holds what plan() was given
(the page lists, the scale, the page size) next to run()'s tensors, under
FlashInfer's names, so that `kcheck check --from flashinfer` reads it.
"""

import ast
import importlib.util
import math
import os
import subprocess
import sys
import json
import types

import pytest
import torch

from kcheck import capture
from kcheck.capture import ops as opsmod

WRAPPER = ("mla", "_batch_mla", "_wrapper.py")


def _signature_source(name):
    """The parameter list of BatchMLAPagedAttentionWrapper.<name> (its last
    definition: the implementation after the typing overloads), without
    annotations, as Python source."""
    spec = importlib.util.find_spec("flashinfer")
    if spec is None:
        pytest.skip("flashinfer is not installed")
    path = os.path.join(list(spec.submodule_search_locations)[0], *WRAPPER)
    tree = ast.parse(open(path).read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "BatchMLAPagedAttentionWrapper")
    fn = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name][-1]
    args = fn.args
    for a in args.posonlyargs + args.args + args.kwonlyargs:
        a.annotation = None
    return ast.unparse(args)


def _standin_module():
    m = types.ModuleType("kcheck_flashinfer_standin")

    class BatchMLAPagedAttentionWrapper:
        def _plan(self, a):
            # FlashInfer copies the plan's metadata into its own buffers
            # (the plan info), so what the caller does to its tensors
            # afterwards does not reach the run.
            md = a.get("metadata")
            self.planned = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in a.items()}
            for k in ("qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr"):
                if md is not None and getattr(md, k, None) is not None:
                    self.planned[k] = getattr(md, k).clone()

        def _run(self, a):
            p = self.planned
            q_nope, q_pe = a["query"] if a.get("query") is not None else (a["q_nope"], a["q_pe"])
            ckv, kpe = a["kv_cache"] if a.get("kv_cache") is not None else (a["ckv_cache"], a["kpe_cache"])
            qo, kvp, idx, lens = (p[k].tolist() for k in ("qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr"))
            T, H, Lc = q_nope.shape
            out = torch.zeros(T, H, Lc, dtype=q_nope.dtype) if a.get("out") is None else a["out"]
            lse = torch.empty(T, H, dtype=torch.float32)
            if ckv.dtype == torch.float8_e4m3fn:
                # FP8: dequantized as FlashInfer's own reference does, with
                # the fp32 scales (flashinfer/trace/templates/attention.py
                # lines 2325-2339 in flashinfer-python 0.7.2.post1)
                if a.get("ckv_scale_arr") is not None:
                    arr = a["ckv_scale_arr"].double()
                    ckv = (ckv.double().reshape(*ckv.shape[:-1], -1, 128) * arr.unsqueeze(-1)).reshape(ckv.shape)
                else:
                    ckv = ckv.double() * float(torch.tensor(a["ckv_scale"], dtype=torch.float32))
                kpe = kpe.double() * float(torch.tensor(a["kpe_scale"], dtype=torch.float32))
            for b in range(len(qo) - 1):
                pages = idx[kvp[b]:kvp[b + 1]]
                kc = ckv[pages].reshape(-1, Lc)[: lens[b]].double()
                kp = kpe[pages].reshape(-1, kpe.shape[-1])[: lens[b]].double()
                for t in range(qo[b], qo[b + 1]):
                    s = p["sm_scale"] * (q_nope[t].double() @ kc.T + q_pe[t].double() @ kp.T)  # [H, n]
                    out[t] = (torch.softmax(s, -1) @ kc).to(out.dtype)
                    ls = torch.logsumexp(s, -1)
                    lse[t] = (ls if a.get("return_lse_base_on_e") else ls / math.log(2.0)).float()
            return (out, lse) if a.get("return_lse") else out

    ns = {}
    for name in ("plan", "run"):
        exec(f"def {name}({_signature_source(name)}):\n    a = dict(locals()); a.pop('self')\n    return self._{name}(a)\n", ns)
        setattr(BatchMLAPagedAttentionWrapper, name, ns[name])
    m.BatchMLAPagedAttentionWrapper = BatchMLAPagedAttentionWrapper
    sys.modules[m.__name__] = m
    return m


@pytest.fixture
def standin(monkeypatch):
    m = _standin_module()
    target = "py:kcheck_flashinfer_standin:BatchMLAPagedAttentionWrapper"
    for name in ("flashinfer_mla_plan", "flashinfer_mla_run"):
        op = opsmod.OPS[name]
        monkeypatch.setitem(opsmod.OPS, name, opsmod.Op(**{**op.__dict__, "target": target + "." + name.rsplit("_", 1)[1]}))
    yield m
    sys.modules.pop(m.__name__, None)


def _decode(m, B=2, H=4, P=16, lens=(21, 9), legacy=False):
    g = torch.Generator().manual_seed(3)
    pages = [(n + P - 1) // P for n in lens]
    NP = sum(pages) + 1
    ckv = torch.randn(NP, P, 512, generator=g).bfloat16()
    kpe = torch.randn(NP, P, 64, generator=g).bfloat16()
    q_nope = (torch.randn(B, H, 512, generator=g) / 8).bfloat16()
    q_pe = (torch.randn(B, H, 64, generator=g) / 8).bfloat16()
    kv_indices = torch.randperm(NP, generator=g)[: sum(pages)].to(torch.int32)
    kv_indptr = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()], dtype=torch.int32)
    w = m.BatchMLAPagedAttentionWrapper()
    w.plan(qo_indptr=torch.arange(B + 1, dtype=torch.int32), kv_indptr=kv_indptr, kv_indices=kv_indices,
           kv_len_arr=torch.tensor(lens, dtype=torch.int32), num_heads=H, head_dim_ckv=512, head_dim_kpe=64,
           page_size=P, causal=False, sm_scale=0.1352337788608801, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16,
           lse_mode="base2")
    kv_indices.zero_()  # the engine reuses its plan buffers after plan(): the capture must hold what was planned
    if legacy:
        return w.run(q_nope, q_pe, ckv, kpe, return_lse=True)
    return w.run(query=(q_nope, q_pe), kv_cache=(ckv, kpe), return_lse=True)


@pytest.mark.parametrize("legacy", [False, True], ids=["query=, kv_cache=", "q_nope, q_pe, ckv_cache, kpe_cache"])
def test_flashinfer_run_capture_holds_its_plan_and_checks(standin, tmp_path, kcheck_bin, legacy):
    with capture.capture(tmp_path, ops="flashinfer_mla_run", steps="all", pipeline_steps=0) as rec:
        _decode(standin, legacy=legacy)
    [f] = rec.store.files
    from safetensors import safe_open

    with safe_open(f, "pt") as st:
        names, meta = set(st.keys()), st.metadata()
    assert {"q_nope", "q_pe", "ckv_cache", "kpe_cache", "qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr", "out", "lse"} <= names
    assert meta["sm_scale"] == "0.1352337788608801" and meta["page_size"] == "16" and meta["lse_base"] == "2"
    p = subprocess.run([kcheck_bin, "check", "--json", "--from", "flashinfer", f], capture_output=True, text=True)
    r = json.loads(p.stdout)
    assert (p.returncode, r["verdict"]) == (0, "pass"), (r.get("error"), r.get("notes"))


def test_flashinfer_run_without_its_plan_cannot_check(standin, tmp_path, kcheck_bin, monkeypatch, capsys):
    """The plan is what makes the run checkable: without it (the plan made
    before the hook was on) the capture says so, and kcheck names what is
    missing."""
    m = standin
    w = m.BatchMLAPagedAttentionWrapper
    monkeypatch.setitem(opsmod.OPS, "flashinfer_mla_plan", opsmod.Op(**{**opsmod.OPS["flashinfer_mla_plan"].__dict__, "keeps_plan": False, "target": "py:kcheck_flashinfer_standin:Nothing.plan"}))
    with capture.capture(tmp_path, ops="flashinfer_mla_run", steps="all", pipeline_steps=0) as rec:
        _decode(m)
    assert "no flashinfer_mla_plan call on this object was seen" in capsys.readouterr().err
    [f] = rec.store.files
    p = subprocess.run([kcheck_bin, "check", "--json", "--from", "flashinfer", f], capture_output=True, text=True)
    r = json.loads(p.stdout)
    assert r["verdict"] == "error", r
    assert "block_table" in r["error"] or "kv_indptr" in r["error"], r["error"]
    assert w is m.BatchMLAPagedAttentionWrapper


@pytest.mark.parametrize("tiles", [False, True], ids=["ckv_scale", "ckv_scale_arr"])
def test_flashinfer_fp8_run_capture_checks(standin, tmp_path, kcheck_bin, tiles):
    """FlashInfer's FP8 MLA (kv_data_type float8_e4m3fn; audit I5): the
    capture holds run()'s ckv_scale or ckv_scale_arr and kpe_scale under
    FlashInfer's names, and `kcheck check --from flashinfer` reads them as
    k_scale or k_scale_tiles and k_scale_rope. The stand-in multiplies by
    the fp32 scales as FlashInfer's Python reference does, so the check
    declares k_scale_dtype = f32; the default (bf16, the kernels') is what
    a GPU capture is read with."""
    g = torch.Generator().manual_seed(5)
    B, H, P, lens = 2, 4, 16, (21, 9)
    pages = [(n + P - 1) // P for n in lens]
    NP = sum(pages) + 1
    ckv_x = torch.randn(NP, P, 512, generator=g)
    kpe = (torch.randn(NP, P, 64, generator=g) / 0.0121).to(torch.float8_e4m3fn)
    kw = {"kpe_scale": 0.0121}
    if tiles:
        arr = (ckv_x.reshape(NP, P, 4, 128).abs().amax(-1) / 448).float()
        ckv = (ckv_x.reshape(NP, P, 4, 128) / arr.unsqueeze(-1)).reshape(NP, P, 512).to(torch.float8_e4m3fn)
        kw["ckv_scale_arr"] = arr
    else:
        ckv = (ckv_x / 0.0173).to(torch.float8_e4m3fn)
        kw["ckv_scale"] = 0.0173
    q_nope = (torch.randn(B, H, 512, generator=g) / 8).bfloat16()
    q_pe = (torch.randn(B, H, 64, generator=g) / 8).bfloat16()
    kv_indices = torch.randperm(NP, generator=g)[: sum(pages)].to(torch.int32)
    kv_indptr = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()], dtype=torch.int32)
    with capture.capture(tmp_path, ops="flashinfer_mla_run", steps="all", pipeline_steps=0) as rec:
        w = standin.BatchMLAPagedAttentionWrapper()
        w.plan(qo_indptr=torch.arange(B + 1, dtype=torch.int32), kv_indptr=kv_indptr, kv_indices=kv_indices,
               kv_len_arr=torch.tensor(lens, dtype=torch.int32), num_heads=H, head_dim_ckv=512, head_dim_kpe=64,
               page_size=P, causal=False, sm_scale=0.1352337788608801, q_data_type=torch.bfloat16,
               kv_data_type=torch.float8_e4m3fn, lse_mode="base2")
        w.run(query=(q_nope, q_pe), kv_cache=(ckv, kpe), return_lse=True, **kw)
    [f] = rec.store.files
    from safetensors import safe_open

    with safe_open(f, "pt") as st:
        names, meta = set(st.keys()), st.metadata()
    assert meta["kpe_scale"] == "0.0121"
    assert ("ckv_scale_arr" in names) == tiles and (meta.get("ckv_scale") == "0.0173") != tiles, (names, meta)
    p = subprocess.run([kcheck_bin, "check", "--json", "--from", "flashinfer", "--set", "k_scale_dtype=f32", f],
                       capture_output=True, text=True)
    r = json.loads(p.stdout)
    assert (p.returncode, r["verdict"]) == (0, "pass"), (r.get("error"), r.get("notes"), [c["reason"] for c in r.get("checks", [])])
    notes = " ".join(r["notes"])
    assert "k_scale_rope" in notes and ("k_scale_tiles" in notes) == tiles, notes
