"""torchao's NVFP4 quantizer (torchao 0.18.0), pure PyTorch on the CPU.

torchao.prototype.mx_formats.nvfp4_tensor.nvfp4_quantize(data_hp,
block_size=16, per_tensor_scale) -> (block scales float8_e4m3fn [M, K/16],
packed uint8 [M, K/2], element 2i in the low nibble). Its per_tensor_scale is
the DEQUANT-direction global scale (amax / (448 * 6)): block scale =
e4m3(clamp((amax_block / 6) / per_tensor_scale, E4M3_EPS, 448)), data =
x * ((1 / per_tensor_scale) / scale). The contract's global_scale is the
QUANT-direction gs = 2688 / amax (vLLM), so the worker passes
per_tensor_scale = 1 / gs (one fp32 division, recorded in the metadata).
The swizzled layout is torchao's own to_blocked
(torchao/prototype/mx_formats/utils.py).
"""

import torch

from kcheck.worker import BadInput, Unsupported
from kcheck.worker.common import need, param, provenance


def nvfp4_quantize(tensors, meta, opts):
    from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize as tq
    from torchao.prototype.mx_formats.utils import to_blocked

    x = need(tensors, "x")
    gs = need(tensors, "global_scale").to(torch.float32).reshape(())
    layout = param(meta, "scale_layout", "linear")
    if layout not in ("linear", "swizzled_128x4"):
        raise Unsupported(f"scale_layout {layout}")
    if x.dtype not in (torch.bfloat16, torch.float32):
        raise Unsupported(f"x dtype {x.dtype}: nvfp4_quantize asserts bfloat16 or float32")
    if x.dim() != 2 or x.shape[1] % 16:
        raise BadInput(f"x has shape {tuple(x.shape)}; want [M, K], K a multiple of 16")
    pts = (1.0 / gs).reshape(1)
    scales, packed = tq(x.contiguous(), 16, per_tensor_scale=pts)
    if layout == "swizzled_128x4":
        scales = to_blocked(scales.view(torch.uint8)).view(torch.float8_e4m3fn)
        M, K16 = x.shape[0], x.shape[1] // 16
        scales = scales.reshape(((M + 127) // 128) * 128, ((K16 + 3) // 4) * 4)
    m = provenance("torchao", "torchao", "torchao.prototype.mx_formats.nvfp4_tensor.nvfp4_quantize")
    m["kcheck.worker.note"] = "per_tensor_scale = 1/global_scale in fp32 (torchao's scale is the dequant direction)"
    return {"packed": packed.view(torch.uint8), "block_scale": scales.view(torch.float8_e4m3fn)}, m


def kernels(name):
    return {"nvfp4_quantize": nvfp4_quantize}
