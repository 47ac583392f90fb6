"""What every engine worker needs: contract parameters, conventions, provenance."""

import importlib.metadata as md
import math
import os

from kcheck import engines
from kcheck.worker import BadInput, Unsupported, device, interpreted


def version(dist):
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "not installed"


def provenance(engine, dist, call, shim=None):
    """Metadata a worker's output carries: what ran, where, from which package."""
    import torch
    import triton

    m = {
        "source": f"{engine} {version(dist)} ({dist}), {call}",
        "kcheck.worker.engine": engine,
        "kcheck.worker.engine_version": version(dist),
        "kcheck.worker.call": call,
        "kcheck.worker.torch": torch.__version__,
        "kcheck.worker.triton": triton.__version__,
        "device": "cpu (TRITON_INTERPRET=1)" if interpreted() else torch.cuda.get_device_name(),
    }
    if shim:
        m["kcheck.worker.shim"] = shim
    return m


def param(meta, name, default=None):
    v = meta.get(name, default)
    if v is None:
        raise BadInput(f"parameter {name} is missing")
    return v


def float_param(meta, name, default=None):
    v = param(meta, name, default)
    try:
        return float(v.replace("+inf", "inf")) if isinstance(v, str) else float(v)
    except ValueError:
        raise BadInput(f"parameter {name} = {v!r} is not a number") from None


def bool_param(meta, name, default):
    v = meta.get(name)
    if v is None:
        return default
    if v not in ("true", "false"):
        raise BadInput(f"parameter {name} = {v!r}: want true or false")
    return v == "true"


def need(tensors, name):
    if name not in tensors:
        raise BadInput(f"tensor {name} is missing")
    return tensors[name].to(device())


def require_convention(meta, engine, kernel, key, contract_default):
    """Refuse a case whose declared convention (lse_base, ...) is not the
    engine's, as engines.json (the Go table) gives it: the engine kernel
    cannot produce another convention, and converting its output would be
    kcheck computing, not the engine."""
    want = engines.convention(engine, kernel, key)
    got = meta.get(key, contract_default)
    if want is not None and got != want:
        raise Unsupported(f"the case declares {key}={got}; {engine}'s kernel produces {key}={want} (engines.json)")
