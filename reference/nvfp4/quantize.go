package nvfp4

import (
	"context"
	"fmt"
	"math"
	"math/big"

	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/parallel"
)

// TieTol is how close (relative to the value) to a rounding midpoint a
// pre-rounding value must lie for either neighbouring code to count as
// correct: 8 fp32 ulps. The engines' quantizers reach x*gs/s through three
// or four fp32 roundings and two rcp.approx.ftz reciprocals (each within
// about one ulp), so their value can stray that far from the exact one and
// no farther; a code that differs farther from a tie is a fault.
const TieTol = 8 * 0x1p-24

// Quantized is the result of quantizing a [Rows, K] matrix, with the values
// each code and scale were rounded from, so a differing actual code can be
// classified (ScaleEquivalent, CodeEquivalent).
type Quantized struct {
	Rows, K int
	// Codes holds one E2M1 code per element, [Rows*K] (unpacked).
	Codes []uint8
	// Scales holds the E4M3FN block scale codes, linear [Rows, K/16].
	Scales []uint8
	// ScaleIn is gs*amax/6 for each block: the value rounded to the scale.
	ScaleIn []float64
	// CodeIn is x*gs/float(s) for each element: the value rounded to the
	// code (0 where s = 0).
	CodeIn []float64
	// BlockNaN marks blocks with a NaN input: no code or scale is wrong
	// there (the output is undefined), and the checker reports the NaN as
	// an input anomaly instead.
	BlockNaN []bool
}

// Packed returns the codes packed two a byte, [Rows, K/2].
func (q *Quantized) Packed() []uint8 { return Pack(q.Codes) }

// Matrix returns the quantized tensor as a Matrix with the quant-kind
// global scale gs, so that Dequantize gives x back (approximately).
func (q *Quantized) Matrix(gs float64) *Matrix {
	return &Matrix{Rows: q.Rows, K: q.K, Packed: q.Packed(), Scales: q.Scales, Global: gs, Kind: Quant}
}

func checkQuantizeArgs(x []float64, rows, k int) error {
	if rows < 0 || k < 0 {
		return fmt.Errorf("x: negative shape [%d, %d]", rows, k)
	}
	if k%BlockSize != 0 {
		return fmt.Errorf("x has K = %d, not a multiple of %d", k, BlockSize)
	}
	if len(x) != rows*k {
		return fmt.Errorf("x holds %d values; [%d, %d] needs %d", len(x), rows, k, rows*k)
	}
	return nil
}

func newQuantized(rows, k int) *Quantized {
	q := newCodes(rows, k)
	q.ScaleIn, q.CodeIn = make([]float64, len(q.Scales)), make([]float64, rows*k)
	return q
}

// newCodes is a Quantized without the values the codes were rounded from.
func newCodes(rows, k int) *Quantized {
	nb := rows * k / BlockSize
	return &Quantized{Rows: rows, K: k, Codes: make([]uint8, rows*k), Scales: make([]uint8, nb), BlockNaN: make([]bool, nb)}
}

// blockAmax is the largest |x| of a block; NaN when the block holds a NaN.
func blockAmax(x []float64) (amax float64, hasNaN bool) {
	for _, v := range x {
		if v != v {
			return math.NaN(), true
		}
		// not math.Max, a call that also orders zeros and NaNs: neither
		// can happen here, and the call was a third of the loop
		if a := math.Abs(v); a > amax {
			amax = a
		}
	}
	return amax, false
}

// Quantize is the exact NVFP4 quantizer of reference/CONTRACTS.md §3.1 (vLLM
// scaled_fp4_quant's semantics with exact arithmetic). For each 16-element
// block of each row of x ([rows, k] row-major):
//
//	s = e4m3_satfinite(gs * amax / 6)
//	q = e2m1(x * gs / float(s))   (q = 0 where s = 0)
//
// Both roundings are decided on the exact quotient (ties to even), even
// where float64 division would round onto a midpoint; gs is the global
// scale in the quant direction (2688/amax(x)).
func Quantize(ctx context.Context, x []float64, rows, k int, gs float64) (*Quantized, error) {
	if err := checkQuantizeArgs(x, rows, k); err != nil {
		return nil, err
	}
	q := newQuantized(rows, k)
	err := eachBlockRun(ctx, len(q.Scales), func(b int) {
		blk := x[b*BlockSize : (b+1)*BlockSize]
		amax, hasNaN := blockAmax(blk)
		q.BlockNaN[b] = hasNaN
		hi, lo := twoProd(gs, amax)
		q.Scales[b], q.ScaleIn[b] = roundQuotient(formats.E4M3FN, hi, lo, 6)
		QuantizeBlock(blk, gs, q.Scales[b], q.Codes[b*BlockSize:(b+1)*BlockSize], q.CodeIn[b*BlockSize:(b+1)*BlockSize])
	})
	if err != nil {
		return nil, err
	}
	return q, nil
}

