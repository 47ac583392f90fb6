// Package cuda runs kcheck's optimized CUDA kernels (the .cu files in this
// directory) on contract tensors. It is the GPU side of the `cuda` backend.
//
// The .cu files are the kernels a serving stack runs, written for speed:
// NVFP4 quantize / dequantize / W4A4 GEMM (nvfp4.cu), the paged KV cache
// write and gather (kvcache.cu), and MLA decode with split-K and its combine
// (mla_decode.cu). `make kernels` compiles each to PTX for compute_80
// (cuda/ptx/NAME.ptx, JIT-compiled by the driver for sm_80, sm_90 and
// sm_120) and to sm_90a, sm_100a and sm_120a cubins (nvcc 13.0 from PyPI's
// wheels, cuda/toolchain); the sm_120a GEMM uses the block-scaled FP4 MMA. The launcher loads them at run time from a
// directory (see README.md for why they are not embedded).
//
// Build tags. gorgonia.org/cu calls os.Exit(1) from its package init when
// the machine has no GPU, so every file that imports it carries the `cuda`
// build tag, and nothing outside the tag imports this package's tagged API:
// the CLI reaches the GPU through the worker binary cmd/kcheck-gpu (package
// internal/gpu spawns it). Without the tag this package holds only the
// declared precision of each kernel (Precisions), which the worker writes
// into its outputs and a test checks against the kcheck:precision lines of
// the .cu files.
//
// Each kernel file is documented by the reference it is judged against, in
// the manner of gonum's asm stubs: the loop in reference/<family> is the
// specification, the .cu file the fast path, and their difference is
// measured, never assumed.
package cuda
