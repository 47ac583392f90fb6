"""The recorder: copies of each selected call, its step and layer, its files.

A call is recorded in three moves: begin() binds the arguments to the
engine's names, places the call in a decode step and a layer and copies its
inputs to the CPU; the engine's own call runs, untouched; end() copies what
the call wrote. Nothing the engine passed is modified: only copies are made.
Any error of the recorder (not of the engine's call) is said once on stderr
and through logging, and turns capture off for the rest of the process; the
engine's results are the same as without the hook.

Steps and layers need no help from the engine. A layer is the KV cache a
call reads or writes (its storage), numbered in the order first seen; a new
decode step starts when a layer's cache op comes round again. A call
without a cache (an NVFP4 projection) belongs to the step and layer of the
next cache op, or, when its inputs are a recorded call's outputs, to that
call's.

A call that carries request rows keeps the rows KCHECK_CAPTURE_REQUESTS
selects (Call.copy, Call.select_csr); its cut tensors get an identity of
their own, so nothing links to them as the engine's whole tensor. A call
whose arguments live in an earlier plan (FlashInfer's wrapper: plan() then
run()) gets them from the copies taken when the plan was made.

Identity is what links pipeline stages: a tensor is (storage, byte offset,
byte size, version), the version being PyTorch's version counter (bumped by
every in-place write) or, for inference tensors, which have none, the
number of recorded calls that wrote that storage. The cache an attention
call reads is the cache_after of the write before it exactly when the two
are the same storage and nothing wrote it in between.
"""

import inspect
import logging
import sys
import threading
import weakref

from kcheck.capture import ops as opsmod
from kcheck.capture.store import CaptureError, Store, provenance

log = logging.getLogger("kcheck.capture")

HEADER_SLACK = 64 << 10  # bytes a file's safetensors header may take, counted against the budget


def _is_tensor(v):
    import torch

    return isinstance(v, torch.Tensor)


def param_str(v):
    """A non-tensor argument as metadata (reference/CONTRACTS.md §1.2), or None when it
    is not a value metadata can hold."""
    import torch

    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "+inf" if v == float("inf") else "-inf" if v == float("-inf") else repr(v)
    if isinstance(v, str):
        return v
    if isinstance(v, torch.dtype):
        return str(v).replace("torch.", "")
    return None


class Call:
    """One recorded engine call: copies of its tensors and its parameters."""

    def __init__(self, op, args, params, skipped):
        self.op = op
        self.args = args  # name -> the engine's tensor (kept only until end())
        self.params = params
        self.skipped = skipped
        self.before, self.after = {}, {}
        self.ids_before, self.ids_after = {}, {}
        self.step = self.layer = None
        self.est = 0
        self.reserved = 0
        self.rows = None  # the request rows kept (KCHECK_CAPTURE_REQUESTS), None: all
        self.meta = {}  # the capture's own keys for this call's file

    def row_tag(self, name):
        """Identity suffix of a tensor kept for some request rows only: it
        is not the engine's whole tensor, so nothing links to it as such."""
        if self.rows is None or name not in self.op.rows:
            return ()
        return (("rows", tuple(self.rows)),)

    def copy(self, name, t):
        """The CPU copy of a tensor: the selected request rows of a tensor
        whose axis 0 is the batch row, else the whole tensor."""
        if self.rows is not None and name in self.op.rows and t.dim() > 0:
            import torch

            t = t.index_select(0, torch.tensor(self.rows, dtype=torch.int64, device=t.device))
        return _copy(t)

    def select_csr(self):
        """Token lists in CSR form (indptr [B+1], indices), cut to the
        selected rows: each row's segment, in order, and an indptr over
        them."""
        if self.rows is None:
            return
        import torch

        for ip, ix in self.op.csr:
            if ip not in self.before or ix not in self.before:
                continue
            ptr, idx = self.before[ip], self.before[ix]
            p = ptr.to(torch.int64).tolist()
            segs = [idx[p[r]:p[r + 1]] for r in self.rows]
            lens = torch.tensor([len(x) for x in segs], dtype=torch.int64)
            new_ptr = torch.zeros(len(self.rows) + 1, dtype=ptr.dtype)
            new_ptr[1:] = lens.cumsum(0).to(ptr.dtype)
            self.before[ip], self.before[ix] = new_ptr, torch.cat(segs).contiguous()
            for n in (ip, ix):
                self.ids_before[n] = self.ids_before[n] + (("rows", tuple(self.rows)),)

    def identity(self, name, tag=""):
        base, _, when = name.partition("@")
        ids = self.ids_after if when == "after" else self.ids_before
        k = ids.get(base)
        return None if k is None else k + (tag,)