// QuantizeBlock computes the exact codes of one block given its scale code:
// codes[j] = e2m1(x[j]*gs/float(scale)), 0 where the scale is 0. in, when
// not nil, receives the values rounded. A checker uses it to re-derive a
// block's codes from a kernel's own scale when that scale differs from the
// reference's at a tie.
func QuantizeBlock(x []float64, gs float64, scale uint8, codes []uint8, in []float64) {
	s := ScaleValue(scale)
	for j, v := range x {
		var c uint8
		var y float64
		if s != 0 {
			hi, lo := twoProd(v, gs)
			c, y = roundQuotient(formats.E2M1, hi, lo, s)
		}
		codes[j] = c
		if in != nil {
			in[j] = y
		}
	}
}

// twoProd returns a*b as an unevaluated sum hi+lo, exactly (Dekker's
// product through the fused multiply-add).
func twoProd(a, b float64) (hi, lo float64) {
	hi = a * b
	if math.IsInf(hi, 0) || math.IsNaN(hi) {
		return hi, 0
	}
	return hi, math.FMA(a, b, -hi)
}

// roundQuotient rounds (hi+lo)/den (den > 0) to f, ties to even, saturating,
// and returns the code and the float64 quotient. Float64 division is exact
// enough everywhere except next to a rounding midpoint, where the decision
// is taken on the exact value with math/big.
func roundQuotient(f *formats.Minifloat, hi, lo, den float64) (uint8, float64) {
	y := hi / den
	c := f.Code(y, formats.Saturate)
	if !f.NearTie(y, 0x1p-40) {
		return c, y
	}
	down := f.Code(y*(1-0x1p-30), formats.Saturate)
	up := f.Code(y*(1+0x1p-30), formats.Saturate)
	if down == up {
		return c, y
	}
	// |hi+lo| against mid*den, both exact at 256 bits (hi+lo needs 106,
	// mid*den at most 5+53).
	mid := (math.Abs(f.Decode(down)) + math.Abs(f.Decode(up))) / 2
	num := new(big.Float).SetPrec(256).SetFloat64(math.Abs(hi))
	l := new(big.Float).SetPrec(256).SetFloat64(lo)
	if hi < 0 {
		l.Neg(l)
	}
	num.Add(num, l)
	m := new(big.Float).SetPrec(256).SetFloat64(mid)
	m.Mul(m, new(big.Float).SetPrec(256).SetFloat64(den))
	// down and up carry y's sign; the magnitude nearer zero is the one
	// with the smaller magnitude bits.
	small, large := down, up
	if math.Abs(f.Decode(small)) > math.Abs(f.Decode(large)) {
		small, large = large, small
	}
	switch num.Cmp(m) {
	case -1:
		return small, y
	case 1:
		return large, y
	}
	if small&1 == 0 { // a tie: the even code (consecutive codes differ by one)
		return small, y
	}
	return large, y
}

// QuantizeExpected emulates, in float32, what vLLM's scaled_fp4_quant CUDA
// kernel (csrc/quantization/fp4/nvfp4_quant_kernels.cu, cvt_warp_fp16_to_fp4)
// computes; TensorRT-LLM's and FlashInfer's quantizers do the same:
//
//	SFValue     = gs * (amax * rcp(6))           fp32
//	s           = e4m3_satfinite(SFValue)
//	outputScale = rcp(float(s) * rcp(gs))        0 where s is 0
//	q           = e2m1_satfinite(x * outputScale)  fp32 product, RNE
//
// rcp is the kernels' rcp.approx.ftz.f32; it is emulated here by the
// correctly rounded fp32 reciprocal (the hardware's is within about one ulp
// of it, and TieTol covers the difference). The kernels test SFValue != 0 or
// amax != 0 rather than s != 0; where those differ (SFValue below half of
// E4M3's least subnormal) the scale is 0 and so is every dequantized value,
// so CodeEquivalent accepts any code there and this emulation writes 0.
// gs is rounded to float32 first, as the contract stores it.
func QuantizeExpected(ctx context.Context, x []float64, rows, k int, gs float64) (*Quantized, error) {
	if err := checkQuantizeArgs(x, rows, k); err != nil {
		return nil, err
	}
	return quantizeExpected(ctx, x, newQuantized(rows, k), gs)
}

// QuantizeExpectedCodes is QuantizeExpected's codes, scales and BlockNaN
// alone, for a generator that stores them: without ScaleIn and CodeIn (8
// bytes an element, 117 MB for a 7168 x 2048 weight), which only the
// classification of a differing code needs (ScaleAlternative,
// ScaleEquivalent and CodeEquivalent must not be called on its result).
func QuantizeExpectedCodes(ctx context.Context, x []float64, rows, k int, gs float64) (*Quantized, error) {
	if err := checkQuantizeArgs(x, rows, k); err != nil {
		return nil, err
	}
	return quantizeExpected(ctx, x, newCodes(rows, k), gs)
}

