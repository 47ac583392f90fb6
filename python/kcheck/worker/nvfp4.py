"""NVFP4 quantize and dequantize from torchao 0.18.0 and NVIDIA ModelOpt
0.47.0, both pure PyTorch on the CPU (no Triton, so no interpreter).

torchao (torchao/prototype/mx_formats/nvfp4_tensor.py):
  - nvfp4_quantize(data_hp, block_size=16, per_tensor_scale) -> (block
    scales float8_e4m3fn [M, K/16], packed uint8 [M, K/2], element 2i in the
    low nibble). per_tensor_scale is the DEQUANT-direction global scale
    (amax / (448 * 6)): block scale = e4m3(clamp((amax_block / 6) /
    per_tensor_scale, E4M3_EPS, 448)), data = x * ((1 / per_tensor_scale) /
    scale). The swizzled layout is torchao's own to_blocked
    (torchao/prototype/mx_formats/utils.py).
  - NVFP4Tensor(qdata, scale, 16, orig_dtype, per_tensor_scale,
    is_swizzled_scales).dequantize(dtype): f32(e2m1) * (per_tensor_scale *
    f32(scale)), then the output dtype (NVFP4Tensor.dequantize, get_hp_scales).

ModelOpt (modelopt/torch/quantization/qtensor/nvfp4_tensor.py, NVFP4QTensor):
  - quantize(x, 16, weights_scaling_factor_2=wsf2) on a CPU tensor takes the
    PyTorch path (the TensorRT-LLM one needs CUDA and tensorrt_llm): block
    scale = e4m3(clamp(amax_block / (6 * wsf2), 2^-9, 448)) (an all-zero
    block's scale set to 1.0 first), data = x / (f32(scale) * wsf2), E2M1 by
    searchsorted over the midpoints with ties to the even code (_cast_fp4),
    packed low nibble first. Its scales are linear (ModelOpt exports them
    unswizzled; the engines swizzle at load time).
  - dequantize(dtype, scale=, double_scale=, block_sizes={-1: 16}):
    e2m1 * (f32(scale) * double_scale), then the output dtype.
  ModelOpt's weight_scale_2 (wsf2) is dequant-direction too.

The contract's nvfp4_quantize global_scale is the QUANT-direction gs = 2688
/ amax (vLLM), so both quantizers are given 1 / gs (one fp32 division,
recorded in the metadata). nvfp4_dequantize cases whose global_scale_kind
is quant (vLLM's direction: divide by gs) are refused: both libraries
multiply by a dequant-direction scale, and inverting it would be the
worker's arithmetic, not theirs.
"""

import torch

from kcheck.worker import BadInput, Unsupported
from kcheck.worker.common import need, param, provenance

_OUT_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def _quant_inputs(tensors, meta, allowed):
    x = need(tensors, "x")
    gs = need(tensors, "global_scale").to(torch.float32).reshape(())
    layout = param(meta, "scale_layout", "linear")
    if layout not in allowed:
        raise Unsupported(f"scale_layout {layout}: this quantizer writes {' or '.join(allowed)} scales")
    if x.dim() != 2 or x.shape[1] % 16:
        raise BadInput(f"x has shape {tuple(x.shape)}; want [M, K], K a multiple of 16")
    return x, gs, layout


def _dequant_inputs(tensors, meta, opts, allowed):
    packed = need(tensors, "packed")
    bs = need(tensors, "block_scale")
    g = need(tensors, "global_scale").to(torch.float32).reshape(())
    layout = param(meta, "scale_layout", "linear")
    if layout not in allowed:
        raise Unsupported(f"scale_layout {layout}: this dequantizer reads {' or '.join(allowed)} scales")
    kind = meta.get("global_scale_kind", "dequant")
    if kind != "dequant":
        raise Unsupported(f"global_scale_kind {kind}: the library multiplies by a dequant-direction global scale")
    if packed.dim() != 2 or packed.dtype != torch.uint8:
        raise BadInput(f"packed has shape {tuple(packed.shape)} {packed.dtype}; want U8 [M, K/2]")
    out = opts.get("out_dtype", "bf16")
    if out not in _OUT_DTYPES:
        raise BadInput(f"option out_dtype={out}: want one of {', '.join(_OUT_DTYPES)}")
    return packed, bs.view(torch.float8_e4m3fn), g, layout, _OUT_DTYPES[out]


