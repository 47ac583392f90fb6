package faults

import (
	"fmt"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/nvfp4"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

var nvfp4Kernels = []string{"nvfp4_quantize", "nvfp4_dequantize", "nvfp4_gemm"}

// swapNibbles exchanges the two FP4 codes of every byte.
func swapNibbles(t *tensor.Tensor) *tensor.Tensor {
	c := replaced(t)
	for i, b := range c.Data {
		c.Data[i] = b<<4 | b>>4
	}
	return c
}

func flip(kind string) string {
	if kind == "quant" {
		return "dequant"
	}
	return "quant"
}

func init() {
	Register(&Fault{
		Name: "nibble_order", Stage: kernel.StageQuant, Kernels: nvfp4Kernels,
		BugClass: "FP4 packing with element 2i in the HIGH nibble (ModelOpt, vLLM and FlashInfer put it in the low one)",
		Doc:      "The kernel packs or unpacks the two E2M1 codes of a byte in the wrong order, so every pair of neighbouring elements is exchanged.",
		Inputs: func(in map[string]*tensor.Tensor, _ kernel.Params) (map[string]*tensor.Tensor, error) {
			for _, name := range []string{"packed", "a_packed", "b_packed"} {
				if t, ok := in[name]; ok {
					in[name] = swapNibbles(t)
				}
			}
			return in, nil
		},
		Outputs: func(in kernel.Inputs, out map[string]*tensor.Tensor) error {
			if t, ok := out["packed"]; ok { // the quantizer writes them swapped
				out["packed"] = swapNibbles(t)
			}
			return nil
		},
	})
	Register(&Fault{
		Name: "global_scale_inverted", Stage: kernel.StageQuant, Kernels: []string{"nvfp4_dequantize", "nvfp4_gemm"},
		BugClass: "global scale applied in the wrong direction: ModelOpt's weight_scale_2 (amax/2688, multiply) taken for vLLM's gs (2688/amax, divide) or the reverse",
		Doc:      "The kernel divides by a dequant-direction global scale (or multiplies by a quant-direction one), scaling every output by g^2 or 1/g^2.",
		Params: func(p kernel.Params) kernel.Params {
			for _, key := range []string{"global_scale_kind", "a_global_kind", "b_global_kind"} {
				p[key] = flip(p.String(key, "dequant"))
			}
			return p
		},
	})
	Register(&Fault{
		Name: "swizzled_scales_read_linear", Stage: kernel.StageQuant, Kernels: nvfp4Kernels,
		BugClass: "block scales in the CUTLASS 128x4 swizzled layout read as a row-major [M, K/16] array (or written linear where swizzled is declared)",
		Doc:      "The kernel indexes swizzled_128x4 scales as if they were linear, so most 16-element blocks get another block's scale.",
		// Reading: the kernel takes scale (m, k) from flat offset m*K_sf + k of
		// the swizzled buffer, i.e. it sees the buffer's bytes as a linear
		// array; planted by handing the reference those bytes as linear
		// scales.
		Params: func(p kernel.Params) kernel.Params {
			if p["scale_layout"] == "swizzled_128x4" {
				p["scale_layout"] = "linear"
				p["kcheck.fault.read_swizzled_as_linear"] = "true"
			}
			return p
		},
		Inputs: func(in map[string]*tensor.Tensor, p kernel.Params) (map[string]*tensor.Tensor, error) {
			if p["kcheck.fault.read_swizzled_as_linear"] != "true" {
				return in, nil
			}
			for _, pair := range [][2]string{{"block_scale", "packed"}, {"a_scale", "a_packed"}, {"b_scale", "b_packed"}} {
				sc, ok1 := in[pair[0]]
				pk, ok2 := in[pair[1]]
				if !ok1 || !ok2 || len(pk.Shape) != 2 {
					continue
				}
				rows, kSF := pk.Shape[0], pk.Shape[1]*2/16
				if rows*kSF > len(sc.Data) {
					return nil, fmt.Errorf("tensor %s holds %d bytes, fewer than %d x %d scales", pair[0], len(sc.Data), rows, kSF)
				}
				in[pair[0]] = &tensor.Tensor{DType: sc.DType, Shape: []int{rows, kSF}, Data: sc.Data[:rows*kSF]}
			}
			return in, nil
		},
		// Writing: the quantizer stores scale (m, k) at m*K_sf + k of the
		// padded buffer it was asked to swizzle. The Params hook already made
		// the reference write linear scales; they go at the buffer's start.
		Outputs: func(in kernel.Inputs, out map[string]*tensor.Tensor) error {
			sc, ok := out["block_scale"]
			if !ok || in.Params["scale_layout"] != "swizzled_128x4" {
				return nil
			}
			x := in.Tensors["x"]
			mPad, kPad := nvfp4.PaddedShape(x.Shape[0], x.Shape[1]/16)
			bad := tensor.New(sc.DType, mPad, kPad)
			copy(bad.Data, sc.Data)
			out["block_scale"] = bad
			return nil
		},
	})
}