class Recorder:
    def __init__(self, selection):
        self.sel = selection
        self.store = Store(selection.directory, selection.max_bytes)
        self.active = True
        self.said = set()
        self.lock = threading.RLock()
        self.layers = {}  # cache storage -> layer
        self.step = 0
        self.seen = set()  # (op, layer) in the current step
        self.pending = []  # calls waiting for their layer
        self.windows = {}  # layer -> [calls] of the pipeline being assembled
        self.window_start = {}
        self.writes = {}  # storage -> recorded in-place writes (identity of inference tensors)
        self.producers = {}  # identity -> (call that produced it, weakref to the engine's tensor)
        self.plans = {}  # id(object) -> (weakref to it, CPU copies of its plan's tensors, its parameters)
        self.serial = 0
        self.index = 0
        self.device = None

    # -- saying things once ---------------------------------------------
    def say(self, msg, level=logging.WARNING):
        if msg in self.said:
            return
        self.said.add(msg)
        log.log(level, "%s", msg)
        print(f"kcheck.capture: {msg}", file=sys.stderr, flush=True)

    def fail(self, msg):
        """A recorder error: said once, and capture is off from here on."""
        if self.active:
            self.active = False
            self.say(f"capture turned off: {msg}", logging.ERROR)

    # -- identity ---------------------------------------------------------
    def _key(self, t):
        st = t.untyped_storage()
        ptr = st.data_ptr()
        try:
            ver = t._version
        except RuntimeError:  # inference tensors have no version counter
            ver = None
        return (ptr, t.storage_offset() * t.element_size(), t.numel() * t.element_size(), ver, self.writes.get(ptr, 0))

    def _output_key(self, t, call):
        """An output's identity, valid while the engine holds the tensor: a
        storage freed and reallocated at the same address is not the same
        data, so a producer counts only while its tensor is alive."""
        k = self._key(t)
        self.producers[k] = (call, weakref.ref(t))
        return k

    def _live(self, k):
        p = self.producers.get(k)
        if p is None:
            return None
        if p[1]() is None:
            del self.producers[k]
            return None
        return p[0]

    def _input_key(self, t):
        """An input's identity: an earlier recorded output's when it is that
        (alive, same storage, bytes and version), else one no output has."""
        k = self._key(t)
        if self._live(k) is None:
            self.serial += 1
            k = k + (("unlinked", self.serial),)
        return k

    # -- a call ----------------------------------------------------------
    def begin(self, op, names, args):
        """Bind, place and copy one call; returns the Call, or None when it
        is not captured. names: the argument names, in order, with args."""
        if not self.active or not wanted(self.sel, op):
            return None

        with self.lock:
            if _graph_capturing():
                self.say(
                    "a CUDA graph is being captured: calls inside a graph are replayed without Python, so the hook "
                    "cannot see them. Run the engine without CUDA graphs to capture: vLLM --enforce-eager, SGLang "
                    "--disable-decode-cuda-graph (or --cuda-graph-backend-decode=disabled; --disable-cuda-graph is "
                    "deprecated in 0.5.23).")
                return None
            tensors, params, skipped = {}, {}, []
            owner = None  # the object of a method call (its plan is kept by it)
            for arg, v in zip(names, args):
                name = op.rename.get(arg, arg)
                if arg == "self" and (op.keeps_plan or op.plan_from):
                    owner = v
                elif _is_tensor(v):
                    tensors[name] = v
                elif isinstance(v, (tuple, list)) and v and all(_is_tensor(x) for x in v):
                    for i, x in enumerate(v):
                        tensors[op.rename.get(f"{arg}.{i}", f"{name}.{i}")] = x
                elif _is_dataclass(v) and op.keeps_plan:
                    # A metadata object (FlashInfer's MLAPlanMetadata): its fields.
                    for f, fv in _fields(v):
                        if _is_tensor(fv):
                            tensors[f] = fv
                        elif param_str(fv) is not None:
                            params[f] = param_str(fv)
                elif v is not None:
                    s = param_str(v)
                    if s is None:
                        skipped.append(f"{name} ({type(v).__name__})")
                    else:
                        params[name] = s
            if op.keeps_plan:
                self._keep_plan(op, owner, tensors, params)
                return None
            planned = {}
            if op.plan_from:
                planned = self._plan_of(op, owner, tensors, params)
            call = Call(op, tensors, params, skipped)
            if self.device is None and tensors:
                self.device = next(iter(tensors.values())).device
            # Place it: a cache op names its layer and may start a new step.
            cache = next((tensors[n] for n in (op.cache or "").split("|") if n in tensors), None)
            if cache is not None:
                layer = self.layers.setdefault(cache.untyped_storage().data_ptr(), len(self.layers))
                if (op.name, layer) in self.seen:
                    self.step += 1
                    self.seen = set()
                self.seen.add((op.name, layer))
                call.step, call.layer = self.step, layer
            else:
                src = self._producer(tensors)
                if src is not None:
                    call.step, call.layer = src.step, src.layer
            if call.layer is not None and not self._selected(call):
                self._maybe_stop()
                return None
            if call.layer is None and not self.sel.wants_step(self.step) and not self.sel.wants_step(self.step + 1):
                self._maybe_stop()
                return None
            call.rows, batch = self._request_rows(op, tensors)
            if call.rows == []:
                return None
            if call.rows is not None:
                call.meta["kcheck.capture.requests"] = ",".join(str(r) for r in call.rows)
                call.meta["kcheck.capture.batch_rows"] = str(batch)
            # Copy the inputs (the written-in-place ones too, as they were).
            views = {}
            for name, t in tensors.items():
                base = op.views.get(name)
                if base in tensors and t.untyped_storage().data_ptr() == tensors[base].untyped_storage().data_ptr():
                    views[name] = base
            est = sum(t.numel() * t.element_size() for n, t in tensors.items() if n not in views)
            est += sum(tensors[n].numel() * tensors[n].element_size() for n in (*op.inplace, *op.outputs) if n in tensors)
            est += sum(t.numel() * t.element_size() for t in planned.values())
            call.est = est + HEADER_SLACK
            copies = (1 if self.sel.calls else 0) + (1 if self.sel.pipeline_steps > 0 and op.contract else 0)
            call.reserved = call.est * copies
            if not self.store.reserve(call.reserved):
                self.fail(f"the byte budget ({self.sel.max_bytes} bytes) is reached: {self.store.used} bytes held, "
                          f"{op.name} needs {call.reserved} more (KCHECK_CAPTURE_MAX_BYTES raises it)")
                return None
            for name, t in tensors.items():
                if name in views:
                    call.params[f"kcheck.capture.view.{name}"] = views[name]
                    continue
                if name in op.outputs:
                    continue  # an output buffer: what it holds before is not data
                call.ids_before[name] = self._input_key(t) + call.row_tag(name)
                call.before[name] = call.copy(name, t)
            for name, t in planned.items():
                call.before[name] = t
                call.ids_before[name] = ("plan", name, id(t))
            call.select_csr()
            return call

    def end(self, call, result):
        """After the engine's call: copy what it wrote and returned."""
        with self.lock:
            if not self.active:
                self.store.release(call.reserved)
                return
            op = call.op
            for name in (*op.inplace, *op.outputs):
                t = call.args.get(name)
                if t is None:
                    continue
                ptr = t.untyped_storage().data_ptr()
                self.writes[ptr] = self.writes.get(ptr, 0) + 1
                call.after[name] = call.copy(name, t)
                call.ids_after[name] = self._output_key(t, call) + call.row_tag(name)
            if op.returns and result is not None:
                vals = result if isinstance(result, (tuple, list)) else (result,)
                for name, v in zip(op.returns, vals):
                    if _is_tensor(v):
                        call.after[name] = call.copy(name, v)
                        call.ids_after[name] = self._output_key(v, call) + call.row_tag(name)
            call.args = None  # the engine's tensors are not kept
            if call.layer is None:
                self.pending.append(call)
                if len(self.pending) > 64:
                    self.fail("64 calls in a row without a KV-cache op: no layer to put them in")
                return
            if call.op.cache:
                for c in self.pending:
                    c.step, c.layer = call.step, call.layer
                ready, self.pending = self.pending, []
                for c in ready:
                    self._keep(c)
            self._keep(call)

    # -- plans -------------------------------------------------------------
    def _keep_plan(self, op, owner, tensors, params):
        """Copy a plan's tensors now: the engine may rewrite them in place
        before the run (FlashInfer's CUDA-graph plans are updated in place)."""
        if owner is None:
            self.say(f"{op.name}: the call has no object to keep its plan by; not used")
            return
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        if self.store.max_bytes is not None and nbytes > self.store.max_bytes:
            self.fail(f"{op.name}: the plan's tensors ({nbytes} bytes) exceed the byte budget")
            return
        for k in [k for k, (ref, _, _) in self.plans.items() if ref() is None]:
            del self.plans[k]  # objects gone: their plans with them
        self.plans[id(owner)] = (weakref.ref(owner), {k: _copy(t) for k, t in tensors.items()}, dict(params))

    def _plan_of(self, op, owner, tensors, params):
        """The latest plan of the call's object: its tensors (the CPU copies
        taken at plan time) for the names the call lacks; its parameters
        join the call's (the call's own win)."""
        kept = self.plans.get(id(owner)) if owner is not None else None
        if kept is None or kept[0]() is not owner:
            self.say(f"{op.name}: no {op.plan_from} call on this object was seen (it was planned before the hook "
                     "was on?): its capture lacks the plan's page lists and scale")
            return {}
        _, ts, ps = kept
        for k, v in ps.items():
            params.setdefault(k, v)
        return {k: t for k, t in ts.items() if k not in tensors}

    # -- request rows ------------------------------------------------------
    def _request_rows(self, op, tensors):
        """The batch rows of this call KCHECK_CAPTURE_REQUESTS keeps, and
        the call's batch size: None (all: no selection, or an op with no
        request rows), a sorted list, or [] (none of the selected rows is in
        this call: not captured).

        A row is a position in the call's batch (the row of the block
        table and seq lens it carries), not an engine request id: kernels
        are not given request ids, and an engine may move a request to
        another row between steps (vLLM's persistent batch condenses its
        rows when a request finishes, SGLang filters its batch)."""
        import logging as _logging

        req = self.sel.requests
        if req is None:
            return None, None
        named = [n for n in op.rows if n in tensors and tensors[n].dim() > 0]
        if named:
            batch = tensors[named[0]].shape[0]
        elif op.csr and op.csr[0][0] in tensors:
            batch = tensors[op.csr[0][0]].shape[0] - 1
        else:
            self.say(f"KCHECK_CAPTURE_REQUESTS: {op.name} carries no request row (it addresses cache slots or token "
                     "rows, not a request's); its calls are captured whole", _logging.INFO)
            return None, None
        rows = sorted(r for r in req if r < batch)
        if not rows:
            self.say(f"KCHECK_CAPTURE_REQUESTS: a {op.name} call has {batch} request rows, none of them selected; "
                     "calls like it are not captured", _logging.INFO)
        return rows, batch

    # -- placement ---------------------------------------------------------
    def _producer(self, tensors):
        for t in tensors.values():
            c = self._live(self._key(t))
            if c is not None and c.layer is not None:
                return c
        return None

    def _selected(self, call):
        return self.sel.wants_layer(call.layer) and self.sel.wants_step(call.step)

    def _maybe_stop(self):
        last = self.sel.last_step
        if last is not None and self.step > last and not self.pending:
            self.flush()
            self.active = False
            self.say(f"the selected steps (up to {last}) are captured; the hook is off from step {self.step}", logging.INFO)

    def _keep(self, call):
        if not self._selected(call):
            self.store.release(call.reserved)
            return
        self.index += 1
        if self.sel.calls:
            self._write_call(call)
        if self.sel.pipeline_steps > 0 and call.op.contract is not None:
            layer = call.layer
            start = self.window_start.get(layer)
            if start is not None and call.step >= start + self.sel.pipeline_steps:
                self._write_window(layer)
                start = None
            if start is None:
                self.window_start[layer] = call.step
                self.windows[layer] = []
            self.windows[layer].append(call)

    # -- files -------------------------------------------------------------
    def _meta(self, call):
        return provenance(call.op.engine, call.op.target.split(":", 1)[1], self.device)

    def _write_call(self, call):
        op = call.op
        name = f"{op.name}.s{call.step}.l{call.layer}"
        meta = self._meta(call)
        meta["kcheck.capture.step"], meta["kcheck.capture.layer"] = str(call.step), str(call.layer)
        meta.update(call.meta)
        if call.skipped:
            meta["kcheck.capture.skipped"] = ", ".join(call.skipped)
        if op.readable or op.contract is None:
            tensors = {f"{k}_before" if k in op.inplace else k: v for k, v in call.before.items()}
            tensors.update({f"{k}_after" if k in op.inplace else k: v for k, v in call.after.items()})
            meta.update(call.params)
            meta["kcheck.kernel"] = op.kernel
            if op.params:
                meta.update(op.params(call))
            meta["kcheck.capture.layout"] = "engine" if op.readable else "engine (not yet readable: " + op.unreadable_why + ")"
            self._write(name, tensors, meta)
            return
        parts = op.contract(call)
        meta["kcheck.capture.layout"] = f"contract ({op.unreadable_why}; tensors moved into the contract's layout, data unchanged)"
        meta["kcheck.capture.args"] = ", ".join(sorted(call.before) + sorted(f"{k} (after)" for k in call.after))
        tensors, m = _assemble([(p, "" if len(parts) == 1 else p.stage) for p in parts])
        meta.update(m)
        self._write(name, tensors, meta)

    def _write_window(self, layer):
        calls = self.windows.pop(layer, [])
        self.window_start.pop(layer, None)
        if not calls:
            return
        labelled, used = [], {}
        for c in calls:
            for p in c.op.contract(c):
                base = f"s{c.step}.{p.stage}"
                used[base] = used.get(base, 0) + 1
                labelled.append((p, base if used[base] == 1 else f"{base}{used[base]}"))
        tensors, meta = _assemble(labelled)
        m = self._meta(calls[0])
        m["source"] = f"{calls[0].op.engine} {m['kcheck.capture.engine_version']}, one layer's calls over decode steps (kcheck.capture)"
        m["kcheck.capture.call"] = ", ".join(sorted({c.op.target.split(':', 1)[1] for c in calls}))
        m["kcheck.capture.layer"] = str(layer)
        m["kcheck.capture.steps"] = f"{calls[0].step}-{calls[-1].step}"
        if self.sel.requests is not None:
            m["kcheck.capture.requests"] = (",".join(str(r) for r in sorted(self.sel.requests)) + " (batch rows, in the calls "
                                            "that carry request rows; the others whole)")
        m.update(meta)
        self._write(f"pipeline.l{layer}.s{calls[0].step}-{calls[-1].step}", tensors, m)

    def _write(self, name, tensors, meta):
        try:
            self.store.write(name, {k: v.contiguous() for k, v in tensors.items()}, meta)
        except CaptureError as e:
            self.fail(str(e))

    def flush(self):
        """Write every pipeline being assembled (also what is still pending)."""
        with self.lock:
            for c in self.pending:
                self.store.release(c.reserved)
            self.pending = []
            for layer in list(self.windows):
                if self.active:
                    self._write_window(layer)


