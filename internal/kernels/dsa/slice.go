package dsa

import (
	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/kernels/paged"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// CaseSizes implements Slicer: the indexer's key width is fixed.
func (*indexer) CaseSizes() CaseSizes { return paged.Sizes(0) }

// Axes implements Slicer: an indexer's captures have no slicing yet
// (kcheck shrink says so; its cases shrink).
func (*indexer) Axes(map[string]*tensor.Tensor, map[string]string) ([]Axis, bool) {
	return nil, false
}