def torchao_quantize(tensors, meta, opts):
    from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize as tq
    from torchao.prototype.mx_formats.utils import to_blocked

    x, gs, layout = _quant_inputs(tensors, meta, ("linear", "swizzled_128x4"))
    if x.dtype not in (torch.bfloat16, torch.float32):
        raise Unsupported(f"x dtype {x.dtype}: nvfp4_quantize asserts bfloat16 or float32")
    pts = (1.0 / gs).reshape(1)
    scales, packed = tq(x.contiguous(), 16, per_tensor_scale=pts)
    if layout == "swizzled_128x4":
        scales = to_blocked(scales.view(torch.uint8)).view(torch.float8_e4m3fn)
        M, K16 = x.shape[0], x.shape[1] // 16
        scales = scales.reshape(((M + 127) // 128) * 128, ((K16 + 3) // 4) * 4)
    m = provenance("torchao", "torchao", "torchao.prototype.mx_formats.nvfp4_tensor.nvfp4_quantize")
    m["kcheck.worker.note"] = "per_tensor_scale = 1/global_scale in fp32 (torchao's scale is the dequant direction)"
    return {"packed": packed.view(torch.uint8), "block_scale": scales.view(torch.float8_e4m3fn)}, m


torchao_quantize.options = ()


def torchao_dequantize(tensors, meta, opts):
    from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor

    packed, bs, g, layout, out_dt = _dequant_inputs(tensors, meta, opts, ("linear", "swizzled_128x4"))
    t = NVFP4Tensor(packed.contiguous(), bs.contiguous(), 16, out_dt, per_tensor_scale=g, is_swizzled_scales=layout == "swizzled_128x4")
    out = t.dequantize(out_dt)
    m = provenance("torchao", "torchao", "torchao.prototype.mx_formats.nvfp4_tensor.NVFP4Tensor.dequantize")
    return {"out": out}, m


torchao_dequantize.options = ("out_dtype",)


def modelopt_quantize(tensors, meta, opts):
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

    x, gs, _ = _quant_inputs(tensors, meta, ("linear",))
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise Unsupported(f"x dtype {x.dtype}")
    wsf2 = (1.0 / gs).reshape(())
    qt, scale, _ = NVFP4QTensor.quantize(x.contiguous(), 16, weights_scaling_factor_2=wsf2)
    m = provenance("modelopt", "nvidia-modelopt", "modelopt.torch.quantization.qtensor.nvfp4_tensor.NVFP4QTensor.quantize (PyTorch path)")
    m["kcheck.worker.note"] = "weights_scaling_factor_2 = 1/global_scale in fp32 (ModelOpt's scale is the dequant direction)"
    return {"packed": qt._quantized_data.view(torch.uint8), "block_scale": scale.view(torch.float8_e4m3fn)}, m


modelopt_quantize.options = ()


def modelopt_dequantize(tensors, meta, opts):
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

    packed, bs, g, _, out_dt = _dequant_inputs(tensors, meta, opts, ("linear",))
    M, K = packed.shape[0], packed.shape[1] * 2
    if bs.shape != (M, K // 16):
        raise BadInput(f"block_scale has shape {tuple(bs.shape)}; linear scales for [{M}, {K}] are [{M}, {K // 16}]")
    qt = NVFP4QTensor(torch.Size([M, K]), out_dt, packed.contiguous())
    out = qt.dequantize(out_dt, scale=bs.contiguous(), double_scale=g, block_sizes={-1: 16})
    m = provenance("modelopt", "nvidia-modelopt", "modelopt.torch.quantization.qtensor.nvfp4_tensor.NVFP4QTensor.dequantize")
    return {"out": out}, m


modelopt_dequantize.options = ("out_dtype",)


def kernels(name):
    if name == "modelopt":
        return {"nvfp4_quantize": modelopt_quantize, "nvfp4_dequantize": modelopt_dequantize}
    return {"nvfp4_quantize": torchao_quantize, "nvfp4_dequantize": torchao_dequantize}
