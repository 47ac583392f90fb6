"""Move a dsa_indexer evidence file's inputs onto the fp8 grid.

    python -m kcheck.fp8grid IN OUT

vLLM's Triton MQA-logits kernel reads fp8 queries and an fp8 key cache
with per-token scales, while kcheck's dsa_indexer contract holds BF16 ones
(issue 16, item 5). A BF16 value that is an e4m3 code times a power of two
passes between the two exactly, so the engine worker can be judged on such
inputs without anyone quantizing: this rounds each (request, head) row of
`q` and each token row of `k_cache` to e4m3 codes times vLLM's ue8m0 scale
(2^ceil(log2(max(amax, 1e-4) / 448))), stores them back as BF16, and drops
the outputs. kcheck's references then judge the kernel on exactly the
values it reads. The rounding makes new test inputs; it is not a model of
any engine's quantizer, and the file says so in its metadata
(`kcheck.derived`).
"""

import sys

OUTPUTS = ("scores", "topk_indices")


def to_grid(x):
    """Each last-axis row of x (any float dtype) as e4m3 codes times a
    power-of-two scale, RTNE, returned in x's dtype (exact for bf16)."""
    import torch

    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True).nan_to_num(0.0)
    scale = torch.exp2(torch.ceil(torch.log2(amax.clamp(min=1e-4) / 448.0)))
    return ((xf / scale).to(torch.float8_e4m3fn).float() * scale).to(x.dtype)


def derive(in_path, out_path):
    from safetensors.torch import save_file

    from kcheck.worker import files

    tensors, meta = files.read(in_path)
    if meta.get("kcheck.kernel") != "dsa_indexer":
        raise SystemExit(f"{in_path}: kcheck.kernel is {meta.get('kcheck.kernel')!r}, want dsa_indexer")
    for name in ("q", "k_cache"):
        if name not in tensors:
            raise SystemExit(f"{in_path}: no tensor {name}")
    out = {k: v for k, v in tensors.items() if k not in OUTPUTS}
    out["q"] = to_grid(tensors["q"])
    out["k_cache"] = to_grid(tensors["k_cache"])
    m = dict(meta)
    m["kcheck.case"] = meta.get("kcheck.case", "?") + "/fp8-grid"
    m["kcheck.derived"] = ("python -m kcheck.fp8grid: q per (request, head) row and k_cache per token rounded to e4m3 codes "
                           "times power-of-two scales, stored as BF16 (exact); outputs dropped")
    save_file({k: v.contiguous() for k, v in out.items()}, out_path, metadata=m)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    derive(argv[0], argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
