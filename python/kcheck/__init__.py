"""kcheck's Python side.

kcheck (the Go program) judges kernels against exact references. This package
is its bridge to the engines: `kcheck.worker` runs the engines' own kernels
(vLLM, SGLang and FlashInfer Triton kernels, under Triton's interpreter on a
CPU or compiled on a GPU; torchao and ModelOpt NVFP4) behind kcheck's worker
protocol, so `kcheck run --backend worker:NAME` judges them over its catalog.
`kcheck.engines` reads the engine table the Go side's `--from ENGINE` uses.
"""
