"""Writing captures and the manifest: one place that knows the file format."""

import hashlib
import importlib.metadata as md
import json
import os

import struct

import torch

# The versions the corpus was made with; a capture names its engine's.
DISTS = {"vllm": "vllm", "sglang": "sglang", "flashinfer": "flashinfer-python", "torchao": "torchao",
         "flashmla": None, "trtllm": "flashinfer-python"}

# FlashMLA is not installed (its wheels are CUDA builds); its facts come from
# a source snapshot, and vLLM 0.33.0 vendors its Python interface.
FLASHMLA_COMMIT = "9241ae3ef9bac614dd25e45e507e089f888280e0"
FLASHMLA_VENDORED = "vllm/third_party/flashmla/flash_mla_interface.py@vllm-0.33.0"


def version(engine):
    dist = DISTS.get(engine)
    if dist is None:
        return f"git {FLASHMLA_COMMIT[:8]}"
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "not installed"


_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float64: "F64",
           torch.int32: "I32", torch.int64: "I64", torch.uint8: "U8", torch.int8: "I8",
           torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}


def save(tensors, path, metadata):
    """A safetensors file with its header in sorted order, so that the same
    tensors and metadata give the same bytes (safetensors' save_file writes
    the metadata in hash order, which changes from run to run and would make
    `make corpus-committed` rewrite every file)."""
    header, blobs, off = {"__metadata__": dict(sorted(metadata.items()))}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        b = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


class Corpus:
    """Collects captures; write() saves them under root with manifest.json."""

    def __init__(self, root, committed_only=False):
        self.root = root
        self.committed_only = committed_only
        self.entries = []

    def add(self, name, *, engine, from_engine, kernel, function, source, produced_by,
            tensors, meta, expect, audit, item, fault=None, twin=None, committed=False, notes=""):
        """One capture. expect is {"verdict": "pass"} or {"verdict": "fail",
        "tensor": ..., "stage": ..., "signature": ...} or {"verdict": "error",
        "message": ...}: what kcheck must say once issue 16 is done."""
        if self.committed_only and not committed:
            return
        full = {
            "kcheck.format": "1",
            "source": f"{engine} {version(engine)}, {function}",
            "kcheck.corpus.engine": engine,
            "kcheck.corpus.engine_version": version(engine),
            "kcheck.corpus.function": function,
            "kcheck.corpus.source_lines": source,
            "kcheck.corpus.produced_by": produced_by,
            "kcheck.corpus.torch": torch.__version__,
        }
        if produced_by == "engine":
            import triton

            full["kcheck.corpus.triton"] = triton.__version__
            full["device"] = "cpu (TRITON_INTERPRET=1)"
        if fault:
            full["kcheck.planted_fault"] = fault
        for k, v in meta.items():
            full[k] = v if isinstance(v, str) else repr(v) if isinstance(v, float) else str(v).lower() if isinstance(v, bool) else str(v)
        path = os.path.join(self.root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        save(tensors, path, full)
        with open(path, "rb") as f:
            data = f.read()
        self.entries.append({
            "file": name, "engine": engine, "engine_version": version(engine), "from": from_engine,
            "kernel": kernel, "function": function, "source": source, "produced_by": produced_by,
            "audit_rows": audit, "issue16_item": item, "expect": expect,
            "planted_fault": fault, "twin": twin, "committed": committed, "notes": notes,
            "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
        })

    def write_manifest(self):
        self.entries.sort(key=lambda e: e["file"])
        doc = {
            "about": "kcheck issue-16 engine-capture corpus (python/kcheck/corpus). expect is the verdict a "
                     "correct kcheck gives with `kcheck check --from <from> FILE` once issue 16 is done.",
            "files": self.entries,
        }
        with open(os.path.join(self.root, "manifest.json"), "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.write("\n")
