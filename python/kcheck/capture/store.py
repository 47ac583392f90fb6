"""Evidence files on disk: written whole or not at all, never over another.

A capture is written with the official safetensors (`save_file`) into a
temporary file in the capture directory, then hard-linked to its final name
and the temporary removed. link(2) fails when the name exists, so a capture
never replaces a file, not even one another process wrote a moment ago (a
rename would); a reader never sees a half-written file under a capture's
name. The byte budget counts what a capture will hold before any of it is
copied off the device, so the directory never grows past it.
"""

import datetime
import errno
import importlib.metadata as md
import os
import threading


class CaptureError(Exception):
    """Capturing failed; the engine's call is unaffected. The message says why."""


def tensor_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors.values())


class Store:
    """One capture directory with its byte budget.

    reserve() accounts a capture's bytes before it is copied (False: over
    budget, nothing reserved); write() puts a reserved capture on disk.
    """

    def __init__(self, directory, max_bytes):
        self.directory = directory
        self.max_bytes = max_bytes
        self.used = 0
        self.files = []
        self._lock = threading.Lock()
        self._serial = 0

    def reserve(self, nbytes):
        with self._lock:
            if self.max_bytes is not None and self.used + nbytes > self.max_bytes:
                return False
            self.used += nbytes
            return True

    def release(self, nbytes):
        with self._lock:
            self.used -= nbytes

    def write(self, name, tensors, metadata):
        """Write tensors (CPU, contiguous, each owning its memory) as NAME.safetensors;
        returns the path. A name taken by an existing file gets a numbered
        suffix (NAME.1.safetensors, ...): nothing on disk is ever replaced."""
        from safetensors.torch import save_file

        os.makedirs(self.directory, exist_ok=True)
        with self._lock:
            self._serial += 1
            serial = self._serial
        tmp = os.path.join(self.directory, f".{name}.{os.getpid()}.{serial}.tmp")
        try:
            save_file(tensors, tmp, metadata=metadata)
            for n in range(1000):
                final = os.path.join(self.directory, f"{name}.safetensors" if n == 0 else f"{name}.{n}.safetensors")
                try:
                    os.link(tmp, final)
                except FileExistsError:
                    continue
                self.files.append(final)
                return final
            raise CaptureError(f"{self.directory}: 1000 files named {name}.*.safetensors exist already")
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise CaptureError(f"{self.directory}: no space left on the device writing {name}.safetensors") from e
            raise CaptureError(f"{self.directory}: writing {name}.safetensors: {e}") from e
        except Exception as e:  # safetensors' own errors (SafetensorError is not an OSError)
            if isinstance(e, CaptureError):
                raise
            raise CaptureError(f"{self.directory}: writing {name}.safetensors: {type(e).__name__}: {e}") from e
        finally:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _version(dist):
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


# The distributions whose version a capture names, by engine.
ENGINE_DISTS = {"vllm": "vllm", "sglang": "sglang", "flashinfer": "flashinfer-python", "flashmla": "flash_mla", "torchao": "torchao"}


def provenance(engine, call, device):
    """The provenance keys of reference/CONTRACTS.md §1.2 and the capture's own.

    source: engine and version and the call; device: the GPU's name (or
    cpu), and its compute capability (kcheck.capture.device_capability,
    "9.0"); driver: the CUDA runtime torch was built with and the driver
    version where it can be read; kernel_build: the engine package's
    version and, for a source build, its git revision as the package
    records it; captured_at: RFC 3339, UTC."""
    import torch

    dist = ENGINE_DISTS.get(engine, engine)
    ver = _version(dist) or "unknown version"
    meta = {
        "kcheck.format": "1",
        "source": f"{engine} {ver}, {call}",
        "kcheck.capture.engine": engine,
        "kcheck.capture.engine_version": ver,
        "kcheck.capture.call": call,
        "kcheck.capture.torch": torch.__version__,
        "captured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
    }
    if device.type == "cuda":
        meta["device"] = torch.cuda.get_device_name(device)
        # The architecture decides some kernels' numerics (FlashMLA's sparse
        # decode reads fp8_ds_mla tile scales as bf16 on sm90, E8M0 on
        # sm100): --from reads this key (internal/engines flashMLAScaleRead).
        meta["kcheck.capture.device_capability"] = "%d.%d" % torch.cuda.get_device_capability(device)
        meta["driver"] = _driver()
    else:
        meta["device"] = str(device.type)
        if os.environ.get("TRITON_INTERPRET") == "1":
            meta["device"] += " (TRITON_INTERPRET=1)"
    meta["kernel_build"] = _build(engine, dist, ver)
    try:
        import triton

        meta["kcheck.capture.triton"] = triton.__version__
    except ImportError:
        pass
    return meta


def _driver():
    import torch

    parts = [f"cuda runtime {torch.version.cuda}"]
    try:
        import ctypes

        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int()
        if lib.cuDriverGetVersion(ctypes.byref(v)) == 0:
            parts.append(f"driver API {v.value // 1000}.{(v.value % 1000) // 10}")
    except OSError:
        pass
    return ", ".join(parts)


def _build(engine, dist, ver):
    """The engine's build as its package says: vLLM's own commit id when
    it records one (vllm/_version.py), else the distribution's version."""
    if engine == "vllm":
        try:
            from vllm import _version as v

            commit = getattr(v, "__commit_id__", None) or getattr(v, "commit_id", None)
            if commit:
                return f"{dist} {ver} ({commit})"
        except Exception:
            pass
    return f"{dist} {ver}"
