//go:build cuda || cudaemu

package cuda

import (
	"strings"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

func init() {
	runners["nvfp4_quantize"] = runNVFP4Quantize
	runners["nvfp4_dequantize"] = runNVFP4Dequantize
	runners["nvfp4_gemm"] = runNVFP4GEMM
}

// padded128x4 is the swizzled scale shape for rows x kSF scales (reference/CONTRACTS.md §5).
func padded128x4(rows, kSF int) (int, int) { return ceilDiv(rows, 128) * 128, ceilDiv(kSF, 4) * 4 }

// fp4Layout reads scale_layout; kcheck's kernels write and read the linear
// and 128x4 layouts only, so the 8x4 one is unsupported (not a bad input).
func fp4Layout(p kernel.Params) (swizzled bool, err error) {
	if p.String("scale_layout", "linear") == "swizzled_8x4" {
		return false, unsupported("scale_layout = swizzled_8x4: kcheck's CUDA NVFP4 kernels write and read linear or swizzled_128x4 scales")
	}
	s, err := p.Enum("scale_layout", "linear", "linear", "swizzled_128x4")
	return s == "swizzled_128x4", asInput(err)
}

func fp4Kind(p kernel.Params, name string) (quant bool, err error) {
	s, err := p.Enum(name, "dequant", "dequant", "quant")
	return s == "quant", asInput(err)
}

// fp4Packed checks a packed FP4 tensor [rows, K/2] and returns rows and K.
func fp4Packed(in kernel.Inputs, name string) (*tensor.Tensor, int, int, error) {
	t, err := kernel.Need(in, name, tensor.U8)
	if err != nil {
		return nil, 0, 0, asInput(err)
	}
	if len(t.Shape) != 2 {
		return nil, 0, 0, inputErr("tensor %s has shape %v; the contract wants [rows, K/2]", name, t.Shape)
	}
	rows, k := t.Shape[0], 2*t.Shape[1]
	if k%16 != 0 || k == 0 || rows == 0 {
		return nil, 0, 0, inputErr("tensor %s has shape %v: K = %d must be a positive multiple of 16 and rows positive", name, t.Shape, k)
	}
	return t, rows, k, nil
}

// fp4Scales checks a block-scale tensor for rows x K and returns its bytes.
func fp4Scales(in kernel.Inputs, name string, rows, k int, swizzled bool) ([]byte, error) {
	t, err := kernel.Need(in, name, tensor.F8E4M3, tensor.U8)
	if err != nil {
		return nil, asInput(err)
	}
	kSF := k / 16
	if !swizzled {
		if len(t.Shape) != 2 || t.Shape[0] != rows || t.Shape[1] != kSF {
			return nil, inputErr("tensor %s has shape %v; with scale_layout = linear it must be [%d, %d]", name, t.Shape, rows, kSF)
		}
		return t.Data, nil
	}
	mp, kp := padded128x4(rows, kSF)
	if !(len(t.Shape) == 2 && t.Shape[0] == mp && t.Shape[1] == kp || len(t.Shape) == 1 && t.Shape[0] == mp*kp) {
		return nil, inputErr("tensor %s has shape %v; with scale_layout = swizzled_128x4 it must be [%d, %d] or [%d]", name, t.Shape, mp, kp, mp*kp)
	}
	return t.Data, nil
}

func runNVFP4Quantize(d *Device, in kernel.Inputs, opt RunOptions) (*Result, error) {
	x, err := kernel.Need(in, "x", tensor.BF16, tensor.F16)
	if err != nil {
		return nil, asInput(err)
	}
	if len(x.Shape) != 2 || x.Shape[1]%16 != 0 || x.Shape[0] == 0 || x.Shape[1] == 0 {
		return nil, inputErr("tensor x has shape %v; the contract wants [M, K] with K a positive multiple of 16", x.Shape)
	}
	_, gsBytes, err := scalarF32(in, "global_scale")
	if err != nil {
		return nil, err
	}
	swz, err := fp4Layout(in.Params)
	if err != nil {
		return nil, err
	}
	sfType, err := outDType(opt, "block_scale", tensor.F8E4M3, tensor.F8E4M3, tensor.U8)
	if err != nil {
		return nil, err
	}
	m, k := x.Shape[0], x.Shape[1]
	sfShape := []int{m, k / 16}
	if swz {
		mp, kp := padded128x4(m, k/16)
		sfShape = []int{mp, kp}
	}
	mod, err := d.load("nvfp4")
	if err != nil {
		return nil, err
	}
	var bufs buffers
	defer bufs.free()
	dx := bufs.upload(x.Data)
	dgs := bufs.upload(gsBytes)
	dp := bufs.zeros(int64(m * k / 2))
	// Zeroed first: the swizzled layout's padding must read 0 (reference/CONTRACTS.md §5).
	dsf := bufs.zeros(int64(tensor.NumElements(sfShape)))
	fn := "nvfp4_quantize_bf16"
	if x.DType == tensor.F16 {
		fn = "nvfp4_quantize_f16"
	}
	swzArg := 0
	if swz {
		swzArg = 1
	}
	plan := []launch{{mod: mod, fn: fn, grid: [3]int{d.gridFor(m*k/8, 256), 1, 1}, block: 256,
		args: args{ptrArg(dx), ptrArg(dgs), ptrArg(dp), ptrArg(dsf), i32(m), i32(k), i32(swzArg)}}}
	return d.finish(&bufs, mod, plan, opt, []outBuf{
		{"packed", dp, tensor.U8, []int{m, k / 2}},
		{"block_scale", dsf, sfType, sfShape},
	})
}

func runNVFP4Dequantize(d *Device, in kernel.Inputs, opt RunOptions) (*Result, error) {
	swz, err := fp4Layout(in.Params)
	if err != nil {
		return nil, err
	}
	quant, err := fp4Kind(in.Params, "global_scale_kind")
	if err != nil {
		return nil, err
	}
	p, m, k, err := fp4Packed(in, "packed")
	if err != nil {
		return nil, err
	}
	sf, err := fp4Scales(in, "block_scale", m, k, swz)
	if err != nil {
		return nil, err
	}
	_, gsBytes, err := scalarF32(in, "global_scale")
	if err != nil {
		return nil, err
	}
	od, err := outDType(opt, "out", tensor.BF16, tensor.BF16, tensor.F16, tensor.F32)
	if err != nil {
		return nil, err
	}
	fn := map[tensor.DType]string{tensor.BF16: "nvfp4_dequantize_bf16", tensor.F16: "nvfp4_dequantize_f16", tensor.F32: "nvfp4_dequantize_f32"}[od]
	mod, err := d.load("nvfp4")
	if err != nil {
		return nil, err
	}
	var bufs buffers
	defer bufs.free()
	dp := bufs.upload(p.Data)
	dsf := bufs.upload(sf)
	dgs := bufs.upload(gsBytes)
	dout := bufs.alloc(int64(m * k * od.Size()))
	plan := []launch{{mod: mod, fn: fn, grid: [3]int{d.gridFor(m*k/16, 256), 1, 1}, block: 256,
		args: args{ptrArg(dp), ptrArg(dsf), ptrArg(dgs), ptrArg(dout), i32(m), i32(k), i32(b2i(swz)), i32(b2i(quant))}}}
	return d.finish(&bufs, mod, plan, opt, []outBuf{{"out", dout, od, []int{m, k}}})
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func runNVFP4GEMM(d *Device, in kernel.Inputs, opt RunOptions) (*Result, error) {
	swz, err := fp4Layout(in.Params)
	if err != nil {
		return nil, err
	}
	aq, err := fp4Kind(in.Params, "a_global_kind")
	if err != nil {
		return nil, err
	}
	bq, err := fp4Kind(in.Params, "b_global_kind")
	if err != nil {
		return nil, err
	}
	ap, m, k, err := fp4Packed(in, "a_packed")
	if err != nil {
		return nil, err
	}
	bp, n, kb, err := fp4Packed(in, "b_packed")
	if err != nil {
		return nil, err
	}
	if k != kb {
		return nil, inputErr("tensor a_packed has K = %d but b_packed has K = %d", k, kb)
	}
	asf, err := fp4Scales(in, "a_scale", m, k, swz)
	if err != nil {
		return nil, err
	}
	bsf, err := fp4Scales(in, "b_scale", n, k, swz)
	if err != nil {
		return nil, err
	}
	_, ag, err := scalarF32(in, "a_global")
	if err != nil {
		return nil, err
	}
	_, bg, err := scalarF32(in, "b_global")
	if err != nil {
		return nil, err
	}
	if _, err := outDType(opt, "out", tensor.BF16, tensor.BF16); err != nil {
		return nil, err
	}
	mod, err := d.load("nvfp4")
	if err != nil {
		return nil, err
	}
	// Which MMA the module was built with (1: bf16 mma.sync, 2: FP4
	// block-scale); a module without the marker is the compute_80 build.
	path, err := mod.globalInt("nvfp4_gemm_path")
	if err != nil {
		path = 1
		if strings.Contains(mod.file, ".sm_12") && strings.HasSuffix(mod.file, "a.cubin") {
			path = 2
		}
	}
	var bufs buffers
	defer bufs.free()
	var ptr [6]uint64
	for i, b := range [][]byte{ap.Data, asf, ag, bp.Data, bsf, bg} {
		p := bufs.upload(b)
		ptr[i] = ptrArg(p)
	}
	dout := bufs.alloc(int64(m * n * 2))
	// Tile by M: prefill-sized, medium, decode-sized (a handful of tokens).
	fn, bm, bn, threads := "nvfp4_gemm_128x128", 128, 128, 256
	switch {
	case m <= 16:
		fn, bm, bn, threads = "nvfp4_gemm_16x64", 16, 64, 128
	case m <= 64:
		fn, bm, bn, threads = "nvfp4_gemm_64x128", 64, 128, 256
	}
	plan := []launch{{mod: mod, fn: fn, grid: [3]int{ceilDiv(n, bn), ceilDiv(m, bm), 1}, block: threads,
		args: args{ptr[0], ptr[1], ptr[2], ptr[3], ptr[4], ptr[5], ptrArg(dout), i32(m), i32(n), i32(k),
			i32(b2i(swz)), i32(b2i(aq)), i32(b2i(bq))}}}
	res, err := d.finish(&bufs, mod, plan, opt, []outBuf{{"out", dout, tensor.BF16, []int{m, n}}})
	if err != nil {
		return nil, err
	}
	res.Meta["kcheck.cuda.gemm_path"] = map[int]string{1: "bf16_mma_sync", 2: "fp4_block_scale_mma"}[path]
	return res, nil
}
