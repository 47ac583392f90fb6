// Package nvfp4 is the float64 reference for NVFP4: the two-level block-scaled
// 4-bit format of NVIDIA's Blackwell tensor cores, as TensorRT-LLM, vLLM,
// SGLang and ModelOpt checkpoints use it.
//
// A tensor of shape [rows, K] is stored as E2M1 codes packed two a byte
// (element 2i in the low nibble), one E4M3FN scale per 16 consecutive
// elements of a row, and one per-tensor float32 global scale. The value of
// element (r, c) is
//
//	e2m1(code[r,c]) * e4m3(scale[r, c/16]) * g
//
// where g is the global scale itself (the "dequant" kind: ModelOpt's
// weight_scale_2 = amax/2688) or its reciprocal (the "quant" kind: vLLM's
// gs = 2688/amax). The block scales are stored either row-major ("linear")
// or in the 128x4 tiled layout the tensor cores read ("swizzled_128x4",
// reference/CONTRACTS.md §5).
//
// Every function here comes in the two flavours kcheck judges kernels with
// (reference/CONTRACTS.md §1.1): the EXACT value, computed in float64 with exact division, and
// the EXPECTED value, which emulates in float32 what the engines' CUDA
// kernels compute (approximate reciprocals, fp32 accumulation, a final
// rounding to the output dtype). The difference between the two is the
// noise any correct kernel shows; a quantized code or block scale that
// differs from the exact one only at a rounding tie is classified as
// equivalent rather than wrong.
package nvfp4
