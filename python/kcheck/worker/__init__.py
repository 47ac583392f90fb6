"""Engine kernels behind kcheck's worker protocol.

kcheck starts a worker once per kernel run (reference/CONTRACTS.md §9, the worker
protocol)::

    python -m kcheck.worker NAME [--set KEY=VALUE]... run --kernel KERNEL --in IN --out OUT

IN is an evidence file holding the contract's inputs and parameters; the
worker calls the engine's own kernel (imported from the installed engine
package, never copied) and writes OUT: the inputs plus the outputs under the
contract's names, with the engine, its version and the call in the metadata.
Exit 0 done, 2 unusable input, 3 the kernel raised (its name on stderr),
4 an unsupported kernel or shape, 5 the engine cannot run here (not
installed). ``python -m kcheck.worker list`` prints the workers and their
kernels without importing any engine.

Under TRITON_INTERPRET=1 the Triton kernels run on the CPU; on a machine
with a GPU and without that variable the same worker runs them compiled.
"""

import importlib
import os
import sys
import traceback

# Worker name -> (module, one-line description). Listing imports none of them.
WORKERS = {
    "vllm": ("kcheck.worker.vllm", "vLLM Triton kernels: TRITON_MLA decode_attention_fwd, merge_attn_states, the DSA indexer's paged MQA logits"),
    "sglang": ("kcheck.worker.sglang", "SGLang Triton kernels: grouped MLA decode, merge_state, the DSA fp8_ds_mla cache quantizer"),
    "flashinfer": ("kcheck.worker.flashinfer", "FlashInfer Triton cascade merge_states kernel"),
    "torchao": ("kcheck.worker.nvfp4", "torchao NVFP4 quantize and dequantize (pure PyTorch), linear and to_blocked scales"),
    "modelopt": ("kcheck.worker.nvfp4", "NVIDIA ModelOpt NVFP4QTensor quantize and dequantize (pure PyTorch), linear scales"),
}

EXIT_OK, EXIT_INTERNAL, EXIT_BAD_INPUT, EXIT_KERNEL, EXIT_UNSUPPORTED, EXIT_UNAVAILABLE = 0, 1, 2, 3, 4, 5


class BadInput(Exception):
    """The inputs cannot be used (exit 2)."""


class Unsupported(Exception):
    """The engine kernel does not implement this kernel, shape or dtype (exit 4)."""


class Unavailable(Exception):
    """The engine cannot run on this machine (exit 5)."""


def device():
    """Where the engine's kernels run: the GPU when there is one and the
    interpreter is off, else the CPU (Triton's interpreter takes CPU tensors)."""
    import torch

    if os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def interpreted():
    return device().type == "cpu"


def _usage(msg):
    print(f"kcheck.worker: {msg}", file=sys.stderr)
    print("usage: python -m kcheck.worker list | NAME [--set KEY=VALUE]... run --kernel KERNEL --in IN --out OUT", file=sys.stderr)
    return EXIT_BAD_INPUT


def _parse(argv):
    name, opts, rest = argv[0], {}, argv[1:]
    while rest and rest[0] == "--set":
        if len(rest) < 2 or "=" not in rest[1]:
            raise BadInput("--set needs KEY=VALUE")
        k, v = rest[1].split("=", 1)
        opts[k] = v
        rest = rest[2:]
    if not rest or rest[0] != "run":
        raise BadInput("expected 'run' after the worker name and its --set options")
    args, rest = {}, rest[1:]
    while rest:
        if rest[0] not in ("--kernel", "--in", "--out") or len(rest) < 2:
            raise BadInput(f"unknown or incomplete argument {rest[0]!r}")
        args[rest[0][2:]] = rest[1]
        rest = rest[2:]
    for k in ("kernel", "in", "out"):
        if k not in args:
            raise BadInput(f"missing --{k}")
    return name, opts, args


def run(name, opts, kernel, in_path, out_path):
    """One protocol run; returns the exit status."""
    from kcheck.worker import files as wio

    if name not in WORKERS:
        raise BadInput(f"no worker {name!r} (known: {', '.join(sorted(WORKERS))})")
    try:
        mod = importlib.import_module(WORKERS[name][0])
    except ImportError as e:
        raise Unavailable(f"worker {name}: {e} (make python-setup installs the engines)") from e
    kernels = mod.kernels(name)
    if kernel not in kernels:
        raise Unsupported(f"worker {name} has no kernel {kernel} (it has: {', '.join(sorted(kernels))})")
    tensors, meta = wio.read(in_path)
    fn = kernels[kernel]
    known = set(getattr(fn, "options", ()))
    for k in opts:
        if k not in known:
            raise BadInput(f"worker {name}, kernel {kernel}: unknown option {k!r} (known: {', '.join(sorted(known)) or 'none'})")
    fix = None
    if interpreted():
        from kcheck.worker import interp

        fix = interp.apply()
    outs, out_meta = fn(tensors, meta, opts)
    if fix:
        out_meta["kcheck.worker.interpreter_fix"] = fix
    wio.write(out_path, tensors, outs, meta, out_meta)
    return EXIT_OK


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        return _usage("no arguments")
    if argv[0] == "list":
        for n in sorted(WORKERS):
            print(f"{n}\t{WORKERS[n][1]}")
        return EXIT_OK
    try:
        name, opts, args = _parse(argv)
        return run(name, opts, args["kernel"], args["in"], args["out"])
    except BadInput as e:
        print(f"bad input: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Unsupported as e:
        print(f"unsupported: {e}", file=sys.stderr)
        return EXIT_UNSUPPORTED
    except Unavailable as e:
        print(f"unavailable: {e}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except Exception as e:  # the engine kernel raised: a kernel error
        traceback.print_exc()
        print(f"{type(e).__module__}.{type(e).__qualname__}: {e}", file=sys.stderr)
        return EXIT_KERNEL
