"""The engines' own plugin mechanisms call these (python/pyproject.toml).

vLLM 0.33 (vllm/plugins/__init__.py): load_general_plugins() runs every
`vllm.general_plugins` entry point in each process it starts (API server,
engine core, workers: vllm/v1/worker/worker_base.py init_worker calls it
before the model is built), at most once a process; VLLM_PLUGINS limits
which. SGLang 0.5.23 (sglang/srt/plugins/__init__.py): load_plugins() runs
every `sglang.srt.plugins` entry point, called by the scheduler process
(sglang/srt/managers/scheduler.py) and the engine (sglang/srt/entrypoints/
engine.py); SGLANG_PLUGINS limits which. Both functions do nothing unless
KCHECK_CAPTURE is set, and never raise.

The `.pth` hook (kcheck_capture.pth, for any other program) imports
`kcheck.capture.autoload` only when KCHECK_CAPTURE is set.
"""


def vllm():
    from kcheck.capture import start_from_env

    start_from_env(who="vllm plugin")


def sglang():
    from kcheck.capture import start_from_env

    start_from_env(who="sglang plugin")
