package nvfp4

import (
	"cmp"
	"fmt"

	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/nvfp4"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// CaseSizes implements Slicer.
func (*quantize) CaseSizes() CaseSizes { return CaseSizes{M: defaultM, K: defaultK} }

// CaseSizes implements Slicer.
func (*dequantize) CaseSizes() CaseSizes { return CaseSizes{M: defaultM, K: defaultK} }

// CaseSizes implements Slicer.
func (*gemm) CaseSizes() CaseSizes { return CaseSizes{M: defaultM, K: defaultK, N: defaultN} }

// scaleRows slices the rows of an NVFP4 block-scale tensor in any layout
// (a tiled one is read back to linear, sliced and stored again, its padding
// zero).
func scaleRows(sc *tensor.Tensor, rows, kSF int, lay nvfp4.Layout, keep []int) (*tensor.Tensor, error) {
	if lay == nvfp4.Linear {
		return SelectAxis(sc, 0, keep), nil
	}
	lin, err := lay.ToLinear(sc.Data, rows, kSF)
	if err != nil {
		return nil, err
	}
	sub := make([]uint8, 0, len(keep)*kSF)
	for _, r := range keep {
		sub = append(sub, lin[r*kSF:(r+1)*kSF]...)
	}
	st, err := lay.FromLinear(sub, len(keep), kSF)
	if err != nil {
		return nil, err
	}
	mPad, kPad := lay.PaddedShape(len(keep), kSF)
	shape := []int{mPad, kPad}
	if len(sc.Shape) == 1 {
		shape = []int{mPad * kPad}
	}
	return &tensor.Tensor{DType: sc.DType, Shape: shape, Data: st}, nil
}

// rowsAxis is an axis of n rows: the axes tensors sliced along it, and the
// rows of the scales tensors (name: K, the elements a row).
func rowsAxis(ts map[string]*tensor.Tensor, meta map[string]string, name string, n int, axes map[string]int, scales map[string]int) Axis {
	return Axis{Name: name, N: n, Slice: func(keep []int) (map[string]*tensor.Tensor, error) {
		repl := SliceNamed(ts, keep, axes)
		for sc, k := range scales {
			if t, ok := ts[sc]; ok {
				lay, err := nvfp4.ParseLayout(cmp.Or(meta["scale_layout"], "linear"))
				if err != nil {
					return nil, err
				}
				s, err := scaleRows(t, n, k/nvfp4.BlockSize, lay, keep)
				if err != nil {
					return nil, fmt.Errorf("tensor %s: %v", sc, err)
				}
				repl[sc] = s
			}
		}
		return repl, nil
	}}
}

// Axes implements Slicer: the rows.
func (*quantize) Axes(ts map[string]*tensor.Tensor, meta map[string]string) ([]Axis, bool) {
	x := ts["x"]
	if x == nil || len(x.Shape) != 2 {
		return nil, false
	}
	return []Axis{rowsAxis(ts, meta, "rows", x.Shape[0], map[string]int{"x": 0, "packed": 0}, map[string]int{"block_scale": x.Shape[1]})}, true
}

// Axes implements Slicer: the rows.
func (*dequantize) Axes(ts map[string]*tensor.Tensor, meta map[string]string) ([]Axis, bool) {
	p := ts["packed"]
	if p == nil || len(p.Shape) != 2 {
		return nil, false
	}
	return []Axis{rowsAxis(ts, meta, "rows", p.Shape[0], map[string]int{"packed": 0, "out": 0}, map[string]int{"block_scale": 2 * p.Shape[1]})}, true
}

// Axes implements Slicer: the rows of A (M) and of B (N).
func (*gemm) Axes(ts map[string]*tensor.Tensor, meta map[string]string) ([]Axis, bool) {
	a, b := ts["a_packed"], ts["b_packed"]
	if a == nil || b == nil || len(a.Shape) != 2 || len(b.Shape) != 2 {
		return nil, false
	}
	return []Axis{
		rowsAxis(ts, meta, "m", a.Shape[0], map[string]int{"a_packed": 0, "out": 0}, map[string]int{"a_scale": 2 * a.Shape[1]}),
		rowsAxis(ts, meta, "n", b.Shape[0], map[string]int{"b_packed": 0, "out": 1}, map[string]int{"b_scale": 2 * b.Shape[1]}),
	}, true
}
