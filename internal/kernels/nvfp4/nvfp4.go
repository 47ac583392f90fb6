// Package nvfp4 is nvfp4_quantize, nvfp4_dequantize and nvfp4_gemm (reference/CONTRACTS.md §3.1-§3.3): the contract, the validated
// problems (QuantizeProblem, DequantizeProblem, GEMMProblem) that the
// reference and the CUDA launchers take, the reference adapter over
// reference/nvfp4, the coordinates that name an output element, and what the
// tools ask of each kernel (cost, case inputs, slicing, contexts,
// roofline).
//
// The family is written in the framework's vocabulary, dot-imported: its
// code reads as it did inside internal/kernel, where it was born.
package nvfp4

import (
	"context"
	"fmt"
	. "github.com/kcheck-dev/kcheck/internal/kernel"

	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/nvfp4"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// nvfp4_quantize, nvfp4_dequantize and nvfp4_gemm (reference/CONTRACTS.md §3.1-§3.3): the
// contract tensors and parameters adapted to reference/nvfp4.

var (
	fp4ScaleDTypes  = []tensor.DType{tensor.F8E4M3, tensor.U8}
	fp4FloatOutputs = []tensor.DType{tensor.BF16, tensor.F16, tensor.F32}
	fp4Layouts      = nvfp4.Layouts
	fp4Kinds        = []string{"dequant", "quant"}
)

// quantize is nvfp4_quantize.
type quantize struct{ spec Spec }

// dequantize is nvfp4_dequantize.
type dequantize struct{ spec Spec }

// gemm is nvfp4_gemm.
type gemm struct{ spec Spec }

// quantizeKernel is nvfp4_quantize, which the generators of the other two
// quantize their inputs with.
var quantizeKernel *quantize

func init() {
	quantizeKernel = &quantize{Spec{
		Name:    "nvfp4_quantize",
		Stage:   StageQuant,
		Summary: "NVFP4 activation quantization (vLLM scaled_fp4_quant)",
		Inputs: []TensorSpec{
			{Name: "x", DTypes: []tensor.DType{tensor.BF16, tensor.F16}},
			{Name: "global_scale", DTypes: []tensor.DType{tensor.F32}},
		},
		Outputs: []TensorSpec{
			{Name: "packed", DTypes: []tensor.DType{tensor.U8}},
			{Name: "block_scale", DTypes: fp4ScaleDTypes},
		},
		Params: []ParamSpec{
			{Name: "scale_layout", Kind: ParamEnum, Default: "linear", Allowed: nvfp4.Layouts, Doc: "the block scales' layout: row-major, the 128x4 swizzle of the tensor-core GEMMs, or the 8x4 one of TensorRT-LLM's small-batch kernels (reference/CONTRACTS.md §5)"},
		},
	}}
	Register(quantizeKernel)
	Register(&dequantize{Spec{
		Name:    "nvfp4_dequantize",
		Stage:   StageQuant,
		Summary: "NVFP4 dequantization (E2M1 code x E4M3 block scale x global scale)",
		Inputs: []TensorSpec{
			{Name: "packed", DTypes: []tensor.DType{tensor.U8}},
			{Name: "block_scale", DTypes: fp4ScaleDTypes},
			{Name: "global_scale", DTypes: []tensor.DType{tensor.F32}},
		},
		Outputs: []TensorSpec{{Name: "out", DTypes: fp4FloatOutputs}},
		Params: []ParamSpec{
			{Name: "scale_layout", Kind: ParamEnum, Default: "linear", Allowed: nvfp4.Layouts, Doc: "the block scales' layout: row-major, the 128x4 swizzle of the tensor-core GEMMs, or the 8x4 one of TensorRT-LLM's small-batch kernels (reference/CONTRACTS.md §5)"},
			{Name: "global_scale_kind", Kind: ParamEnum, Default: "dequant", Allowed: []string{"dequant", "quant"}, Doc: "whether global_scale multiplies on dequantization or is its inverse (the quantizer's)"},
		},
	}})
	Register(&gemm{Spec{
		Name:    "nvfp4_gemm",
		Stage:   StageQuant,
		Summary: "NVFP4 W4A4 GEMM out = dequant(A) dequant(B)^T (the engines' NVFP4 linear layers)",
		Inputs: []TensorSpec{
			{Name: "a_packed", DTypes: []tensor.DType{tensor.U8}},
			{Name: "a_scale", DTypes: fp4ScaleDTypes},
			{Name: "a_global", DTypes: []tensor.DType{tensor.F32}},
			{Name: "b_packed", DTypes: []tensor.DType{tensor.U8}},
			{Name: "b_scale", DTypes: fp4ScaleDTypes},
			{Name: "b_global", DTypes: []tensor.DType{tensor.F32}},
		},
		Outputs: []TensorSpec{{Name: "out", DTypes: fp4FloatOutputs}},
		Params: []ParamSpec{
			{Name: "scale_layout", Kind: ParamEnum, Default: "linear", Allowed: nvfp4.Layouts, Doc: "the block scales' layout: row-major, the 128x4 swizzle of the tensor-core GEMMs, or the 8x4 one of TensorRT-LLM's small-batch kernels (reference/CONTRACTS.md §5)"},
			{Name: "a_global_kind", Kind: ParamEnum, Default: "dequant", Allowed: []string{"dequant", "quant"}, Doc: "a_global's direction (see nvfp4_dequantize's global_scale_kind)"},
			{Name: "b_global_kind", Kind: ParamEnum, Default: "dequant", Allowed: []string{"dequant", "quant"}, Doc: "b_global's direction"},
		},
	}})
}

// fp4Global reads a global scale tensor: F32 of shape [] or [1].
func fp4Global(in Inputs, name string) (float64, error) {
	t := in.Tensors[name]
	if err := t.Check(); err != nil {
		return 0, fmt.Errorf("tensor %s: %v", name, err)
	}
	if len(t.Shape) > 1 || t.Len() != 1 {
		return 0, fmt.Errorf("tensor %s has shape %v; the contract wants [] or [1]", name, t.Shape)
	}
	return t.Float64At(0), nil
}

// fp4Packed reads packed E2M1 codes, U8 [rows, K/2], and returns rows and K.
func fp4Packed(in Inputs, name string) (*tensor.Tensor, int, int, error) {
	t := in.Tensors[name]
	if err := t.Check(); err != nil {
		return nil, 0, 0, fmt.Errorf("tensor %s: %v", name, err)
	}
	if len(t.Shape) != 2 {
		return nil, 0, 0, fmt.Errorf("tensor %s has shape %v; the contract wants [rows, K/2]", name, t.Shape)
	}
	rows, k := t.Shape[0], 2*t.Shape[1]
	if k%nvfp4.BlockSize != 0 {
		return nil, 0, 0, fmt.Errorf("tensor %s has K = %d, not a multiple of %d", name, k, nvfp4.BlockSize)
	}
	return t, rows, k, nil
}

// fp4Scales reads a block scale tensor of rows x kSF scales in layout lay
// and returns the scale codes in linear order. of names the tensor whose
// shape fixes rows and K, for the error message.
func fp4Scales(in Inputs, name string, rows, kSF int, lay nvfp4.Layout, of string) ([]uint8, error) {
	t := in.Tensors[name]
	if err := t.Check(); err != nil {
		return nil, fmt.Errorf("tensor %s: %v", name, err)
	}
	if lay == nvfp4.Linear {
		if !lay.Fits(t.Shape, rows, kSF) {
			return nil, fmt.Errorf("tensor %s has shape %v; with scale_layout = linear and %s it must be [%d, %d]",
				name, t.Shape, of, rows, kSF)
		}
		return t.Data, nil
	}
	mPad, kPad := lay.PaddedShape(rows, kSF)
	if !lay.Fits(t.Shape, rows, kSF) {
		return nil, fmt.Errorf("tensor %s has shape %v; with scale_layout = %s and %s it must be [%d, %d] or [%d] (rows padded to %d, scale columns to 4)",
			name, t.Shape, lay, of, mPad, kPad, mPad*kPad, lay.TileRows())
	}
	return lay.ToLinear(t.Data, rows, kSF)
}

func fp4Layout(p Params) (nvfp4.Layout, error) {
	s, err := p.Enum("scale_layout", "linear", fp4Layouts...)
	if err != nil {
		return nvfp4.Linear, err
	}
	return nvfp4.ParseLayout(s)
}

func fp4Kind(p Params, name string) (nvfp4.GlobalKind, error) {
	s, err := p.Enum(name, "dequant", fp4Kinds...)
	if err != nil {
		return nvfp4.Dequant, err
	}
	return nvfp4.ParseGlobalKind(s)
}

// fp4OutDType returns the dtype of a float output (default def), or an
// error naming the output when the contract does not allow it.
func fp4OutDType(outDTypes map[string]tensor.DType, name string, def tensor.DType, allowed []tensor.DType) (tensor.DType, error) {
	d, ok := outDTypes[name]
	if !ok {
		return def, nil
	}
	for _, a := range allowed {
		if d == a {
			return d, nil
		}
	}
	return d, fmt.Errorf("output %s has dtype %s; the contract wants %v", name, d, allowed)
}

// fp4Matrix reads one operand: packed codes, scales and global scale.
func fp4Matrix(in Inputs, packed, scale, global string, lay nvfp4.Layout, kind nvfp4.GlobalKind) (*nvfp4.Matrix, error) {
	pt, rows, k, err := fp4Packed(in, packed)
	if err != nil {
		return nil, err
	}
	sc, err := fp4Scales(in, scale, rows, k/nvfp4.BlockSize, lay, fmt.Sprintf("%s %v (K = %d)", packed, pt.Shape, k))
	if err != nil {
		return nil, err
	}
	g, err := fp4Global(in, global)
	if err != nil {
		return nil, err
	}
	return &nvfp4.Matrix{Rows: rows, K: k, Packed: pt.Data, Scales: sc, Global: g, Kind: kind}, nil
}

// fp4ElementCoords names an element of a [rows, K] tensor: its 16-element
// block, its 128-row tile (one tile of swizzled scales) and the nibble it
// was packed in (0 low, 1 high: a swapped packing errs on every parity).
func fp4ElementCoords(rowAxis, colAxis CoordKind) Coords {
	return Coords{Axes: []CoordKind{rowAxis, colAxis}, Derived: func(dst []Coord, idx []int) []Coord {
		if len(idx) != 2 {
			return dst
		}
		return append(dst, Coord{Kind: KindScaleBlock, Value: idx[1] / nvfp4.BlockSize}, Coord{Kind: KindTile128, Value: idx[0] / nvfp4.TileRows}, Coord{Kind: KindNibble, Value: idx[1] % 2})
	}}
}

// Spec implements Kernel.
func (k *quantize) Spec() *Spec { return &k.spec }

// Spec implements Kernel.
func (k *dequantize) Spec() *Spec { return &k.spec }

// Spec implements Kernel.
func (k *gemm) Spec() *Spec { return &k.spec }

// Operand is one validated NVFP4 matrix: its contract tensors as given
// (the launchers upload them as they are, swizzled scales included) and the
// matrix the reference reads (scales in linear order).
type Operand struct {
	// Packed is U8 [rows, K/2]; Scale F8_E4M3 or U8 in the scale layout;
	// Global F32 [] or [1].
	Packed, Scale, Global *tensor.Tensor
	// Matrix holds Rows, K, the linear scale codes, the global scale and
	// its direction.
	Matrix *nvfp4.Matrix
}

// QuantizeProblem is a validated nvfp4_quantize: x [M, K] (K a multiple
// of 16), its global scale, and the layout the block scales are written in.
type QuantizeProblem struct {
	in Inputs
	// X is BF16 or F16 [M, K]; Global is F32 [] or [1].
	X, Global   *tensor.Tensor
	M, K        int
	GlobalScale float64
	Layout      nvfp4.Layout
}

// Inputs implements Problem.
func (p *QuantizeProblem) Inputs() Inputs { return p.in }

// DequantizeProblem is a validated nvfp4_dequantize: one operand.
type DequantizeProblem struct {
	in     Inputs
	A      Operand
	Layout nvfp4.Layout
}

// Inputs implements Problem.
func (p *DequantizeProblem) Inputs() Inputs { return p.in }

// GEMMProblem is a validated nvfp4_gemm: A [M, K] and B [N, K], one scale
// layout for both.
type GEMMProblem struct {
	in      Inputs
	A, B    Operand
	M, N, K int
	Layout  nvfp4.Layout
}

// Inputs implements Problem.
func (p *GEMMProblem) Inputs() Inputs { return p.in }

// operand validates one operand: packed codes, scales and global scale.
func operand(in Inputs, packed, scale, global string, lay nvfp4.Layout, kind nvfp4.GlobalKind) (Operand, error) {
	m, err := fp4Matrix(in, packed, scale, global, lay, kind)
	if err != nil {
		return Operand{}, err
	}
	return Operand{Packed: in.Tensors[packed], Scale: in.Tensors[scale], Global: in.Tensors[global], Matrix: m}, nil
}

// Validate implements Kernel.
func (*quantize) Validate(in Inputs) (Problem, error) {
	x := in.Tensors["x"]
	if err := x.Check(); err != nil {
		return nil, fmt.Errorf("tensor x: %v", err)
	}
	if len(x.Shape) != 2 {
		return nil, fmt.Errorf("tensor x has shape %v; the contract wants [M, K]", x.Shape)
	}
	m, k := x.Shape[0], x.Shape[1]
	if k%nvfp4.BlockSize != 0 {
		return nil, fmt.Errorf("tensor x has K = %d, not a multiple of %d", k, nvfp4.BlockSize)
	}
	gs, err := fp4Global(in, "global_scale")
	if err != nil {
		return nil, err
	}
	lay, err := fp4Layout(in.Params)
	if err != nil {
		return nil, err
	}
	return &QuantizeProblem{in: in, X: x, Global: in.Tensors["global_scale"], M: m, K: k, GlobalScale: gs, Layout: lay}, nil
}

// Validate implements Kernel.
func (*dequantize) Validate(in Inputs) (Problem, error) {
	lay, err := fp4Layout(in.Params)
	if err != nil {
		return nil, err
	}
	kind, err := fp4Kind(in.Params, "global_scale_kind")
	if err != nil {
		return nil, err
	}
	a, err := operand(in, "packed", "block_scale", "global_scale", lay, kind)
	if err != nil {
		return nil, err
	}
	return &DequantizeProblem{in: in, A: a, Layout: lay}, nil
}

// Validate implements Kernel.
func (*gemm) Validate(in Inputs) (Problem, error) {
	lay, err := fp4Layout(in.Params)
	if err != nil {
		return nil, err
	}
	ak, err := fp4Kind(in.Params, "a_global_kind")
	if err != nil {
		return nil, err
	}
	bk, err := fp4Kind(in.Params, "b_global_kind")
	if err != nil {
		return nil, err
	}
	a, err := operand(in, "a_packed", "a_scale", "a_global", lay, ak)
	if err != nil {
		return nil, err
	}
	b, err := operand(in, "b_packed", "b_scale", "b_global", lay, bk)
	if err != nil {
		return nil, err
	}
	if a.Matrix.K != b.Matrix.K {
		return nil, fmt.Errorf("tensor a_packed has K = %d but b_packed has K = %d", a.Matrix.K, b.Matrix.K)
	}
	return &GEMMProblem{in: in, A: a, B: b, M: a.Matrix.Rows, N: b.Matrix.Rows, K: a.Matrix.K, Layout: lay}, nil
}

// Reference implements Kernel. The output dtypes are checked here, after
// the inputs: only the call knows them.
func (*quantize) Reference(ctx context.Context, pr Problem, prec Precision, outDTypes OutDTypes) ([]Output, error) {
	p := pr.(*QuantizeProblem)
	x, m, k, gs, lay := p.X, p.M, p.K, p.GlobalScale, p.Layout
	if d, ok := outDTypes["packed"]; ok && d != tensor.U8 {
		return nil, fmt.Errorf("output packed has dtype %s; the contract wants U8", d)
	}
	scaleDType, err := fp4OutDType(outDTypes, "block_scale", tensor.F8E4M3, fp4ScaleDTypes)
	if err != nil {
		return nil, err
	}
	xs := x.Float64s()
	exact, err := nvfp4.Quantize(ctx, xs, m, k, gs)
	if err != nil {
		return nil, err
	}
	expected, err := nvfp4.QuantizeExpected(ctx, xs, m, k, gs)
	if err != nil {
		return nil, err
	}
	eq := newFP4CodeJudge(xs, gs, exact, expected)

	exactPacked, expPacked := exact.Packed(), expected.Packed()
	packed := Output{
		Name: "packed", Shape: []int{m, k / 2}, DType: tensor.U8, Mode: Bitwise,
		Exact: Bytes(exactPacked), Expected: Bytes(expPacked),
		Equivalent: func(i int, actual float64) bool {
			b, ok := byteOf(actual)
			return ok && eq.ok(2*i, b&0xF) && eq.ok(2*i+1, b>>4)
		},
		Reduction: 1,
		Coords: Coords{Axes: []CoordKind{KindRow, KindByte}, Derived: func(dst []Coord, idx []int) []Coord {
			if len(idx) != 2 {
				return dst
			}
			return append(dst, Coord{Kind: KindCol, Value: 2 * idx[1]}, Coord{Kind: KindScaleBlock, Value: idx[1] / (nvfp4.BlockSize / 2)}, Coord{Kind: KindTile128, Value: idx[0] / nvfp4.TileRows})
		}},
	}
	scale, err := fp4ScaleOutput(exact, expected, m, k/nvfp4.BlockSize, lay, scaleDType)
	if err != nil {
		return nil, err
	}
	return []Output{packed, scale}, nil
}

// fp4CodeJudge decides whether a kernel's E2M1 code for element i is
// correct. Beyond the exact reference's own tie classification it accepts
// the codes derived from the other correct block scale where the block's
// scale lies at a tie: a kernel that rounded the scale the other way then
// quantized with its own scale, and its codes must be judged against that
// scale (re-derived here, block by block, from x). The judge cannot see the
// kernel's scale, so it accepts codes consistent with either correct scale.
type fp4CodeJudge struct {
	exact, expected *nvfp4.Quantized
	// alt holds, for blocks whose scale is a tie, the codes and
	// pre-rounding values under the other scale.
	alt map[int]*fp4AltBlock
}

type fp4AltBlock struct {
	codes [nvfp4.BlockSize]uint8
	in    [nvfp4.BlockSize]float64
}

func newFP4CodeJudge(x []float64, gs float64, exact, expected *nvfp4.Quantized) *fp4CodeJudge {
	j := &fp4CodeJudge{exact: exact, expected: expected, alt: map[int]*fp4AltBlock{}}
	for b := range exact.Scales {
		alt, ok := exact.ScaleAlternative(b)
		if !ok {
			continue
		}
		ab := &fp4AltBlock{}
		nvfp4.QuantizeBlock(x[b*nvfp4.BlockSize:(b+1)*nvfp4.BlockSize], gs, alt, ab.codes[:], ab.in[:])
		j.alt[b] = ab
	}
	return j
}

func (j *fp4CodeJudge) ok(i int, code uint8) bool {
	if nvfp4.CodeValue(code) == nvfp4.CodeValue(j.expected.Codes[i]) || j.exact.CodeEquivalent(i, code) {
		return true
	}
	ab := j.alt[i/nvfp4.BlockSize]
	if ab == nil {
		return false
	}
	e := i % nvfp4.BlockSize
	return nvfp4.CodeValue(code) == nvfp4.CodeValue(ab.codes[e]) || nvfp4.CodeTieEquivalent(ab.in[e], ab.codes[e], code)
}

// laidOut is linear [rows, kSF] block scale codes in layout lay, and the
// shape the block_scale tensor has in it (padded for a swizzle).
func laidOut(linear []uint8, rows, kSF int, lay nvfp4.Layout) ([]uint8, []int, error) {
	if lay == nvfp4.Linear {
		return linear, []int{rows, kSF}, nil
	}
	codes, err := lay.FromLinear(linear, rows, kSF)
	if err != nil {
		return nil, nil, err
	}
	mPad, kPad := lay.PaddedShape(rows, kSF)
	return codes, []int{mPad, kPad}, nil
}

// fp4ScaleOutput is the block_scale output in its layout and dtype. Values
// are the E4M3 values for F8_E4M3 and the raw codes for U8. Swizzled
// padding must be zero (reference/CONTRACTS.md §5; -0 is accepted): a GEMM whose last K tile
// spans the padded columns reads it (Equivalent below).
func fp4ScaleOutput(exact, expected *nvfp4.Quantized, rows, kSF int, lay nvfp4.Layout, d tensor.DType) (Output, error) {
	exCodes, shape, err := laidOut(exact.Scales, rows, kSF, lay)
	if err != nil {
		return Output{}, err
	}
	expCodes, _, err := laidOut(expected.Scales, rows, kSF, lay)
	if err != nil {
		return Output{}, err
	}
	pos := func(i int) (m, k int) { return i / kSF, i % kSF }
	coords := Coords{Axes: []CoordKind{KindRow, KindScaleBlock}, Derived: func(dst []Coord, idx []int) []Coord {
		if len(idx) != 2 {
			return dst
		}
		return append(dst, Coord{Kind: KindTile128, Value: idx[0] / nvfp4.TileRows})
	}}
	if lay != nvfp4.Linear {
		kPad := shape[1]
		pos = func(i int) (m, k int) { return lay.Position(i, kSF) }
		coords = Coords{Axes: []CoordKind{KindScaleRow, KindScaleCol}, Derived: func(dst []Coord, idx []int) []Coord {
			off := 0
			switch len(idx) {
			case 1: // stored flat [M_pad*K_pad]
				off = idx[0]
			case 2:
				off = idx[0]*kPad + idx[1]
			default:
				return dst
			}
			m, k := lay.Position(off, kSF)
			pad := 0
			if m >= rows || k >= kSF {
				pad = 1
			}
			return append(dst, Coord{Kind: KindRow, Value: m}, Coord{Kind: KindScaleBlock, Value: k}, Coord{Kind: KindTile128, Value: m / nvfp4.TileRows}, Coord{Kind: KindPadding, Value: pad})
		}}
	}
	decode := func(c uint8) float64 {
		if d == tensor.U8 {
			return float64(c)
		}
		return formats.E4M3FN.Decode(c)
	}
	ex, exp := make([]float64, len(exCodes)), make([]float64, len(expCodes))
	for i := range exCodes {
		ex[i], exp[i] = decode(exCodes[i]), decode(expCodes[i])
	}
	return Output{
		Name: "block_scale", Shape: shape, DType: d, Mode: Bitwise, Exact: Dense(ex), Expected: Dense(exp),
		Equivalent: func(i int, actual float64) bool {
			m, k := pos(i)
			if m >= rows || k >= kSF {
				// Padding must be zero (reference/CONTRACTS.md §5): a GEMM that reads a
				// padded tile multiplies by whatever is there, and an
				// uninitialised buffer is a real bug. Expected holds 0 here,
				// so only a zero of another spelling (-0 as E4M3 0x80) is
				// excused.
				return actual == 0
			}
			var code uint8
			if d == tensor.U8 {
				b, ok := byteOf(actual)
				if !ok {
					return false
				}
				code = b
			} else {
				code, _ = formats.E4M3FN.Encode(actual, formats.Saturate)
			}
			b := m*kSF + k
			return code == expected.Scales[b] || exact.ScaleEquivalent(b, code)
		},
		Reduction: 1, Coords: coords,
	}, nil
}

// Reference implements Kernel.
func (*dequantize) Reference(ctx context.Context, pr Problem, prec Precision, outDTypes OutDTypes) ([]Output, error) {
	p := pr.(*DequantizeProblem)
	od, err := fp4OutDType(outDTypes, "out", tensor.BF16, fp4FloatOutputs)
	if err != nil {
		return nil, err
	}
	a := p.A.Matrix
	exact, err := nvfp4.ExactTable(a)
	if err != nil {
		return nil, err
	}
	expected, err := nvfp4.ExpectedTable(a, od)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return []Output{{
		Name: "out", Shape: []int{a.Rows, a.K}, DType: od, Exact: codeValues{a, exact}, Expected: codeValues{a, expected},
		Mode: Numeric, Reduction: 1, Coords: fp4ElementCoords(KindRow, KindCol),
	}}, nil
}

// Reference implements Kernel.
func (*gemm) Reference(ctx context.Context, pr Problem, prec Precision, outDTypes OutDTypes) ([]Output, error) {
	p := pr.(*GEMMProblem)
	od, err := fp4OutDType(outDTypes, "out", tensor.BF16, fp4FloatOutputs)
	if err != nil {
		return nil, err
	}
	a, b := p.A.Matrix, p.B.Matrix
	exact, expected, err := nvfp4.GEMM(ctx, a, b, od)
	if err != nil {
		return nil, err
	}
	if prec.Acc == tensor.F64 { // a kernel declaring float64 accumulation
		for i, v := range exact {
			expected[i] = nvfp4.RoundTo(od, v)
		}
	}
	return []Output{{
		Name: "out", Shape: []int{a.Rows, b.Rows}, DType: od, Exact: Dense(exact), Expected: Dense(expected),
		Mode: Numeric, Reduction: a.K,
		Coords: Coords{Axes: []CoordKind{KindRow, KindCol}, Derived: func(dst []Coord, idx []int) []Coord {
			if len(idx) != 2 {
				return dst
			}
			return append(dst, Coord{Kind: KindTile128, Value: idx[0] / nvfp4.TileRows}, Coord{Kind: KindColTile128, Value: idx[1] / nvfp4.TileRows})
		}},
	}}, nil
}

// byteOf converts an actual U8 element back to its byte.
func byteOf(v float64) (uint8, bool) {
	if v < 0 || v > 255 || v != float64(int(v)) {
		return 0, false
	}
	return uint8(v), true
}

// codeValues is a dequantized matrix's values read on demand, each looked
// up by its scale and element codes (nvfp4.CodeTable): a weight-sized
// output holds no float64 per element, and a read costs a lookup.
type codeValues struct {
	a *nvfp4.Matrix
	t *nvfp4.CodeTable
}

// Len implements Values.
func (v codeValues) Len() int { return v.a.Rows * v.a.K }

// At implements Values.
func (v codeValues) At(i int) float64 {
	var d [1]float64
	v.t.Values(v.a, i, d[:])
	return d[0]
}

// ReadBlock implements BlockReader.
func (v codeValues) ReadBlock(lo int, dst []float64) { v.t.Values(v.a, lo, dst) }

// Fork implements Forker: codeValues holds no state.
func (v codeValues) Fork() Values { return v }
