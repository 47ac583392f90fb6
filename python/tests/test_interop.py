"""kcheck's files load with the official safetensors (numpy and torch), and
files safetensors.torch.save_file writes check in kcheck."""

import json
import subprocess

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file as load_pt
from safetensors.torch import save_file


def test_kcheck_files_load_with_safetensors(kcheck_bin, tmp_path):
    out = tmp_path / "caps"
    for case in ("kv_cache_write/fp8_ds_mla/p16/amax", "nvfp4_quantize/m16/k2048/swizzled_128x4",
                 "mla_decode/deepseek-v3/tp8/fp8_e4m3/p16/ctx-P+1", "kv_cache_gather/fp8_e4m3/p16/ctx-P+1"):
        p = subprocess.run([kcheck_bin, "run", "--case", case, "--out", str(out), "--quiet"], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
    files = sorted(out.iterdir())
    assert len(files) == 4
    dtypes, by_numpy = set(), 0
    for f in files:
        pt = load_pt(str(f))
        dtypes |= {str(t.dtype) for t in pt.values()}
        # numpy has no bf16 or fp8 dtype, so read the tensors it has one for.
        with safe_open(str(f), "np") as g:
            for k in g.keys():
                if pt[k].dtype in (torch.float32, torch.int32, torch.int64, torch.uint8):
                    assert np.array_equal(g.get_tensor(k), pt[k].numpy()), k
                    by_numpy += 1
    assert by_numpy >= 8, "too few tensors read with safetensors numpy"
    assert {"torch.bfloat16", "torch.uint8", "torch.float32", "torch.int32"} <= dtypes


def test_numpy_loads_kcheck_file_without_bf16(kcheck_bin, tmp_path):
    out = tmp_path / "caps"
    p = subprocess.run([kcheck_bin, "run", "--case", "splitk_combine/deepseek-v3/tp8/s2", "--out", str(out), "--quiet"], capture_output=True, text=True)
    assert p.returncode == 0
    # splitk_combine's out is BF16 by default; numpy cannot load that, so
    # check the fp32 tensors through torch and numpy agree.
    f = next(out.iterdir())
    pt = load_pt(str(f))
    assert pt["partial_out"].dtype == torch.float32 and pt["partial_lse"].shape[1] == 2


def _check(kcheck_bin, path):
    p = subprocess.run([kcheck_bin, "check", "--json", str(path)], capture_output=True, text=True)
    return p.returncode, json.loads(p.stdout.splitlines()[0])


def test_torch_written_files_check_in_kcheck(kcheck_bin, tmp_path):
    """A kv_cache_gather capture written by torch: fp8 cache as float8_e4m3fn,
    int32 tables, the gathered rows in bf16 as torch computes them
    (fp8 -> float32 * scale -> bf16), and an int64 extra; then the same
    with one row wrong, which must fail."""
    g = torch.Generator().manual_seed(3)
    NB, P, D = 4, 16, 576
    scale = torch.tensor(0.05)
    cache = (torch.randn(NB, P, D, generator=g) * 8).to(torch.float8_e4m3fn)
    block_table = torch.tensor([[2, 0], [1, 3]], dtype=torch.int32)
    seq_lens = torch.tensor([20, 5], dtype=torch.int32)
    rows = []
    for b in range(2):
        for t in range(int(seq_lens[b])):
            rows.append(cache[block_table[b, t // P], t % P].float() * scale)
    gathered = torch.stack(rows).bfloat16()
    meta = {"kcheck.format": "1", "kcheck.kernel": "kv_cache_gather", "kv_cache_dtype": "fp8_e4m3", "page_size": str(P)}
    ok = tmp_path / "gather.safetensors"
    save_file({"cache": cache, "block_table": block_table, "seq_lens": seq_lens, "k_scale": scale.reshape(()), "gathered": gathered,
               "extra_i64": torch.arange(3, dtype=torch.int64)}, str(ok), metadata=meta)
    code, res = _check(kcheck_bin, ok)
    assert res["verdict"] == "pass", res
    bad = tmp_path / "gather_bad.safetensors"
    wrong = gathered.clone()
    wrong[21] = wrong[0]
    save_file({"cache": cache, "block_table": block_table, "seq_lens": seq_lens, "k_scale": scale.reshape(()), "gathered": wrong}, str(bad), metadata=meta)
    code, res = _check(kcheck_bin, bad)
    assert res["verdict"] == "fail" and code == 1, res


def test_torch_written_nvfp4_checks(kcheck_bin, tmp_path):
    """nvfp4_dequantize written by torch: uint8-packed FP4, float8_e4m3fn
    block scales, f16 output computed by torch."""
    g = torch.Generator().manual_seed(4)
    M, K = 8, 64
    codes = torch.randint(0, 16, (M, K), generator=g, dtype=torch.uint8)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()
    lut = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
    bs = (torch.rand(M, K // 16, generator=g) * 4 + 0.1).to(torch.float8_e4m3fn)
    gs = torch.tensor([0.01], dtype=torch.float32)
    out = (lut[codes.long()] * bs.float().repeat_interleave(16, dim=1) * gs).half()
    meta = {"kcheck.format": "1", "kcheck.kernel": "nvfp4_dequantize", "scale_layout": "linear", "global_scale_kind": "dequant"}
    f = tmp_path / "dq.safetensors"
    save_file({"packed": packed, "block_scale": bs, "global_scale": gs, "out": out}, str(f), metadata=meta)
    code, res = _check(kcheck_bin, f)
    assert res["verdict"] == "pass", res
