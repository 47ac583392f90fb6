"""The engines' own modules, loaded so their Triton kernels run on the CPU.

Two shims, both of import plumbing, never of a kernel:
- vLLM's Triton modules take `triton`/`tl` from vllm.triton_utils, which
  hands out placeholders without a GPU driver: kcheck.worker.vllm._load
  puts the real triton back (its docstring says why).
- vllm/models/deepseek_v32/common/kernels.py (the fused DeepSeek-V3.2 norm,
  RoPE and cache writer) is loaded by its path, since importing it as a
  package module runs vllm/models/deepseek_v32/__init__.py, which needs
  transformers, and its imports vllm.utils.deep_gemm and
  vllm.v1.kv_cache_interface pull in vllm.config (cbor2, transformers). Those
  two modules are replaced by stand-ins holding only the two functions the
  kernel file calls: mqa_logits_use_mx_scales (what the platform would
  answer: False on sm90, True on sm100, passed in) and
  is_quantized_kv_cache (asked only about fp8_ds_mla here; it refuses any
  other dtype rather than guess).
"""

import importlib.util
import os
import sys
import types

os.environ.setdefault("TRITON_INTERPRET", "1")

SHIM_DSV32 = ("vllm/models/deepseek_v32/common/kernels.py loaded by path; vllm.utils.deep_gemm and "
              "vllm.v1.kv_cache_interface stood in by their two functions the file calls (transformers, cbor2 absent)")


def interpreter():
    from kcheck.worker import interp

    return interp.apply()


_vllm = {}


def vllm_module(name):
    """(module, shim note or None), imported once."""
    from kcheck.worker.vllm import _load

    interpreter()
    if name not in _vllm:
        _vllm[name] = _load(name)
    return _vllm[name]


_dsv32 = {}


def vllm_dsv32_kernels(mx_scales=False):
    """The fused DeepSeek-V3.2 kernel file, with the platform's MX-scale answer."""
    if mx_scales in _dsv32:
        return _dsv32[mx_scales]
    vllm_module("vllm.v1.attention.ops.common")
    import vllm

    dg = types.ModuleType("vllm.utils.deep_gemm")
    dg.mqa_logits_use_mx_scales = lambda: mx_scales
    ki = types.ModuleType("vllm.v1.kv_cache_interface")

    def is_quantized_kv_cache(kv_cache_dtype):
        if kv_cache_dtype != "fp8_ds_mla":
            raise ValueError(f"stand-in is_quantized_kv_cache asked about {kv_cache_dtype}")
        return True

    ki.is_quantized_kv_cache = is_quantized_kv_cache
    saved = {k: sys.modules.get(k) for k in ("vllm.utils.deep_gemm", "vllm.v1.kv_cache_interface")}
    sys.modules["vllm.utils.deep_gemm"] = dg
    sys.modules["vllm.v1.kv_cache_interface"] = ki
    try:
        path = os.path.join(os.path.dirname(vllm.__file__), "models", "deepseek_v32", "common", "kernels.py")
        spec = importlib.util.spec_from_file_location(f"kcheck_corpus_vllm_dsv32_{int(mx_scales)}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    _dsv32[mx_scales] = mod
    return mod


def flashinfer_cascade():
    from kcheck.worker.flashinfer import _cascade

    interpreter()
    return _cascade()[0]
