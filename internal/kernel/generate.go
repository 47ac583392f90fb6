package kernel

import (
	"context"
	"math"

	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Generator makes the inputs of a catalog case: what `kcheck run` checks a
// backend on, and what the fixtures are made of. Package cases reads the
// catalog and resolves a case's preset; the kernel says what its inputs
// are.
type Generator interface {
	// Defaults are the parameters a case of the kernel states in its
	// metadata beyond the case's own (page_size, kv_cache_dtype,
	// softmax_scale...).
	Defaults(c Case) Params
	// Generate builds the inputs of c deterministically from r. It runs
	// references of its own (the quantizer, the cache writer) on tensors
	// whose size the case sets, and stops when ctx is done.
	Generate(ctx context.Context, c Case, r *RNG) (map[string]*tensor.Tensor, error)
	// PlanCost adds to cost what Generate holds while it builds the
	// inputs, and returns the shapes of the inputs it would build, before
	// anything is built. c.Geometry.SeqLens may be a run of 2^40 contexts
	// (a number in a case file): nothing may be allocated per request.
	PlanCost(c Case, cost *Cost) Shapes
}

// Case is a catalog case as a kernel's generator reads it.
type Case struct {
	Name   string
	Kernel string
	Seed   uint64
	// The case's own sizes, 0 where it gives none (the kernel's defaults
	// apply).
	M, N, K, Heads, Splits, TopK int
	// Geometry is the attention geometry every paged kernel reads, with
	// the preset, the case's overrides and the shared defaults applied.
	Geometry Geometry
	// Params are the capture's metadata parameters: the kernel's
	// Defaults and the case's own, which override them.
	Params Params
}

// Geometry is a case's attention geometry, resolved.
type Geometry struct {
	Heads, Latent, Rope int
	Batch, SQ, PageSize int
	Splits              int
	// TopK is the case's, else its preset's, else 64.
	TopK         int
	SoftmaxScale float64
	KVCacheDType string
	// SeqLens are the requests' contexts: the case's list, or the default
	// run 4P+1, 4P+2, ... (past a page boundary, each request different).
	SeqLens Contexts
}

// SeqLenList returns the contexts as a list of ints: for Generate, once
// the case's memory estimate has been accepted.
func (g Geometry) SeqLenList() []int {
	if g.SeqLens.List != nil {
		out := make([]int, len(g.SeqLens.List))
		for i, n := range g.SeqLens.List {
			out[i] = int(n)
		}
		return out
	}
	out := make([]int, g.SeqLens.Count())
	for i := range out {
		out[i] = int(g.SeqLens.First) + i
	}
	return out
}

// BF16 is a tensor of shape holding v rounded to bf16.
func BF16(shape []int, v []float64) *tensor.Tensor { return tensor.FromFloat64s(tensor.BF16, shape, v) }

// F32Scalar is a float32 scalar tensor of shape [].
func F32Scalar(v float64) *tensor.Tensor {
	return tensor.FromFloat64s(tensor.F32, []int{}, []float64{v})
}

// AbsMax is the largest |x| of v (0 for none).
func AbsMax(v []float64) float64 {
	// math.Max's fold without its call, which was most of the catalog's
	// scale scans: an infinity wins over a NaN, as in math.Max
	m, nan := 0.0, false
	for _, x := range v {
		if a := math.Abs(x); a > m {
			m = a
		} else if a != a {
			nan = true
		}
	}
	if nan && !math.IsInf(m, 1) {
		return math.NaN()
	}
	return m
}

// StopStride is how many values a generator draws between looks at its
// context: a fraction of a millisecond of drawing, so that a look (a call
// to ctx.Err) costs nothing beside the drawing.
const StopStride = 1 << 14

// Stopped is ctx's error at every StopStride-th index i, nil between: a
// generator's loop over a tensor the case sizes calls it each element and
// stops between strides, with the values it draws, and their order, as
// they were.
func Stopped(ctx context.Context, i int) error {
	if i&(StopStride-1) != 0 {
		return nil
	}
	return ctx.Err()
}

// Normals fills dst with r's normal variates, as a loop of r.Normal()
// calls that looks at ctx with Stopped would, and returns ctx's error
// where it stops: a stride at a time, each stride in one RNG.Normals.
func Normals(ctx context.Context, r *RNG, dst []float64) error {
	for lo := 0; lo < len(dst); lo += StopStride {
		if err := ctx.Err(); err != nil {
			return err
		}
		r.Normals(dst[lo:min(lo+StopStride, len(dst))])
	}
	return nil
}
