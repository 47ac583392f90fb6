package splitk

import (
	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// CaseSizes implements Slicer: a combine case's rows come from its batch,
// which every case may halve.
func (combine) CaseSizes() CaseSizes { return CaseSizes{} }

// Axes implements Slicer: the rows.
func (combine) Axes(ts map[string]*tensor.Tensor, meta map[string]string) ([]Axis, bool) {
	po := ts["partial_out"]
	if po == nil || len(po.Shape) != 3 {
		return nil, false
	}
	rows := map[string]int{"partial_out": 0, "partial_lse": 0, "out": 0, "lse": 0}
	return []Axis{{Name: "rows", N: po.Shape[0], Slice: func(keep []int) (map[string]*tensor.Tensor, error) {
		return SliceNamed(ts, keep, rows), nil
	}}}, true
}
