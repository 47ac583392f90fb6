"""The engine-capture corpus of issue 16: captures in the engines' own names,
dtypes and layouts, each with a planted-fault twin and an expected verdict.

Issue 16 ("Engine captures as deployed") asks kcheck to read what vLLM,
SGLang, FlashInfer and FlashMLA really hand it. This package makes the
evidence that work is built and judged against, before it exists:

- where an engine's kernel runs on the CPU (its Triton kernels under
  TRITON_INTERPRET=1, with kcheck.worker.interp's interpreter fixes), the
  capture is that kernel's own output, called as the engine's backend calls
  it (`kcheck.corpus.produced_by` = `engine`);
- otherwise (CUDA-only kernels: FlashMLA, trtllm-gen, CUTLASS MLA, vLLM's
  C++ ops) the tensors are laid out as the engine's source lays them out,
  the source cited in the generator beside the code and in the file's
  metadata, and the outputs are what a correct kernel of the engine's
  precision returns (`produced_by` = `source-layout`).

Every capture has a twin with one planted fault, made by feeding the same
engine code (or the same layout) one wrong input while the file records the
right one, so the twin is what a real bug of that kind leaves behind.

`python -m kcheck.corpus --out DIR` writes the whole corpus and DIR/
manifest.json: per file the engine, version, function and source lines, the
audit rows and issue-16 item it serves, and the verdict a correct kcheck
must give (pass; fail with the culprit tensor, stage and signature; or a
refusal whose message names what is missing). `--committed` writes only the
small subset kept in fixtures/engines/. `python -m kcheck.corpus.today`
runs today's kcheck over a written corpus and records what it says.
"""
