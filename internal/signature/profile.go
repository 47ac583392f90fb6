package signature

import (
	"math"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Profile is one output's excess (err/tol) aggregated by every coordinate
// value the kernel names for its elements: what the signature is read from
// and what a report plots, built in one pass over the elements. It holds a
// few numbers per coordinate value (and per cell of one heat map), never
// per element, so an output the size of a KV cache profiles in memory
// that grows with its coordinates' values. A tensor above
// Options.MaxElements is sampled: every element with excess mass, and a
// share Rate of the others, each standing for 1/Rate elements.
type Profile struct {
	// N is the number of elements; Rate the share of the clean ones read.
	N    int
	Rate float64

	stats []*coordStats
	grid  *gridCells
}

// CoordValues is the excess by the values of one coordinate, values
// ascending: the largest excess (+Inf for a special-value mismatch), the
// sum of the finite excess and the element count (both estimated when
// sampled), and the failing elements, of each.
type CoordValues struct {
	Name      string
	Kind      kernel.CoordKind
	Values    []int
	Max       []float64
	FiniteSum []float64
	Count     []float64
	Failing   []int
}

// Coords returns the kernel's coordinates in the order it names them (the
// parity the signature adds left out).
func (p *Profile) Coords() []CoordValues {
	var out []CoordValues
	for _, st := range p.stats {
		if st.added {
			continue
		}
		cv := CoordValues{Name: st.name, Kind: st.kind, Values: append([]int(nil), st.vals...)}
		for _, v := range st.vals {
			cv.Max = append(cv.Max, st.c(v).max)
			cv.FiniteSum = append(cv.FiniteSum, st.c(v).finite)
			cv.Count = append(cv.Count, st.c(v).count)
			cv.Failing = append(cv.Failing, st.c(v).fail)
		}
		out = append(out, cv)
	}
	return out
}

// Grid returns the heat map: the largest excess for each (y, x) pair of
// values of two coordinates, when the profile was asked for (Options.Profile)
// and the output has two coordinates worth one.
func (p *Profile) Grid() (y, x string, cells map[[2]int]float64, ok bool) {
	if p.grid == nil {
		return "", "", nil, false
	}
	return p.grid.y, p.grid.x, p.grid.max, true
}

type gridCells struct {
	y, x string
	max  map[[2]int]float64
}

// gridPairs are the heat maps worth drawing, rows first: head by request
// for attention, page by page offset for caches, row by 16-element block
// for NVFP4, row by split for split-K.
var gridPairs = [][2]kernel.CoordKind{
	{kernel.KindHead, kernel.KindRequest}, {kernel.KindHead, kernel.KindQPos}, {kernel.KindHead, kernel.KindContextLen},
	{kernel.KindBlock, kernel.KindPageOffset}, {kernel.KindPage, kernel.KindPageOffset},
	{kernel.KindRow, kernel.KindScaleBlock}, {kernel.KindScaleRow, kernel.KindScaleCol}, {kernel.KindRow, kernel.KindCol}, {kernel.KindRow, kernel.KindSplit},
	{kernel.KindRow, kernel.KindLatent}, {kernel.KindRequest, kernel.KindToken}, {kernel.KindRequest, kernel.KindRank},
}

// gridAxes picks the heat map's coordinates from those of one element, as
// positions among them (-1, -1 for none): the first of gridPairs the
// element has, else its two leading axes with more than one value.
func gridAxes(coords []kernel.Coord, shape []int) (y, x int) {
	at := map[kernel.CoordKind]int{}
	for i, c := range coords {
		if _, seen := at[c.Kind]; !seen {
			at[c.Kind] = i
		}
	}
	for _, pr := range gridPairs {
		yi, okY := at[pr[0]]
		xi, okX := at[pr[1]]
		if okY && okX {
			return yi, xi
		}
	}
	var axes []int
	for d, s := range shape {
		if s > 1 && d < len(coords) {
			axes = append(axes, d)
		}
	}
	if len(axes) >= 2 {
		return axes[0], axes[1]
	}
	return -1, -1
}

// NewProfile profiles an output that passed (a report plots every check of
// a case that passes): the same aggregation the signature reads, with no
// signature.
func NewProfile(o kernel.Output, excess kernel.Values, opt Options) *Profile {
	thr := opt.Threshold
	if thr <= 0 {
		thr = 1
	}
	maxElems := opt.MaxElements
	if maxElems <= 0 {
		maxElems = DefaultMaxElements
	}
	N := excess.Len()
	shape := o.Shape
	if tensor.NumElements(shape) != N || len(shape) == 0 {
		shape = []int{N}
	}
	if N == 0 {
		return &Profile{N: 0, Rate: 1}
	}
	// With the comparison's own pass (Options.Judged), the elements of
	// weight 0 are known without judging them, as in the signature's.
	var capped func(float64) float64
	var weighted []uint64
	if j := opt.Judged; j != nil && thr == 1 && len(j.Failing) == (N+63)/64 {
		capped, weighted = capperAt(j.MaxFinite, thr), j.Failing
	} else {
		capped = excessCapper(excess, N, thr)
	}
	weight := func(e float64) float64 {
		if e > thr {
			return 1 + math.Log(e/thr)
		}
		return 0
	}
	return collect(o, shape, N, excess.At, capped, weight, thr, maxElems, weighted, true)
}
