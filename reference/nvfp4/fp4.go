package nvfp4

import (
	"context"
	"fmt"

	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/parallel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// BlockSize is the number of consecutive elements of a row that share one
// E4M3 block scale.
const BlockSize = 16

// CodeAt returns E2M1 code i of a packed buffer: element 2j is the low
// nibble of byte j, element 2j+1 the high nibble (reference/CONTRACTS.md §2.1).
func CodeAt(packed []uint8, i int) uint8 {
	b := packed[i/2]
	if i%2 == 1 {
		return b >> 4
	}
	return b & 0xF
}

// Pack packs E2M1 codes two a byte, low nibble first. An odd count leaves
// the last high nibble zero.
func Pack(codes []uint8) []uint8 {
	p := make([]uint8, (len(codes)+1)/2)
	for i, c := range codes {
		if i%2 == 1 {
			p[i/2] |= (c & 0xF) << 4
		} else {
			p[i/2] |= c & 0xF
		}
	}
	return p
}

// Unpack returns the 2*len(packed) codes of a packed buffer.
func Unpack(packed []uint8) []uint8 {
	c := make([]uint8, 2*len(packed))
	for j, b := range packed {
		c[2*j], c[2*j+1] = b&0xF, b>>4
	}
	return c
}

// e2m1Values are the 16 E2M1 values by code (reference/CONTRACTS.md §2), as a table so
// the hot loops do not decode.
var e2m1Values = func() [16]float64 {
	var v [16]float64
	for c := range v {
		v[c] = formats.E2M1.Decode(uint8(c))
	}
	return v
}()

// CodeValue returns the value of an E2M1 code (its high bits ignored).
func CodeValue(c uint8) float64 { return e2m1Values[c&0xF] }

// ScaleValue returns the value of an E4M3FN block scale code (NaN for 0x7F, 0xFF).
func ScaleValue(c uint8) float64 { return formats.E4M3FN.Decode(c) }

// GlobalKind says which way a per-tensor global scale points (reference/CONTRACTS.md §3.2).
type GlobalKind int

const (
	// Dequant: values are multiplied by the global scale (ModelOpt's
	// weight_scale_2 and input_scale, amax/2688).
	Dequant GlobalKind = iota
	// Quant: values are divided by it (vLLM's gs = 2688/amax, the scale
	// scaled_fp4_quant takes).
	Quant
)

// String returns the contract's name of the kind.
func (k GlobalKind) String() string {
	if k == Quant {
		return "quant"
	}
	return "dequant"
}

// ParseGlobalKind reads a *_global_kind parameter value.
func ParseGlobalKind(s string) (GlobalKind, error) {
	switch s {
	case "dequant":
		return Dequant, nil
	case "quant":
		return Quant, nil
	}
	return Dequant, fmt.Errorf("global scale kind %q: want dequant or quant", s)
}

// Matrix is an NVFP4 matrix of Rows x K elements with linear block scales;
// swizzled scales are converted with Swizzled128x4.ToLinear first.
type Matrix struct {
	Rows, K int
	// Packed holds the E2M1 codes, [Rows, K/2], low nibble first.
	Packed []uint8
	// Scales holds the E4M3FN block scale codes, linear [Rows, K/16].
	Scales []uint8
	// Global is the per-tensor scale, applied as Kind says.
	Global float64
	Kind   GlobalKind
}

// Check verifies that the sizes agree; name prefixes the messages.
func (a *Matrix) Check(name string) error {
	if a.Rows < 0 || a.K < 0 {
		return fmt.Errorf("%s: negative shape [%d, %d]", name, a.Rows, a.K)
	}
	if a.K%BlockSize != 0 {
		return fmt.Errorf("%s has K = %d, not a multiple of %d", name, a.K, BlockSize)
	}
	if len(a.Packed) != a.Rows*a.K/2 {
		return fmt.Errorf("%s: packed codes hold %d bytes; [%d, %d] needs %d", name, len(a.Packed), a.Rows, a.K, a.Rows*a.K/2)
	}
	if len(a.Scales) != a.Rows*a.K/BlockSize {
		return fmt.Errorf("%s: block scales hold %d bytes; [%d, %d] needs %d", name, len(a.Scales), a.Rows, a.K/BlockSize, a.Rows*a.K/BlockSize)
	}
	return nil
}

// Code returns the E2M1 code of element (r, c).
func (a *Matrix) Code(r, c int) uint8 { return CodeAt(a.Packed, r*a.K+c) }

// blockValues returns e2m1(code)*e4m3(scale) for every element, without the
// global scale, as float32: the product of a 2-bit and a 4-bit significand
// is exact in either float type, and these are the values a block-scaled
// MMA multiplies. The rows are shared out to GOMAXPROCS goroutines; each
// value is written by one. It is not stopped by a context: its work is one
// pass over a matrix the capture holds, where a GEMM's is a product.
func (a *Matrix) blockValues() []float32 {
	v := make([]float32, a.Rows*a.K)
	if a.K == 0 {
		return v
	}
	kb := a.K / BlockSize
	rowsPer := max(1, (1<<16)/a.K)
	parallel.Each(context.Background(), (a.Rows+rowsPer-1)/rowsPer, func(u int) {
		for b := u * rowsPer * kb; b < min((u+1)*rowsPer, a.Rows)*kb; b++ {
			s := e4m3Values32[a.Scales[b]]
			dst := v[b*BlockSize : (b+1)*BlockSize]
			for j, p := range a.Packed[b*BlockSize/2 : (b+1)*BlockSize/2] {
				dst[2*j] = e2m1Values32[p&0xF] * s
				dst[2*j+1] = e2m1Values32[p>>4] * s
			}
		}
	})
	return v
}

// e2m1Values32 and e4m3Values32 are the E2M1 and E4M3FN values as float32
// (exact: both formats are narrower), for blockValues and the GEMM's panels.
var e2m1Values32, e4m3Values32 = func() (c [16]float32, s [256]float32) {
	for i := range c {
		c[i] = float32(e2m1Values[i])
	}
	for i := range s {
		s[i] = float32(ScaleValue(uint8(i)))
	}
	return c, s
}()

// RoundTo rounds x to dtype d as a kernel storing an fp32 result does
// (through float32 first); F64 leaves x alone.
func RoundTo(d tensor.DType, x float64) float64 {
	switch d {
	case tensor.BF16:
		return formats.RoundBF16(x)
	case tensor.F16:
		return formats.RoundFP16(x)
	case tensor.F32:
		return formats.RoundF32(x)
	}
	return x
}

// checkOutDType accepts the output dtypes the contracts allow.
func checkOutDType(d tensor.DType) error {
	switch d {
	case tensor.BF16, tensor.F16, tensor.F32, tensor.F64:
		return nil
	}
	return fmt.Errorf("output dtype %s: want BF16, F16 or F32", d)
}
