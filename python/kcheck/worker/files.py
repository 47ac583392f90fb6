"""Evidence files in and out, with the official safetensors library."""

import os

from kcheck.worker import BadInput


def read(path):
    """The file's tensors (torch, on the CPU) and metadata."""
    from safetensors import SafetensorError
    from safetensors.torch import safe_open

    try:
        with safe_open(path, "pt") as f:
            meta = dict(f.metadata() or {})
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError, ValueError) as e:
        raise BadInput(f"{path}: {e}") from e
    if meta.get("kcheck.format") != "1":
        raise BadInput(f"{path}: kcheck.format is {meta.get('kcheck.format')!r}, want '1'")
    return tensors, meta


def write(path, inputs, outputs, meta, out_meta):
    """OUT = the inputs, then the outputs (on the CPU, contiguous), and the
    input metadata with the worker's provenance added. An OUT in an
    engine's own layout (out_meta declares kcheck.worker.layout) is the
    engine's call alone: its tensors and the worker's metadata, none of the
    contract's inputs or parameters (reference/CONTRACTS.md §9.1)."""
    from safetensors.torch import save_file

    own_layout = "kcheck.worker.layout" in out_meta
    all_t = {} if own_layout else {k: v for k, v in inputs.items()}
    for k, v in outputs.items():
        all_t[k] = v.detach().to("cpu").contiguous()
    m = {"kcheck.format": "1"} if own_layout else dict(meta)
    m.update({k: str(v) for k, v in out_meta.items()})
    tmp = path + ".tmp"
    save_file(all_t, tmp, metadata=m)
    os.replace(tmp, path)
