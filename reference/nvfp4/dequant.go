package nvfp4

import (
	"context"

	"github.com/kcheck-dev/kcheck/reference/parallel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Dequantize returns the exact value of every element of a (reference/CONTRACTS.md §3.2),
// [Rows*K] row-major: e2m1(code) * e4m3(scale) * g for the dequant kind and
// e2m1(code) * e4m3(scale) / g for the quant kind, each with a single
// float64 rounding (the code-scale product is exact). A NaN scale gives NaN.
func Dequantize(ctx context.Context, a *Matrix) ([]float64, error) {
	t, err := ExactTable(a)
	if err != nil {
		return nil, err
	}
	return t.all(ctx, a)
}

// DequantizeExpected is what a dequantization kernel computing in fp32
// writes in dtype out: (e2m1(code) * e4m3(scale)) in fp32 (exact), then
// times the fp32 global scale for the dequant kind or divided by it for the
// quant kind (as vLLM's and FlashInfer's reference dequantizers do it,
// `x * sf / global_scale` in torch fp32), then rounded to out.
func DequantizeExpected(ctx context.Context, a *Matrix, out tensor.DType) ([]float64, error) {
	t, err := ExpectedTable(a, out)
	if err != nil {
		return nil, err
	}
	return t.all(ctx, a)
}

// CodeTable is a dequantized value for each pair of a block scale code s
// and an E2M1 code c, at s<<4 | c, for one matrix's global scale. An
// element's value depends on its two codes alone, so a dequantization is
// a lookup an element of one of the 4096 values, made once: the same bits
// as computing each element's, without a float64 per element held (a
// check reads the values on demand, Values) or a rounding per element.
type CodeTable [256 * 16]float64

// ExactTable is Dequantize's table for a.
func ExactTable(a *Matrix) (*CodeTable, error) {
	if err := a.Check("matrix"); err != nil {
		return nil, err
	}
	g := a.Global
	return byCodes(func(v float64) float64 {
		if a.Kind == Quant {
			return v / g
		}
		return v * g
	}), nil
}

// ExpectedTable is DequantizeExpected's table for a and out.
func ExpectedTable(a *Matrix, out tensor.DType) (*CodeTable, error) {
	if err := a.Check("matrix"); err != nil {
		return nil, err
	}
	if err := checkOutDType(out); err != nil {
		return nil, err
	}
	g := float32(a.Global)
	return byCodes(func(v float64) float64 {
		bv := float32(v) // exact: see blockValues
		var f float32
		if a.Kind == Quant {
			f = float32(bv / g)
		} else {
			f = float32(bv * g)
		}
		return RoundTo(out, float64(f))
	}), nil
}

// byCodes is the table of of(e2m1(c) * e4m3(s)).
func byCodes(of func(v float64) float64) *CodeTable {
	var t CodeTable
	for s := range 256 {
		sv := ScaleValue(uint8(s))
		for c, cv := range e2m1Values {
			t[s<<4|c] = of(cv * sv)
		}
	}
	return &t
}

// Values fills dst with the values of a's elements lo, lo+1, ...
// (row-major) that t gives them.
func (t *CodeTable) Values(a *Matrix, lo int, dst []float64) {
	at := func(i uint) float64 {
		return t[uint(a.Scales[i/BlockSize])<<4|uint(a.Packed[i/2]>>(4*(i&1))&0xF)]
	}
	// element by element to a block's start, then block by block (one
	// scale and sixteen values a block), then element by element
	k := 0
	for ; k < len(dst) && (lo+k)%BlockSize != 0; k++ {
		dst[k] = at(uint(lo + k))
	}
	for ; k+BlockSize <= len(dst); k += BlockSize {
		b := (lo + k) / BlockSize
		s := t[int(a.Scales[b])<<4:][:16]
		o := dst[k : k+BlockSize]
		for j, p := range a.Packed[b*BlockSize/2 : (b+1)*BlockSize/2] {
			o[2*j] = s[p&0xF]
			o[2*j+1] = s[p>>4]
		}
	}
	for ; k < len(dst); k++ {
		dst[k] = at(uint(lo + k))
	}
}

// all is every element's value of a, the blocks shared out to every core.
func (t *CodeTable) all(ctx context.Context, a *Matrix) ([]float64, error) {
	out := make([]float64, a.Rows*a.K)
	err := a.eachBlock(ctx, func(b int) {
		t.Values(a, b*BlockSize, out[b*BlockSize:(b+1)*BlockSize])
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// eachBlock calls fn for every 16-element block b (row-major over the
// matrix), the blocks shared out to GOMAXPROCS goroutines in runs of rows.
// fn writes only block b's outputs, so the result does not depend on the
// sharing. A block's values are e2m1(code)*e4m3(scale), exact in float64
// and in float32 alike (a 2-bit by 4-bit significand product). It stops
// between runs of rows once ctx is done, returning its error.
func (a *Matrix) eachBlock(ctx context.Context, fn func(b int)) error {
	kb := a.K / BlockSize
	if kb == 0 || a.Rows == 0 {
		return ctx.Err()
	}
	rowsPer := max(1, (1<<16)/a.K)
	units := (a.Rows + rowsPer - 1) / rowsPer
	return parallel.Each(ctx, units, func(u int) {
		for r := u * rowsPer; r < min((u+1)*rowsPer, a.Rows); r++ {
			for b := r * kb; b < (r+1)*kb; b++ {
				fn(b)
			}
		}
	})
}
