"""Capture a running engine's kernel calls as kcheck evidence files.

Three ways to turn it on, none of which edits the engine:

- vLLM and SGLang load it themselves in every process they start, through
  their plugin entry points (`vllm.general_plugins`, `sglang.srt.plugins`,
  declared in python/pyproject.toml), when KCHECK_CAPTURE is set:

      KCHECK_CAPTURE=/tmp/caps vllm serve MODEL --enforce-eager

- any other Python program, through the `.pth` file `make python-setup`
  puts in the environment (kcheck_capture.pth: it imports nothing unless
  KCHECK_CAPTURE is set);
- user code, with the context manager:

      from kcheck import capture
      with capture.capture("/tmp/caps", steps="0-3"):
          run_decode_steps()

The selection (ops, layers, decode steps, request rows, a byte budget,
steps per pipeline file) is kcheck.capture.select's. Each selected call
becomes one file holding its inputs as they were before the call and what it
wrote after (a cache written in place: both), its non-tensor arguments as
metadata under the engine's names and the provenance keys; the calls of one
layer over consecutive decode steps also become one pipeline file
(quant, cache, attn, combine stages per step, `s<step>.` prefixes) whose
links come from tensor identity, for `kcheck diagnose FILE`.
"""

import atexit
import contextlib
import threading

from kcheck.capture.select import Selection, SelectionError, from_env

__all__ = ["capture", "start", "stop", "active", "Selection", "SelectionError", "start_from_env"]

_lock = threading.Lock()
_current = None  # (Recorder, Hooks)


def start(selection, dispatch=True):
    """Install the hook for this process; returns the recorder."""
    global _current
    from kcheck.capture.hooks import Hooks
    from kcheck.capture.recorder import Recorder

    with _lock:
        if _current is not None:
            raise RuntimeError("kcheck.capture is already on in this process")
        rec = Recorder(selection)
        hooks = Hooks(rec)
        hooks.install(dispatch=dispatch)
        _current = (rec, hooks)
        return rec


def stop():
    """Write what is still being assembled and remove the hook; returns the
    files written."""
    global _current
    with _lock:
        if _current is None:
            return []
        rec, hooks = _current
        _current = None
    try:
        rec.flush()
    finally:
        hooks.remove()
        rec.active = False
    return list(rec.store.files)


def active():
    return _current[0] if _current else None


def _selection(directory, **kw):
    from kcheck.capture.select import parse_bytes, parse_set

    for k in ("layers", "steps", "requests"):
        if isinstance(kw.get(k), str):
            kw[k] = parse_set(kw[k], k)
    if isinstance(kw.get("ops"), str):
        kw["ops"] = None if kw["ops"] in ("all", "*") else {s.strip() for s in kw["ops"].split(",") if s.strip()}
    if isinstance(kw.get("max_bytes"), str):
        kw["max_bytes"] = parse_bytes(kw["max_bytes"], "max_bytes")
    return Selection(directory=str(directory), **kw)


@contextlib.contextmanager
def capture(directory, **selection):
    """Capture the calls made inside the block into DIRECTORY.

    Keyword arguments are Selection's (ops, layers, steps, requests,
    max_bytes, pipeline_steps, calls); strings are read as the environment
    variables are ("0-3", "500M"). Yields the recorder (its .store.files
    lists what was written)."""
    rec = start(_selection(directory, **selection))
    try:
        yield rec
    finally:
        stop()


def start_from_env(env=None, who="kcheck.capture"):
    """Turn the hook on when KCHECK_CAPTURE asks for it; never raises (an
    engine must start whatever the variables say). Returns the recorder or None."""
    import sys

    try:
        sel = from_env(env)
    except SelectionError as e:
        print(f"kcheck.capture ({who}): not capturing: {e}", file=sys.stderr, flush=True)
        return None
    if sel is None or active() is not None:
        return active()
    try:
        rec = start(sel)
    except Exception as e:
        print(f"kcheck.capture ({who}): not capturing: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return None
    atexit.register(stop)
    print(f"kcheck.capture ({who}): capturing into {sel.directory}", file=sys.stderr, flush=True)
    return rec