// quantizeExpected fills q, and its ScaleIn and CodeIn where it has them.
func quantizeExpected(ctx context.Context, x []float64, q *Quantized, gs float64) (*Quantized, error) {
	scaleIn, codeIn := q.ScaleIn, q.CodeIn
	gs32 := float32(gs)
	rcp6 := float32(1) / float32(6)
	rcpGs := float32(1) / gs32
	err := eachBlockRun(ctx, len(q.Scales), func(b int) {
		blk := x[b*BlockSize : (b+1)*BlockSize]
		amax, hasNaN := blockAmax(blk)
		q.BlockNaN[b] = hasNaN
		sf := float32(gs32 * float32(float32(amax)*rcp6))
		if scaleIn != nil {
			scaleIn[b] = float64(sf)
		}
		q.Scales[b] = formats.E4M3FN.Code(float64(sf), formats.Saturate)
		s := float32(ScaleValue(q.Scales[b]))
		var outScale float32
		if s != 0 {
			outScale = float32(1) / float32(s*rcpGs)
		}
		for j, v := range blk {
			i := b*BlockSize + j
			if s == 0 {
				continue
			}
			y := float32(float32(v) * outScale)
			if codeIn != nil {
				codeIn[i] = float64(y)
			}
			q.Codes[i] = formats.E2M1.Code(float64(y), formats.Saturate)
		}
	})
	if err != nil {
		return nil, err
	}
	return q, nil
}

// eachBlockRun calls fn(b) for every block b < n, runs of blocks shared out
// to GOMAXPROCS goroutines; fn writes only block b's entries, so the result
// does not depend on the sharing. It stops between runs once ctx is done,
// returning its error.
func eachBlockRun(ctx context.Context, n int, fn func(b int)) error {
	const run = 1024
	return parallel.Each(ctx, (n+run-1)/run, func(u int) {
		for b := u * run; b < min((u+1)*run, n); b++ {
			fn(b)
		}
	})
}

// tieNeighbours returns the two codes of f on either side of v when v lies
// within TieTol of a rounding midpoint (ok false otherwise).
func tieNeighbours(f *formats.Minifloat, v float64) (down, up uint8, ok bool) {
	if !f.NearTie(v, TieTol) {
		return 0, 0, false
	}
	down = f.Code(v*(1-2*TieTol), formats.Saturate)
	up = f.Code(v*(1+2*TieTol), formats.Saturate)
	return down, up, down != up
}

// ScaleAlternative returns the other correct scale code of block b when its
// exact pre-rounding value lies at a tie (ok false when only one is correct).
func (q *Quantized) ScaleAlternative(b int) (alt uint8, ok bool) {
	down, up, tie := tieNeighbours(formats.E4M3FN, q.ScaleIn[b])
	if !tie {
		return 0, false
	}
	if down == q.Scales[b] {
		return up, true
	}
	return down, true
}

// ScaleEquivalent reports whether actual is a correct scale code for block b
// of an exact quantization: the reference's code, the other neighbour of a
// tie (within TieTol), a NaN code for a NaN reference, or anything in a
// block with a NaN input.
func (q *Quantized) ScaleEquivalent(b int, actual uint8) bool {
	want := q.Scales[b]
	if actual == want || q.BlockNaN[b] {
		return true
	}
	if formats.E4M3FN.IsNaN(want) {
		return formats.E4M3FN.IsNaN(actual)
	}
	alt, ok := q.ScaleAlternative(b)
	return ok && actual == alt
}

// CodeEquivalent reports whether actual is a correct E2M1 code for element
// i of an exact quantization: the same value as the reference's (0 and -0
// are one value), the other neighbour of a tie within TieTol, or anything
// where the block's scale is 0 or NaN or its input holds a NaN (every code
// dequantizes to the same value, or none is defined). It does not consider
// a kernel's different block scale: re-derive the block with QuantizeBlock
// for that.
func (q *Quantized) CodeEquivalent(i int, actual uint8) bool {
	want := q.Codes[i]
	if CodeValue(actual) == CodeValue(want) {
		return true
	}
	b := i / BlockSize
	if s := ScaleValue(q.Scales[b]); q.BlockNaN[b] || s == 0 || s != s {
		return true
	}
	return CodeTieEquivalent(q.CodeIn[i], want, actual)
}

// CodeTieEquivalent reports whether actual is the other side of a rounding
// tie for an element whose exact pre-rounding value is in and whose exact
// code is want.
func CodeTieEquivalent(in float64, want, actual uint8) bool {
	down, up, ok := tieNeighbours(formats.E2M1, in)
	if !ok {
		return false
	}
	av := CodeValue(actual)
	return (CodeValue(want) == CodeValue(down) && av == CodeValue(up)) ||
		(CodeValue(want) == CodeValue(up) && av == CodeValue(down))
}