def wanted(sel, op):
    """Is op selected, itself or as the plan of a selected op?"""
    return sel.wants_op(op.name) or any(o.plan_from == op.name and sel.wants_op(o.name) for o in opsmod.OPS.values())


def _is_dataclass(v):
    import dataclasses

    return dataclasses.is_dataclass(v) and not isinstance(v, type)


def _fields(v):
    import dataclasses

    return [(f.name, getattr(v, f.name)) for f in dataclasses.fields(v)]


def _copy(t):
    """A CPU copy owning its memory (the engine's tensor is not touched)."""
    return t.detach().to("cpu", copy=True).contiguous()


def _assemble(labelled):
    """Parts -> one file's tensors and metadata. With one unlabelled part a
    single-kernel file; else a pipeline whose links come from identity: an
    input that is an earlier stage's output (same identity) is linked to it
    and not stored again."""
    if len(labelled) == 1 and labelled[0][1] == "":
        p = labelled[0][0]
        meta = {"kcheck.kernel": p.kernel, **p.params}
        return {k: v for k, (v, _) in p.tensors.items()}, meta
    tensors, meta, produced = {}, {"kcheck.kernel": "pipeline"}, {}
    stages = []
    for p, prefix in labelled:
        stages.append(prefix)
        meta[f"kcheck.{prefix}.kernel"] = p.kernel
        for k, v in p.params.items():
            meta[f"{prefix}.{k}"] = v
        for name, (t, ident) in p.tensors.items():
            if name not in p.outputs and ident is not None and ident in produced:
                meta[f"kcheck.{prefix}.from.{name}"] = produced[ident]
                continue
            tensors[f"{prefix}.{name}"] = t
        for name in p.outputs:
            ident = p.tensors[name][1]
            if ident is not None:
                produced[ident] = f"{prefix}.{name}"
    meta["kcheck.stages"] = ",".join(stages)
    return tensors, meta


def _graph_capturing():
    import torch

    try:
        return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    except Exception:
        return False


def bind_python(fn, args, kwargs):
    """A Python call's arguments, by the function's own parameter names."""
    sig = inspect.signature(fn)
    b = sig.bind(*args, **kwargs)
    b.apply_defaults()
    names, vals = [], []
    for k, v in b.arguments.items():
        p = sig.parameters[k]
        if p.kind == p.VAR_KEYWORD:
            names.extend(v.keys())
            vals.extend(v.values())
        elif p.kind == p.VAR_POSITIONAL:
            names.extend(f"{k}.{i}" for i in range(len(v)))
            vals.extend(v)
        else:
            names.append(k)
            vals.append(v)
    return names, vals


def bind_schema(func, args, kwargs):
    """A torch op's arguments, by its schema's names (defaults filled in)."""
    names, vals = [], []
    for i, a in enumerate(func._schema.arguments):
        if i < len(args):
            v = args[i]
        elif a.name in kwargs:
            v = kwargs[a.name]
        elif a.has_default_value():
            v = a.default_value
        else:
            v = None
        names.append(a.name)
        vals.append(v)
    return names, vals
