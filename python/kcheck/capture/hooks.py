"""Where the hook sees the engine's calls.

Custom ops reached through torch.ops (vLLM's and sgl-kernel's) pass through
the dispatcher, so a TorchDispatchMode sees each with its schema and
arguments; every other op goes straight through it. Python entry points
(the Triton decode functions, FlashMLA's and FlashInfer's wrappers) are
not ops: each is wrapped where it is defined and wherever a module imported
it by name (triton_mla.py's `from ... import decode_attention_fwd`), now
if the module is loaded and, if not, right after it is (an import hook).
The engine's code is not edited and its call is made exactly as it was
asked for; the wrapper only copies around it.
"""

import functools
import importlib
import importlib.abc
import sys

from kcheck.capture import ops as opsmod
from kcheck.capture.recorder import bind_python, bind_schema, wanted


def _record(rec, op, names, vals, run):
    """Copy around one engine call: the call itself always runs as asked,
    and its result (or its exception) is the engine's."""
    call = None
    try:
        call = rec.begin(op, names, vals)
    except Exception as e:  # the recorder's failure, never the engine's
        rec.fail(f"{op.name}: cannot read the call's arguments: {type(e).__name__}: {e}")
        call = None
    result = run()
    if call is not None:
        try:
            rec.end(call, result)
        except Exception as e:
            rec.fail(f"{op.name}: cannot read the call's outputs: {type(e).__name__}: {e}")
    return result


def _dispatch_mode_class():
    from torch.utils._python_dispatch import TorchDispatchMode

    class CaptureMode(TorchDispatchMode):
        """Sees every op; records those in ops.OPS, passes the rest on."""

        def __init__(self, rec, table):
            super().__init__()
            self.rec, self.table = rec, table

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            op = self.table.get(func._schema.name) if self.rec.active else None
            if op is None:
                return func(*args, **kwargs)
            try:
                names, vals = bind_schema(func, args, kwargs)
            except Exception as e:
                self.rec.fail(f"{op.name}: cannot bind the op's arguments to its schema: {e}")
                return func(*args, **kwargs)
            return _record(self.rec, op, names, vals, lambda: func(*args, **kwargs))

    return CaptureMode


def _wrap(rec, op, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not rec.active:
            return fn(*args, **kwargs)
        try:
            names, vals = bind_python(fn, args, kwargs)
        except TypeError:
            return fn(*args, **kwargs)  # the engine's own call will say what is wrong
        return _record(rec, op, names, vals, lambda: fn(*args, **kwargs))

    wrapper.__kcheck_capture_original__ = fn
    return wrapper


class Hooks:
    """The hook's installation in one process: install() and remove()."""

    def __init__(self, rec):
        self.rec = rec
        self.mode = None
        self.patched = []  # (owner, attribute, original)
        self.waiting = {}  # module -> [Op] to patch once it is imported
        self.finder = None

    def install(self, dispatch=True):
        table = {op.target[3:]: op for op in opsmod.OPS.values() if op.target.startswith("op:")}
        if dispatch and any(self.rec.sel.wants_op(op.name) for op in table.values()):
            self.mode = _dispatch_mode_class()(self.rec, table)
            self.mode.__enter__()
        for op in opsmod.OPS.values():
            if not op.target.startswith("py:") or not wanted(self.rec.sel, op):
                continue
            module = op.target[3:].split(":")[0]
            if module in sys.modules:
                self._patch(op)
            else:
                self.waiting.setdefault(module, []).append(op)
        if self.waiting:
            self.finder = _AfterImport(self)
            sys.meta_path.insert(0, self.finder)

    def _patch(self, op):
        module, qual = op.target[3:].split(":")
        try:
            owner = importlib.import_module(module)
            *path, attr = qual.split(".")
            for p in path:
                owner = getattr(owner, p)
            orig = getattr(owner, attr)
        except Exception as e:
            self.rec.say(f"{op.name}: {op.target[3:]} is not in this installation ({type(e).__name__}: {e}); not captured")
            return
        if getattr(orig, "__kcheck_capture_original__", None) is not None:
            return
        wrapped = _wrap(self.rec, op, orig)
        setattr(owner, attr, wrapped)
        self.patched.append((owner, attr, orig))
        if not path:  # a module-level function: also where it was imported by name
            for m in list(sys.modules.values()):
                d = getattr(m, "__dict__", None)
                if not d or m is owner:
                    continue
                for k, v in list(d.items()):
                    if v is orig:
                        setattr(m, k, wrapped)
                        self.patched.append((m, k, orig))

    def loaded(self, module):
        for op in self.waiting.pop(module, []):
            self._patch(op)

    def remove(self):
        if self.mode is not None:
            try:
                self.mode.__exit__(None, None, None)
            except Exception:
                pass
            self.mode = None
        for owner, attr, orig in reversed(self.patched):
            setattr(owner, attr, orig)
        self.patched = []
        if self.finder is not None and self.finder in sys.meta_path:
            sys.meta_path.remove(self.finder)
        self.finder = None


class _AfterImport(importlib.abc.MetaPathFinder):
    """Patches a waiting module right after it is executed."""

    def __init__(self, hooks):
        self.hooks = hooks

    def find_spec(self, name, path, target=None):
        if name not in self.hooks.waiting:
            return None
        for f in sys.meta_path:
            if f is self or not hasattr(f, "find_spec"):
                continue
            spec = f.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        hooks, orig_exec = self.hooks, loader.exec_module

        class Loader(importlib.abc.Loader):
            def create_module(self, s):
                return loader.create_module(s)

            def exec_module(self, module):
                orig_exec(module)
                sys.modules[name] = module
                try:
                    hooks.loaded(name)
                except Exception as e:
                    hooks.rec.fail(f"patching {name} after its import: {e}")

        spec.loader = Loader()
        return spec
