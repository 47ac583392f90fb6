package nvfp4

import (
	"context"
	"fmt"
	"math"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/faults"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/nvfp4"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// NVFP4 faults (stage quant). A fault that lives on both sides of a format
// (the writer and the reader) would cancel in a pipeline: a quantizer that
// packs high-nibble-first feeding a GEMM that unpacks high-nibble-first is
// correct end to end. So each fault names the side the bug is on, as real
// bugs are: one kernel disagreeing with everyone else.

var nvfp4Kernels = []string{"nvfp4_quantize", "nvfp4_dequantize", "nvfp4_gemm"}

// swapNibbles exchanges the two FP4 codes of every byte.
func swapNibbles(t *tensor.Tensor) *tensor.Tensor {
	c := t.Clone()
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

// scaleOperands are the (scale, packed) tensor pairs of the NVFP4 kernels.
var scaleOperands = [][2]string{{"block_scale", "packed"}, {"a_scale", "a_packed"}, {"b_scale", "b_packed"}}

// isSubnormalE4M3 reports whether an E4M3FN code is a nonzero subnormal
// (exponent field 0, mantissa not 0): values 2^-9 .. 7·2^-9.
func isSubnormalE4M3(c uint8) bool { return c&0x78 == 0 && c&0x07 != 0 }

// isNaNE4M3 reports whether an E4M3FN code is NaN (0x7F, 0xFF).
func isNaNE4M3(c uint8) bool { return c&0x7F == 0x7F }

// scaleIndex maps linear scale (m, k) of a [rows, kSF] scale matrix to its
// byte in the stored layout.
func scaleIndex(swizzled bool, m, k, kSF int) int {
	if swizzled {
		return nvfp4.SwizzledOffset(m, k, kSF)
	}
	return m*kSF + k
}

// smallCase is a quick NVFP4 case for triggers.
func smallCase(kern string, m, n, k int, params map[string]string) cases.Case {
	return cases.Case{Name: "trigger/" + kern, Kernel: kern, M: m, N: n, K: k, Seed: 101, Params: params}
}

func init() {
	faults.Register(&faults.Fault{
		Name: "nibble_order", Stage: kernel.StageQuant, Kernels: nvfp4Kernels,
		BugClass: "FP4 packing with element 2i in the HIGH nibble (ModelOpt, vLLM and FlashInfer put it in the low one)",
		Doc: "The quantizer packs element 2i in the high nibble, and the dequantizer and the GEMM's weight loader read it from " +
			"there, so every standard-packed tensor they meet (a ModelOpt checkpoint's weights, another kernel's activations) " +
			"comes out with neighbouring elements exchanged. An activation quantized and consumed by the same wrong " +
			"convention comes out right (a GEMM whose weights are read swapped, fed by the swapped quantizer, computes A'·B' = A·B).",
		Inputs: func(in map[string]*tensor.Tensor, _ kernel.Params) (map[string]*tensor.Tensor, error) {
			for _, name := range []string{"packed", "b_packed"} {
				if t, ok := in[name]; ok {
					in[name] = swapNibbles(t)
				}
			}
			return in, nil
		},
		Outputs: func(_ context.Context, in kernel.Inputs, out map[string]*tensor.Tensor) error {
			if t, ok := out["packed"]; ok { // the quantizer writes them swapped
				out["packed"] = swapNibbles(t)
			}
			return nil
		},
		Trigger: &faults.Trigger{Case: smallCase("nvfp4_quantize", 16, 0, 256, nil)},
		Signatures: []faults.Expect{
			{Tensor: "packed", Pattern: "alternating_nibbles", Coord: kernel.KindByte},
			{On: &faults.Trigger{Case: smallCase("nvfp4_dequantize", 16, 0, 256, nil)}, Tensor: "out", Pattern: "alternating_nibbles", Coord: kernel.KindCol},
			{On: &faults.Trigger{Case: smallCase("nvfp4_gemm", 16, 64, 256, nil)}, Tensor: "out", Pattern: "uniform", Why: "the GEMM sums each output over all of K: swapped neighbours in the weights reach every output element alike"},
		},
	})
	faults.Register(&faults.Fault{
		Name: "global_scale_inverted", Stage: kernel.StageQuant, Kernels: []string{"nvfp4_dequantize", "nvfp4_gemm"},
		BugClass: "global scale applied in the wrong direction: ModelOpt's weight_scale_2 (amax/2688, multiply) taken for vLLM's gs (2688/amax, divide) or the reverse",
		Doc:      "The kernel divides by a dequant-direction global scale (or multiplies by a quant-direction one), scaling every output by g^2 or 1/g^2.",
		Params: func(p kernel.Params) kernel.Params {
			for _, key := range []string{"global_scale_kind", "a_global_kind", "b_global_kind"} {
				p[key] = flip(p.String(key, "dequant"))
			}
			return p
		},
		Trigger: &faults.Trigger{Case: smallCase("nvfp4_dequantize", 16, 0, 256, nil)},
		Signatures: []faults.Expect{
			{Tensor: "out", Pattern: "constant_factor"},
			{On: &faults.Trigger{Case: smallCase("nvfp4_gemm", 16, 64, 256, nil)}, Tensor: "out", Pattern: "constant_factor"},
		},
	})
	faults.Register(&faults.Fault{
		Name: "swizzled_scales_read_linear", Stage: kernel.StageQuant, Kernels: []string{"nvfp4_dequantize", "nvfp4_gemm"},
		Needs:    "scale_layout = swizzled_128x4",
		BugClass: "block scales in the CUTLASS 128x4 swizzled layout read as a row-major [M, K/16] array",
		Doc: "The kernel indexes swizzled_128x4 scales as if they were linear, so most 16-element blocks get another block's scale " +
			"(or a padding zero). Only the reader is planted: a writer and a reader that both used the linear offsets would agree.",
		// The kernel takes scale (m, k) from flat offset m*K_sf + k of the
		// swizzled buffer, i.e. it sees the buffer's bytes as a linear
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
			for _, pair := range scaleOperands {
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
		Trigger:  &faults.Trigger{Case: smallCase("nvfp4_gemm", 16, 64, 256, map[string]string{"scale_layout": "swizzled_128x4"})},
		Simulate: map[string]string{"scale-layout": "swizzled_128x4"},
		Signatures: []faults.Expect{
			{On: &faults.Trigger{Case: smallCase("nvfp4_dequantize", 16, 0, 256, map[string]string{"scale_layout": "swizzled_128x4"})}, Tensor: "out", Pattern: "zeros", Why: "read linearly, most blocks take a scale from the zeroed padding"},
			{Tensor: "out", Pattern: "uniform", Why: "every block's scale is another's, and the GEMM sums them all into every output"},
		},
	})
	faults.Register(&faults.Fault{
		Name: "e4m3_subnormal_scale_flushed", Stage: kernel.StageQuant, Kernels: nvfp4Kernels,
		Needs:    "block scales in E4M3's subnormal range (below 2^-6): blocks whose amax is about 3e4 times below the global scale's",
		BugClass: "E4M3 block scales in the subnormal range (below 2^-6) flushed to zero: an FTZ conversion path, or a hand-written decoder without the subnormal branch",
		Doc: "Block scales whose E4M3 exponent field is 0 are read (and written) as 0, so every element of such a block becomes 0. " +
			"Subnormal scales appear where a block's amax is ~3e4 times below the tensor's (gs·amax/6 < 2^-6): small activations " +
			"under a static input_scale calibrated on a massive activation.",
		Inputs: func(in map[string]*tensor.Tensor, _ kernel.Params) (map[string]*tensor.Tensor, error) {
			for _, pair := range scaleOperands {
				sc, ok := in[pair[0]]
				if !ok {
					continue
				}
				c := sc.Clone()
				for i, b := range c.Data {
					if isSubnormalE4M3(b) {
						c.Data[i] = 0
					}
				}
				in[pair[0]] = c
			}
			return in, nil
		},
		// The quantizer stores the flushed scale and, as s = 0 demands,
		// zero codes for the block.
		Outputs: func(_ context.Context, in kernel.Inputs, out map[string]*tensor.Tensor) error {
			sc, ok1 := out["block_scale"]
			pk, ok2 := out["packed"]
			if !ok1 || !ok2 {
				return nil
			}
			sw := in.Params.String("scale_layout", "linear") == "swizzled_128x4"
			rows, kSF := pk.Shape[0], pk.Shape[1]*2/nvfp4.BlockSize
			sc, pk = sc.Clone(), pk.Clone()
			for m := 0; m < rows; m++ {
				for k := 0; k < kSF; k++ {
					i := scaleIndex(sw, m, k, kSF)
					if !isSubnormalE4M3(sc.Data[i]) {
						continue
					}
					sc.Data[i] = 0
					row := pk.Data[m*pk.Shape[1]:]
					for j := k * nvfp4.BlockSize / 2; j < (k+1)*nvfp4.BlockSize/2; j++ {
						row[j] = 0
					}
				}
			}
			out["block_scale"], out["packed"] = sc, pk
			return nil
		},
		// Rows 0..3 of x are scaled down by 2^-10 .. 2^-13, below the
		// tensor's amax (set by the other rows and the generator's outlier
		// channel) by ~5e4 and more: their block scales land on E4M3
		// subnormals 2^-9..7·2^-9.
		Trigger: &faults.Trigger{Case: smallCase("nvfp4_quantize", 16, 0, 256, nil), Shape: func(in kernel.Inputs) (kernel.Inputs, error) {
			x := in.Tensors["x"].Clone()
			k := x.Shape[1]
			for r := 0; r < 4; r++ {
				for j := 0; j < k; j++ {
					x.SetFloat64(r*k+j, x.Float64At(r*k+j)*math.Ldexp(1, -10-r))
				}
			}
			in.Tensors["x"] = x
			return in, nil
		}},
		Simulate: map[string]string{"act-calib": "100000"},
		Signatures: []faults.Expect{
			{Tensor: "packed", Pattern: "zeros", Why: "the flushed scale zeroes the block's codes"},
			{Tensor: "block_scale", Pattern: "zeros", Why: "the flushed scales themselves"},
			{On: &faults.Trigger{Case: smallCase("nvfp4_dequantize", 16, 0, 256, nil), Shape: subnormalScales}, Tensor: "out", Pattern: "zeros"},
			{On: &faults.Trigger{Case: smallCase("nvfp4_gemm", 16, 64, 256, nil), Shape: subnormalScales}, Tensor: "out", Pattern: "zeros", Why: "a's row 0 reads as zeros, so does its output row"},
		},
	})
	faults.Register(&faults.Fault{
		Name: "fused_shard_global_scale", Stage: kernel.StageQuant, Kernels: []string{"nvfp4_gemm"},
		Needs:    "the two halves of b's rows (the fused shards) with different amax, so that their own global scales would differ",
		BugClass: "a fused GEMM (gate/up, or DeepSeek's fused q_a/kv_a) whose checkpoint shards carry their own weight_scale_2, run with the first shard's global scale for both",
		Doc: "The second half of the N output columns is dequantized with the first half's global scale. The planted factor is the " +
			"ratio the two shards' own globals would have (amax of the first half of B over amax of the second), which is what a " +
			"ModelOpt checkpoint calibrated per shard and an engine keeping one scale produce.",
		Outputs: func(_ context.Context, in kernel.Inputs, out map[string]*tensor.Tensor) error {
			o, ok := out["out"]
			if !ok || len(o.Shape) != 2 {
				return nil
			}
			r, err := shardRatio(in)
			if err != nil || r == 1 {
				return err
			}
			o = o.Clone()
			m, n := o.Shape[0], o.Shape[1]
			for i := 0; i < m; i++ {
				for j := n / 2; j < n; j++ {
					o.SetFloat64(i*n+j, o.Float64At(i*n+j)*r)
				}
			}
			out["out"] = o
			return nil
		},
		// The second half of B's rows gets block scales twice as large
		// (E4M3 code + 8 is one binade up): the "up" shard's weights are
		// twice the "gate" shard's.
		Trigger: &faults.Trigger{Case: smallCase("nvfp4_gemm", 16, 64, 256, nil), Shape: func(in kernel.Inputs) (kernel.Inputs, error) {
			sc := in.Tensors["b_scale"].Clone()
			n := in.Tensors["b_packed"].Shape[0]
			half := len(sc.Data) / n * (n / 2)
			for i := half; i < len(sc.Data); i++ {
				if sc.Data[i] != 0 && sc.Data[i] < 0x76 {
					sc.Data[i] += 8
				}
			}
			in.Tensors["b_scale"] = sc
			return in, nil
		}},
		Signatures: []faults.Expect{
			{Tensor: "out", Pattern: "constant_factor", Why: "the second shard's rows come out scaled by the ratio of the two global scales"},
		},
	})
	faults.Register(&faults.Fault{
		Name: "zero_block_nan", Stage: kernel.StageQuant, Kernels: []string{"nvfp4_quantize"},
		Needs:    "an all-zero 16-element block of x",
		BugClass: "no guard for an all-zero block: the block's scale comes out of 0/0 (TensorRT-LLM's and vLLM's quantizers test SFValue != 0 for this reason)",
		Doc: "A 16-element block whose amax is 0 gets the E4M3 NaN (0x7F) as its block scale instead of 0, so every element " +
			"dequantized from it, and every GEMM output that reads it, is NaN. Zero blocks are common: dead or padded hidden " +
			"channels, padded batch rows.",
		Outputs: func(_ context.Context, in kernel.Inputs, out map[string]*tensor.Tensor) error {
			x, ok1 := in.Tensors["x"]
			sc, ok2 := out["block_scale"]
			if !ok1 || !ok2 || len(x.Shape) != 2 {
				return nil
			}
			sw := in.Params.String("scale_layout", "linear") == "swizzled_128x4"
			rows, k := x.Shape[0], x.Shape[1]
			kSF := k / nvfp4.BlockSize
			sc = sc.Clone()
			for m := 0; m < rows; m++ {
				for b := 0; b < kSF; b++ {
					zero := true
					for j := b * nvfp4.BlockSize; j < (b+1)*nvfp4.BlockSize && zero; j++ {
						zero = x.Float64At(m*k+j) == 0
					}
					if zero {
						sc.Data[scaleIndex(sw, m, b, kSF)] = 0x7F
					}
				}
			}
			out["block_scale"] = sc
			return nil
		},
		// Block 3 of every row is zeroed (a dead channel group).
		Trigger: &faults.Trigger{Case: smallCase("nvfp4_quantize", 16, 0, 256, nil), Shape: func(in kernel.Inputs) (kernel.Inputs, error) {
			x := in.Tensors["x"].Clone()
			k := x.Shape[1]
			for r := 0; r < x.Shape[0]; r++ {
				for j := 3 * nvfp4.BlockSize; j < 4*nvfp4.BlockSize; j++ {
					x.SetFloat64(r*k+j, 0)
				}
			}
			in.Tensors["x"] = x
			return in, nil
		}},
		Signatures: []faults.Expect{
			{Tensor: "block_scale", Pattern: "scale_block", Coord: kernel.KindScaleBlock},
		},
	})
	faults.Register(&faults.Fault{
		Name: "scale_padding_uninitialised", Stage: kernel.StageQuant, Kernels: []string{"nvfp4_quantize", "nvfp4_gemm"},
		Needs:    "a tiled scale_layout with padding: for the quantizer swizzled_128x4 or swizzled_8x4 with M not a multiple of the tile's rows (128 or 8) or K/16 not a multiple of 4; for the GEMM swizzled_128x4 with K/16 not a multiple of 4",
		BugClass: "swizzled scale buffer allocated with torch.empty and its padding never zeroed, read by a GEMM whose last K tile spans the padded scale columns",
		Doc: "The quantizer leaves the padding of the 128x4 (or 8x4) swizzled scales as it found it (here 0xFF, the E4M3 NaN a poisoned " +
			"or recycled buffer holds; reference/CONTRACTS.md §5 says padding is zero). The GEMM's last K tile reads the padded scale columns " +
			"(K/16 not a multiple of 4) and multiplies them by its zero-filled out-of-range data: 0 x NaN poisons every " +
			"output of a row whose padding is NaN.",
		Outputs: func(_ context.Context, in kernel.Inputs, out map[string]*tensor.Tensor) error {
			lay, err := nvfp4.ParseLayout(in.Params.String("scale_layout", "linear"))
			if err != nil || lay == nvfp4.Linear {
				return nil
			}
			if sc, ok := out["block_scale"]; ok {
				x := in.Tensors["x"]
				rows, kSF := x.Shape[0], x.Shape[1]/nvfp4.BlockSize
				sc = sc.Clone()
				for off := range sc.Data {
					if m, k := lay.Position(off, kSF); m >= rows || k >= kSF {
						sc.Data[off] = 0xFF
					}
				}
				out["block_scale"] = sc
			}
			if o, ok := out["out"]; ok && len(o.Shape) == 2 {
				aNaN, err := paddingNaN(in.Tensors, "a_scale", "a_packed")
				if err != nil {
					return err
				}
				bNaN, err := paddingNaN(in.Tensors, "b_scale", "b_packed")
				if err != nil {
					return err
				}
				o = o.Clone()
				m, n := o.Shape[0], o.Shape[1]
				for i := 0; i < m; i++ {
					for j := 0; j < n; j++ {
						if aNaN[i] || bNaN[j] {
							o.SetFloat64(i*n+j, math.NaN())
						}
					}
				}
				out["out"] = o
			}
			return nil
		},
		// K = 80: 5 scale columns padded to 8. The activation scales'
		// padding holds 0xFF, as an unzeroed buffer would.
		Trigger: &faults.Trigger{Case: smallCase("nvfp4_gemm", 16, 64, 80, map[string]string{"scale_layout": "swizzled_128x4"}),
			Shape: func(in kernel.Inputs) (kernel.Inputs, error) {
				sc := in.Tensors["a_scale"].Clone()
				rows, kSF := in.Tensors["a_packed"].Shape[0], in.Tensors["a_packed"].Shape[1]*2/nvfp4.BlockSize
				for off := range sc.Data {
					if m, k := nvfp4.SwizzledPosition(off, kSF); m < rows && k >= kSF {
						sc.Data[off] = 0xFF
					}
				}
				in.Tensors["a_scale"] = sc
				return in, nil
			}},
		Simulate: map[string]string{"scale-layout": "swizzled_128x4"},
		Signatures: []faults.Expect{
			{On: &faults.Trigger{Case: smallCase("nvfp4_quantize", 16, 0, 256, map[string]string{"scale_layout": "swizzled_128x4"})}, Tensor: "block_scale", Pattern: "padding", Coord: kernel.KindPadding},
			{Tensor: "out", Pattern: "non_finite", Why: "the garbage in the padding is NaN, summed into every output of the rows that read it"},
		},
	})
}

// paddingNaN reports, for each row of a swizzled operand, whether the
// padded scale columns its last K tile reads hold a NaN code. Rows beyond
// the operand are not reported (their outputs are discarded).
func paddingNaN(in map[string]*tensor.Tensor, scale, packed string) ([]bool, error) {
	pk, ok1 := in[packed]
	sc, ok2 := in[scale]
	if !ok1 || !ok2 || len(pk.Shape) != 2 {
		return nil, fmt.Errorf("tensors %s and %s are needed", packed, scale)
	}
	rows, kSF := pk.Shape[0], pk.Shape[1]*2/nvfp4.BlockSize
	mPad, kPad := nvfp4.PaddedShape(rows, kSF)
	if len(sc.Data) != mPad*kPad {
		return nil, fmt.Errorf("tensor %s holds %d bytes; swizzled [%d, %d] needs %d", scale, len(sc.Data), mPad, kPad, mPad*kPad)
	}
	bad := make([]bool, rows)
	for m := 0; m < rows; m++ {
		for k := kSF; k < kPad; k++ {
			bad[m] = bad[m] || isNaNE4M3(sc.Data[nvfp4.SwizzledOffset(m, k, kSF)])
		}
	}
	return bad, nil
}

// shardRatio is amax(dequantized B rows < N/2) / amax(rows >= N/2), the
// factor between the two shards' own global scales (the common global
// cancels).
func shardRatio(in kernel.Inputs) (float64, error) {
	pk, ok1 := in.Tensors["b_packed"]
	sc, ok2 := in.Tensors["b_scale"]
	if !ok1 || !ok2 || len(pk.Shape) != 2 {
		return 1, nil
	}
	n, k := pk.Shape[0], pk.Shape[1]*2
	kSF := k / nvfp4.BlockSize
	scales := sc.Data
	if in.Params.String("scale_layout", "linear") == "swizzled_128x4" {
		var err error
		if scales, err = nvfp4.Swizzled128x4.ToLinear(sc.Data, n, kSF); err != nil {
			return 1, fmt.Errorf("tensor b_scale: %v", err)
		}
	}
	if len(scales) < n*kSF {
		return 1, fmt.Errorf("tensor b_scale holds %d scales; [%d, %d] needs %d", len(scales), n, kSF, n*kSF)
	}
	var amax [2]float64
	for r := 0; r < n; r++ {
		h := 0
		if r >= n/2 {
			h = 1
		}
		for c := 0; c < k; c++ {
			v := math.Abs(nvfp4.CodeValue(nvfp4.CodeAt(pk.Data, r*k+c)) * nvfp4.ScaleValue(scales[r*kSF+c/nvfp4.BlockSize]))
			if v > amax[h] {
				amax[h] = v
			}
		}
	}
	if amax[0] == 0 || amax[1] == 0 {
		return 1, nil
	}
	return amax[0] / amax[1], nil
}

// subnormalScales sets row 0's block scales to the E4M3 subnormal 3·2^-9,
// as a small activation under a large global scale gets them: the
// signature cases of e4m3_subnormal_scale_flushed on the readers.
func subnormalScales(in kernel.Inputs) (kernel.Inputs, error) {
	for _, pair := range scaleOperands[:2] {
		sc, ok := in.Tensors[pair[0]]
		if !ok {
			continue
		}
		c := sc.Clone()
		for j := 0; j < sc.Shape[len(sc.Shape)-1]; j++ {
			c.Data[j] = 0x03
		}
		in.Tensors[pair[0]] = c
	}
	return in, nil
}
