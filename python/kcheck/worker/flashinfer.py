"""FlashInfer's Triton cascade kernels (flashinfer-python 0.7.2.post1).

flashinfer/triton/kernels/cascade.py imports only triton, but importing it
as a package module first runs flashinfer/__init__.py (tvm_ffi, the CUDA
JIT machinery) and its wrapper flashinfer/triton/cascade.py asserts CUDA
tensors on an SM90 GPU (check_input, check_device). So the worker loads the
installed kernel file by its path and launches merge_states_kernel itself,
with the wrapper's arguments (flashinfer/triton/cascade.py merge_states:
grid (seq_len,), bdx = head_dim, bdy = num_heads).
"""

import importlib.util
import os

import torch

from kcheck.worker import BadInput, Unavailable
from kcheck.worker.common import need, provenance, require_convention


def _cascade():
    spec = importlib.util.find_spec("flashinfer")
    if spec is None or not spec.submodule_search_locations:
        raise Unavailable("flashinfer-python is not installed")
    path = os.path.join(list(spec.submodule_search_locations)[0], "triton", "kernels", "cascade.py")
    s = importlib.util.spec_from_file_location("flashinfer_triton_kernels_cascade", path)
    mod = importlib.util.module_from_spec(s)
    s.loader.exec_module(mod)
    return mod, path


def splitk_combine(tensors, meta, opts):
    """merge_states(v [T, S, H, D], s [T, S, H]) -> (v_merged [T, H, D], s_merged
    [T, H]), base 2 (state_merge's exp2, state_get_lse's log2). Contract rows
    are tokens with one head."""
    require_convention(meta, "flashinfer", "splitk_combine", "lse_base", "e")
    po = need(tensors, "partial_out")
    pl = need(tensors, "partial_lse")
    if po.dim() != 3 or pl.dim() != 2:
        raise BadInput("partial_out must be [N, S, L] and partial_lse [N, S]")
    N, S, L = po.shape
    mod, path = _cascade()
    v = po.reshape(N, S, 1, L).contiguous()
    s = pl.reshape(N, S, 1).to(torch.float32).contiguous()
    v_merged = torch.empty(N, 1, L, dtype=v.dtype, device=v.device)
    s_merged = torch.empty(N, 1, dtype=torch.float32, device=v.device)
    mod.merge_states_kernel[(N,)](v, s, v_merged, s_merged, S, 1, L, bdx=L, bdy=1)
    m = provenance("flashinfer", "flashinfer-python", "flashinfer/triton/kernels/cascade.py merge_states_kernel (loaded by path)")
    return {"out": v_merged.reshape(N, L), "lse": s_merged.reshape(N)}, m


def kernels(name):
    return {"splitk_combine": splitk_combine}
