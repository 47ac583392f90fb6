"""The engines' names, values and defaults, shared with the Go side.

engines.json is generated from internal/engines (the table `kcheck check
--from ENGINE` reads captures with; a Go test keeps it identical), so a
worker that drives an engine and a capture read from that engine agree on
its conventions (lse base, empty-row lse, ds_mla scales, scale layouts).
"""

import json
from functools import lru_cache
from importlib import resources


@lru_cache(maxsize=None)
def table():
    """Every engine's entry, by name."""
    text = resources.files("kcheck").joinpath("engines.json").read_text()
    return {e["name"]: e for e in json.loads(text)}


def engine(name):
    """One engine's entry; KeyError names the known engines."""
    t = table()
    if name not in t:
        raise KeyError(f"no engine {name!r} in engines.json (known: {', '.join(sorted(t))})")
    return t[name]


def convention(engine_name, kernel, key):
    """The engine's default for a metadata key (kernel defaults first)."""
    e = engine(engine_name)
    k = e["kernels"].get(kernel, {})
    return k.get("defaults", {}).get(key, e["defaults"].get(key))
