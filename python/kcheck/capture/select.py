"""What to capture: the selection, from keyword arguments or the environment.

    KCHECK_CAPTURE=DIR                   turn capture on, files go to DIR
    KCHECK_CAPTURE_OPS=a,b               op names (kcheck.capture.ops.OPS), default all
    KCHECK_CAPTURE_LAYERS=0,2-3          layers (in the order their KV caches are first seen), default 0
    KCHECK_CAPTURE_STEPS=0-7             decode steps (counted from the hook's start), default 0-3
    KCHECK_CAPTURE_REQUESTS=0,1          request rows of a batch (default all; see below)
    KCHECK_CAPTURE_MAX_BYTES=1G          byte budget of the directory, default 1G
    KCHECK_CAPTURE_PIPELINE=4            consecutive steps per pipeline file (0: no pipelines), default 4
    KCHECK_CAPTURE_CALLS=1               also one file per call (0: pipelines only), default 1

A kernel call is not told which request a row belongs to, so a "request"
here is a batch row: the row of the block table and seq lens (or the
segment of the token list) an attention call carries. The calls that carry
such rows (TRITON_MLA's and SGLang's Triton decode, FlashMLA's decode) keep
the selected rows only (`kcheck.capture.requests` names them); calls that
address cache slots or token rows (the cache write, the NVFP4 projections,
the merges) are captured whole. A row is not a stable request id: an engine
may move a request to another row between steps (vLLM's persistent batch
condenses rows when a request finishes), so select rows of a batch whose
membership you know (one request alone, or a fixed batch).

Ranges are inclusive; `all` selects everything. A value that does not parse
is an error naming the variable (the hook then stays off and says so).
"""

import os
import re
from dataclasses import dataclass, field


class SelectionError(ValueError):
    pass


def parse_set(text, what):
    """'0,2-4' -> {0, 2, 3, 4}; 'all' -> None (everything)."""
    text = text.strip()
    if text in ("all", "*"):
        return None
    out = set()
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise SelectionError(f"{what} = {text!r}: {part!r} is not N or N-M (or all)")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise SelectionError(f"{what} = {text!r}: range {part} runs backwards")
        if hi - lo > 1_000_000:
            raise SelectionError(f"{what} = {text!r}: range {part} is too long")
        out.update(range(lo, hi + 1))
    return out


_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(text, what):
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(?:i?[bB])?\s*", text)
    if not m:
        raise SelectionError(f"{what} = {text!r}: want a byte count such as 500M or 2G")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _parse_count(text, what):
    if not re.fullmatch(r"\s*\d+\s*", text):
        raise SelectionError(f"{what} = {text!r}: want a whole number")
    return int(text)


@dataclass
class Selection:
    directory: str
    ops: set = None  # None: every op
    layers: set = field(default_factory=lambda: {0})
    steps: set = field(default_factory=lambda: {0, 1, 2, 3})
    requests: set = None
    max_bytes: int = 1 << 30
    pipeline_steps: int = 4
    calls: bool = True

    def __post_init__(self):
        from kcheck.capture.ops import OPS

        if not self.directory:
            raise SelectionError("the capture directory is empty")
        if self.ops is not None:
            unknown = sorted(set(self.ops) - set(OPS))
            if unknown:
                raise SelectionError(f"ops: unknown op {', '.join(unknown)} (known: {', '.join(sorted(OPS))})")
        if self.max_bytes is not None and self.max_bytes <= 0:
            raise SelectionError("max_bytes must be positive")
        if self.pipeline_steps < 0:
            raise SelectionError("pipeline_steps must be 0 or more")

    def wants_op(self, name):
        return self.ops is None or name in self.ops

    def wants_layer(self, layer):
        return self.layers is None or layer in self.layers

    def wants_step(self, step):
        return self.steps is None or step in self.steps

    @property
    def last_step(self):
        return None if self.steps is None else max(self.steps, default=-1)


def from_env(env=None):
    """The selection KCHECK_CAPTURE* ask for, or None when KCHECK_CAPTURE is unset."""
    env = os.environ if env is None else env
    directory = env.get("KCHECK_CAPTURE", "").strip()
    if not directory:
        return None
    kw = {"directory": directory}
    if "KCHECK_CAPTURE_OPS" in env:
        v = env["KCHECK_CAPTURE_OPS"].strip()
        kw["ops"] = None if v in ("all", "*") else {s.strip() for s in v.split(",") if s.strip()}
    for key, name in (("KCHECK_CAPTURE_LAYERS", "layers"), ("KCHECK_CAPTURE_STEPS", "steps"), ("KCHECK_CAPTURE_REQUESTS", "requests")):
        if key in env:
            kw[name] = parse_set(env[key], key)
    if "KCHECK_CAPTURE_MAX_BYTES" in env:
        kw["max_bytes"] = parse_bytes(env["KCHECK_CAPTURE_MAX_BYTES"], "KCHECK_CAPTURE_MAX_BYTES")
    if "KCHECK_CAPTURE_PIPELINE" in env:
        kw["pipeline_steps"] = _parse_count(env["KCHECK_CAPTURE_PIPELINE"], "KCHECK_CAPTURE_PIPELINE")
    if "KCHECK_CAPTURE_CALLS" in env:
        v = env["KCHECK_CAPTURE_CALLS"].strip()
        if v not in ("0", "1"):
            raise SelectionError(f"KCHECK_CAPTURE_CALLS = {v!r}: want 0 or 1")
        kw["calls"] = v == "1"
    return Selection(**kw)
