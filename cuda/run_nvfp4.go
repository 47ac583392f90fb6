//go:build cuda || cudaemu

package cuda

import (
	"strings"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	fp4kernel "github.com/kcheck-dev/kcheck/internal/kernels/nvfp4"
	"github.com/kcheck-dev/kcheck/reference/nvfp4"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

func init() {
	runners["nvfp4_quantize"] = runNVFP4Quantize
	runners["nvfp4_dequantize"] = runNVFP4Dequantize
	runners["nvfp4_gemm"] = runNVFP4GEMM
}

// padded128x4 is the swizzled scale shape for rows x kSF scales (reference/CONTRACTS.md §5).
func padded128x4(rows, kSF int) (int, int) { return ceilDiv(rows, 128) * 128, ceilDiv(kSF, 4) * 4 }

// fp4Layout refuses the 8x4 scale layout as unsupported (not a bad
// input), before any validation: kcheck's kernels write and read the
// linear and 128x4 layouts only.
func fp4Layout(p kernel.Params) error {
	if p.String("scale_layout", "linear") == "swizzled_8x4" {
		return unsupported("scale_layout = swizzled_8x4: kcheck's CUDA NVFP4 kernels write and read linear or swizzled_128x4 scales")
	}
	return nil
}

// nonEmpty refuses an operand of no row or no column: the kernels' grids
// are sized by them.
func nonEmpty(name string, t *tensor.Tensor, rows, k int) error {
	if k == 0 || rows == 0 {
		return inputErr("tensor %s has shape %v: K = %d must be a positive multiple of 16 and rows positive", name, t.Shape, k)
	}
	return nil
}

func runNVFP4Quantize(d *Device, in kernel.Inputs, opt RunOptions) (*Result, error) {
	if err := fp4Layout(in.Params); err != nil {
		return nil, err
	}
	pr, err := validate("nvfp4_quantize", in)
	if err != nil {
		return nil, err
	}
	qp := pr.(*fp4kernel.QuantizeProblem)
	x, m, k := qp.X, qp.M, qp.K
	if m == 0 || k == 0 {
		return nil, inputErr("tensor x has shape %v; the contract wants [M, K] with K a positive multiple of 16", x.Shape)
	}
	swz := qp.Layout == nvfp4.Swizzled128x4
	sfType, err := outDType(opt, "block_scale", tensor.F8E4M3, tensor.F8E4M3, tensor.U8)
	if err != nil {
		return nil, err
	}
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
	dgs := bufs.upload(qp.Global.Data)
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
		args: args{uint64(dx), uint64(dgs), uint64(dp), uint64(dsf), i32(m), i32(k), i32(swzArg)}}}
	return d.finish(&bufs, mod, plan, opt, []outBuf{
		{"packed", dp, tensor.U8, []int{m, k / 2}},
		{"block_scale", dsf, sfType, sfShape},
	})
}

func runNVFP4Dequantize(d *Device, in kernel.Inputs, opt RunOptions) (*Result, error) {
	if err := fp4Layout(in.Params); err != nil {
		return nil, err
	}
	pr, err := validate("nvfp4_dequantize", in)
	if err != nil {
		return nil, err
	}
	dp := pr.(*fp4kernel.DequantizeProblem)
	a := dp.A
	m, k := a.Matrix.Rows, a.Matrix.K
	if err := nonEmpty("packed", a.Packed, m, k); err != nil {
		return nil, err
	}
	swz, quant := dp.Layout == nvfp4.Swizzled128x4, a.Matrix.Kind == nvfp4.Quant
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
	// The scales go up as stored: the kernel reads the swizzled layout
	// itself.
	dpk := bufs.upload(a.Packed.Data)
	dsf := bufs.upload(a.Scale.Data)
	dgs := bufs.upload(a.Global.Data)
	dout := bufs.alloc(int64(m * k * od.Size()))
	plan := []launch{{mod: mod, fn: fn, grid: [3]int{d.gridFor(m*k/16, 256), 1, 1}, block: 256,
		args: args{uint64(dpk), uint64(dsf), uint64(dgs), uint64(dout), i32(m), i32(k), i32(b2i(swz)), i32(b2i(quant))}}}
	return d.finish(&bufs, mod, plan, opt, []outBuf{{"out", dout, od, []int{m, k}}})
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func runNVFP4GEMM(d *Device, in kernel.Inputs, opt RunOptions) (*Result, error) {
	if err := fp4Layout(in.Params); err != nil {
		return nil, err
	}
	pr, err := validate("nvfp4_gemm", in)
	if err != nil {
		return nil, err
	}
	gp := pr.(*fp4kernel.GEMMProblem)
	m, n, k := gp.M, gp.N, gp.K
	if err := nonEmpty("a_packed", gp.A.Packed, m, k); err != nil {
		return nil, err
	}
	if err := nonEmpty("b_packed", gp.B.Packed, n, k); err != nil {
		return nil, err
	}
	swz := gp.Layout == nvfp4.Swizzled128x4
	aq, bq := gp.A.Matrix.Kind == nvfp4.Quant, gp.B.Matrix.Kind == nvfp4.Quant
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
	for i, b := range [][]byte{gp.A.Packed.Data, gp.A.Scale.Data, gp.A.Global.Data, gp.B.Packed.Data, gp.B.Scale.Data, gp.B.Global.Data} {
		p := bufs.upload(b)
		ptr[i] = uint64(p)
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
		args: args{ptr[0], ptr[1], ptr[2], ptr[3], ptr[4], ptr[5], uint64(dout), i32(m), i32(n), i32(k),
			i32(b2i(swz)), i32(b2i(aq)), i32(b2i(bq))}}}
	res, err := d.finish(&bufs, mod, plan, opt, []outBuf{{"out", dout, tensor.BF16, []int{m, n}}})
	if err != nil {
		return nil, err
	}
	res.Meta["kcheck.cuda.gemm_path"] = map[int]string{1: "bf16_mma_sync", 2: "fp4_block_scale_mma"}[path]
	return res, nil
}
