"""Writes reference/kvcache/testdata/vllm_v4_writer.json and vllm_v41.json:
the tokens of flashmla_model1.json written into a DeepSeek-V4
(fp8_ds_mla_model1) cache by vLLM's own Triton writer,
quantize_and_insert_k_kernel, and into a DeepSeek-V4.1 (fp8_ds_mla_v41) cache
by _quantize_and_insert_k_mxfp8_kernel and read back by
_dequantize_and_gather_k_mxfp8_kernel, run by Triton's interpreter on the CPU
(reference/kvcache/model1_test.go holds kcheck's pow2_amax_floor writers and
its reader to them).

vLLM's module cannot be imported here: its import chain (vllm.platforms,
vllm.config) needs packages the venv does not hold. So each @triton.jit
function is read out of the installed file whose path is given, written to a
temporary module and launched as vLLM's wrappers launch it (vllm 0.33.0
vllm/models/deepseek_v4/common/ops/cache_utils.py:168-231;
vllm/models/deepseek_v41/common/ops/cache_utils.py:243-290 and 666-760).
Nothing of vLLM's is copied into this repository. The interpreter's float ->
fp8 cast is wrong (python/findings/triton_interpreter_fp8_cast.py), so
kcheck.worker.interp's fix is applied first, as the workers do.

    V=python/.venv/lib/python3.11/site-packages/vllm/models
    TRITON_INTERPRET=1 PYTHONPATH=python python/.venv/bin/python python/tests/gen_model1_vllm_vectors.py \\
        $V/deepseek_v4/common/ops/cache_utils.py $V/deepseek_v41/common/ops/cache_utils.py
"""

import ast
import importlib.util
import json
import os
import sys
import tempfile

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

HERE = os.path.dirname(__file__)
TESTDATA = os.path.join(HERE, "..", "..", "reference", "kvcache", "testdata")
KERNEL = "quantize_and_insert_k_kernel"
V41_WRITER = "_quantize_and_insert_k_mxfp8_kernel"
V41_READER = "_dequantize_and_gather_k_mxfp8_kernel"


def load_kernel(path, name=KERNEL):
    """The @triton.jit function name of the file at path, as a module of its own."""
    src = open(path).read()
    for node in ast.parse(src).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            decorators = "".join("@" + ast.get_source_segment(src, d) + "\n" for d in node.decorator_list)
            body = ast.get_source_segment(src, node)
            break
    else:
        sys.exit(f"{path} has no function {name}")
    tmp = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
    tmp.write("import triton\nimport triton.language as tl\n\n\n" + decorators + body + "\n")
    tmp.close()
    spec = importlib.util.spec_from_file_location("vllm_kernel_" + name.strip("_"), tmp.name)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, name)


def v41(path, k, nb, p):
    """The V4.1 cache vLLM writes for tokens k (slot s = token s) and the bf16
    rows its gather reads back, request 0 holding every token."""
    n = k.shape[0]
    writer, reader = load_kernel(path, V41_WRITER), load_kernel(path, V41_READER)
    cache = torch.full((nb, p * 528), 0xAB, dtype=torch.uint8)
    writer[(n,)](k, torch.arange(n, dtype=torch.int64), cache, n, head_dim=512, scale_dim=16, quant_block=32,
                 cache_block_size=p, block_stride=cache.stride(0), fp8_max=float(torch.finfo(torch.float8_e4m3fn).max),
                 use_fnuz=False)
    out = torch.zeros((1, n, 512), dtype=torch.bfloat16)
    table = torch.arange(nb, dtype=torch.int32).view(1, nb)
    reader[(1, 4)](out, out.stride(0), out.stride(1), cache, torch.tensor([n], dtype=torch.int32), table, 0, None,
                   max_blocks_per_seq=nb, head_dim=512, scale_dim=16, quant_block=32, cache_block_size=p,
                   block_stride=cache.stride(0), use_fnuz=False)
    return cache, out.view(n, 512)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: gen_model1_vllm_vectors.py PATH/TO/vllm/models/deepseek_v4/common/ops/cache_utils.py PATH/TO/vllm/models/deepseek_v41/common/ops/cache_utils.py")
    from kcheck.worker import interp

    interp.apply()
    kernel = load_kernel(sys.argv[1])
    src = json.load(open(os.path.join(TESTDATA, "flashmla_model1.json")))
    nb, p, d = src["num_blocks"], src["page_size"], src["dim"]
    n = nb * p
    k = torch.frombuffer(bytearray.fromhex(src["input_bf16"]), dtype=torch.bfloat16).view(n, d).contiguous()
    stride = (p * 584 + 575) // 576 * 576  # FlashMLA's padded block (tests/quant.py:57)
    cache = torch.full((nb, stride), 0xAB, dtype=torch.uint8)
    kernel[(n,)](k, torch.arange(n, dtype=torch.int64), cache, n,
                 input_dim=512, fp8_dim=448, bf16_dim=64, scale_dim=8, quant_block=64, cache_block_size=p,
                 token_data_size=576, block_stride=cache.stride(0), fp8_max=float(torch.finfo(torch.float8_e4m3fn).max),
                 n_quant_blocks=8, use_fnuz=False)
    assert bool((cache[:, p * 584:] == 0xAB).all()), "the writer touched the block padding"
    import vllm  # only for its version: the package's __init__ imports nothing heavy
    doc = {
        "source": f"vllm {vllm.__version__} vllm/models/deepseek_v4/common/ops/cache_utils.py {KERNEL}, Triton interpreter with kcheck.worker.interp's casts",
        "torch": torch.__version__,
        "input": "flashmla_model1.json input_bf16, token s at slot s",
        "num_blocks": nb,
        "page_size": p,
        "cache_u8": cache[:, : p * 584].contiguous().numpy().tobytes().hex(),
    }
    with open(os.path.join(TESTDATA, "vllm_v4_writer.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print("wrote", os.path.join(TESTDATA, "vllm_v4_writer.json"))
    cache41, read41 = v41(sys.argv[2], k, nb, p)
    doc41 = {
        "source": f"vllm {vllm.__version__} vllm/models/deepseek_v41/common/ops/cache_utils.py {V41_WRITER} and {V41_READER}, Triton interpreter with kcheck.worker.interp's casts",
        "torch": torch.__version__,
        "input": "flashmla_model1.json input_bf16, token s at slot s",
        "num_blocks": nb,
        "page_size": p,
        "cache_u8": cache41.contiguous().numpy().tobytes().hex(),
        "gathered_bf16": read41.contiguous().view(torch.uint8).numpy().tobytes().hex(),
    }
    with open(os.path.join(TESTDATA, "vllm_v41.json"), "w") as f:
        json.dump(doc41, f, indent=1)
        f.write("\n")
    print("wrote", os.path.join(TESTDATA, "vllm_v41.json"))


if __name__ == "__main__":
    main()
