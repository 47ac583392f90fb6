"""Imported by kcheck_capture.pth at interpreter start when KCHECK_CAPTURE is set.

It imports nothing heavy itself: it waits for the first import of an engine
(vllm, sglang, flashinfer, flash_mla) or of the kcheck loop a user runs, and
turns the hook on just before that module runs, so the engine's functions
are wrapped as they are defined. A program that imports none of them uses
the context manager instead.
"""

import importlib.abc
import sys

TRIGGERS = ("vllm", "sglang", "flashinfer", "flash_mla")


class _Trigger(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in TRIGGERS:
            sys.meta_path.remove(self)
            from kcheck.capture import start_from_env

            start_from_env(who=".pth hook")
        return None


if not any(isinstance(f, _Trigger) for f in sys.meta_path):
    sys.meta_path.insert(0, _Trigger())
