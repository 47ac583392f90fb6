package report

import (
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/signature"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Profile is one output's error aggregated by the coordinates the kernel
// names for its elements (request, head, token, page, page_offset, split,
// block16, ...): for each value, the largest and the mean err/tol, how many
// elements fail and how many there are. The check's JSON keeps only the
// worst elements and the signature; a profile is what the plots draw.
//
// For attention outputs the error per token is not an element of any
// output (attention reduces over tokens), so the profile says what can be
// said honestly: error by context length, by the fill of the last page, by
// head and request, each an aggregate over the elements that share it.
type Profile struct {
	// Tensor is the check's tensor name (stage-prefixed in a pipeline);
	// Kind is "local" or "propagated" for a pipeline stage.
	Tensor  string `json:"tensor"`
	Kind    string `json:"kind,omitempty"`
	Kernel  string `json:"kernel"`
	Bitwise bool   `json:"bitwise,omitempty"`
	// PageSize and SplitStarts (token offsets where a split-K split
	// begins, from the run's partial outputs) are drawn as boundaries.
	PageSize    int   `json:"page_size,omitempty"`
	SplitStarts []int `json:"split_starts,omitempty"`
	// Sampled is the stride of the sample the counts and means come from
	// (1: every element); failing elements outside the sample are added to
	// the largest values and failing counts, up to maxProfileElements of them.
	Sampled int `json:"sampled,omitempty"`
	// Axes is the output's rank: Coords[:Axes] are its axes, the rest
	// derived coordinates.
	Axes   int            `json:"axes"`
	Coords []CoordProfile `json:"coords"`
	Map    *Grid          `json:"map,omitempty"`
	Worst  compare.Float  `json:"max_excess"`
	// FromSignature: rebuilt from a check's signature groups (a result
	// re-rendered from `check --json`, which keeps no per-element errors):
	// only the signature's coordinate, only its reported groups, and the
	// mean err/tol of each.
	FromSignature bool            `json:"from_signature,omitempty"`
	Verdict       compare.Verdict `json:"verdict"`
}

// CoordProfile is the error by the values of one coordinate. Values are
// ascending; when Width > 1 each value is the first of a bin of Width.
type CoordProfile struct {
	Name    string          `json:"name"`
	Width   int             `json:"width,omitempty"`
	Values  []int           `json:"values"`
	Max     []compare.Float `json:"max"`
	Mean    []compare.Float `json:"mean"`
	Failing []int           `json:"failing"`
	Count   []int           `json:"count"`
}

// Grid is the largest err/tol over two coordinates (rows Y, columns X):
// Max[y][x], NaN where no element has those values.
type Grid struct {
	X      string            `json:"x"`
	Y      string            `json:"y"`
	XVals  []int             `json:"x_values"`
	YVals  []int             `json:"y_values"`
	XWidth int               `json:"x_width,omitempty"`
	YWidth int               `json:"y_width,omitempty"`
	Max    [][]compare.Float `json:"max"`
}

// maxProfileElements bounds the elements whose coordinates are named one by
// one; larger outputs are sampled with a stride (failing elements are
// always included, up to as many again). A variable for the tests.
var maxProfileElements = 1 << 21

// maxValues bounds the values a coordinate profile keeps before binning;
// maxGrid bounds each side of the heat map.
const (
	maxValues = 2048
	maxGrid   = 96
)

// Recorder collects profiles while checks run: set its Observe as
// check.Options.Observe (Options does that), run, then Take.
type Recorder struct {
	mu          sync.Mutex
	profiles    []Profile
	splitStarts map[int]bool
}

// NewRecorder returns an empty recorder.
func NewRecorder() *Recorder { return &Recorder{splitStarts: map[int]bool{}} }

// Options returns opts with the recorder observing every comparison (an
// Observe already set is still called).
func (r *Recorder) Options(opts check.Options) check.Options {
	prev := opts.Observe
	opts.Observe = func(o check.Observation) {
		if prev != nil {
			prev(o)
		}
		r.Observe(o)
	}
	return opts
}

// Observe profiles one comparison.
func (r *Recorder) Observe(o check.Observation) {
	p, starts := profileOf(o)
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range starts {
		r.splitStarts[s] = true
	}
	r.profiles = append(r.profiles, p)
}

// Take returns the profiles recorded since the last Take, with the split
// boundaries seen in the run's partial outputs, and resets the recorder.
func (r *Recorder) Take() []Profile {
	r.mu.Lock()
	defer r.mu.Unlock()
	var starts []int
	for s := range r.splitStarts {
		if s > 0 {
			starts = append(starts, s)
		}
	}
	sort.Ints(starts)
	out := r.profiles
	for i := range out {
		out[i].SplitStarts = starts
	}
	r.profiles, r.splitStarts = nil, map[int]bool{}
	return out
}

type agg struct {
	max, sum     float64
	count, fails int
	// infinite: a sampled element's err/tol is infinite (or NaN), which
	// makes the group's mean infinite too: the mean of its finite rest
	// would look better than the elements are (0 for an all-NaN output).
	infinite bool
}

// excessOf mirrors compare.Compare's element judgement: err/tol, +Inf for a
// special-value mismatch or any error against a zero tolerance, 0 for an
// element the kernel's equivalence rule accepts.
func excessOf(o check.Observation, b compare.Bounds, i int) float64 {
	ref := o.Ref
	av := o.Actual.Float64At(i)
	ev, xv := ref.Expected.At(i), ref.Exact.At(i)
	nanA, nanE := math.IsNaN(av), math.IsNaN(ev)
	switch {
	case nanA != nanE:
		return math.Inf(1)
	case nanA:
		return 0
	case math.IsInf(av, 0) || math.IsInf(ev, 0):
		if av != ev {
			return math.Inf(1)
		}
		return 0
	}
	if ref.Mode == kernel.Bitwise {
		if av == ev || (ref.Equivalent != nil && ref.Equivalent(i, av)) {
			return 0
		}
		return math.Inf(1)
	}
	r := xv
	if math.IsNaN(xv) || math.IsInf(xv, 0) {
		r = ev
	}
	err := math.Abs(av - r)
	tol := b.Tol(i, xv, ev)
	switch {
	case err > tol && ref.Equivalent != nil && ref.Equivalent(i, av):
		return 0
	case tol > 0:
		return err / tol
	case err > 0:
		return math.Inf(1)
	}
	return 0
}

func profileOf(o check.Observation) (Profile, []int) {
	c := o.Check
	name := c.Tensor
	if o.Stage != "" {
		name = o.Stage + "." + name
	}
	p := Profile{Tensor: name, Kind: o.Kind, Kernel: o.Kernel, Bitwise: o.Ref.Mode == kernel.Bitwise,
		Worst: c.Metrics.MaxExcess, Verdict: c.Verdict, Sampled: 1}
	if ps, err := strconv.Atoi(o.Params["page_size"]); err == nil && ps > 0 {
		p.PageSize = ps
	}
	n := o.Actual.Len()
	if n == 0 || o.Ref.Expected == nil || o.Ref.Exact == nil || o.Ref.Expected.Len() != n || o.Ref.Exact.Len() != n {
		return p, nil
	}
	var b compare.Bounds
	if o.Ref.Mode != kernel.Bitwise && o.Policy != nil {
		b = o.Policy.Bounds(*o.Ref, o.Actual.DType)
	}
	if b.Tol == nil {
		b.Tol = func(int, float64, float64) float64 { return 0 }
	}
	shape := o.Actual.Shape
	if tensor.NumElements(shape) != n {
		shape = []int{n}
	}
	p.Axes = len(shape)
	stride := 1
	if n > maxProfileElements {
		stride = (n + maxProfileElements - 1) / maxProfileElements
	}
	p.Sampled = stride
	aggs := map[string]map[int]*agg{}
	var order []string
	grid := map[[2]int]float64{}
	gx, gy := "", ""
	var starts []int
	seenStart := map[int]bool{}
	extra := 0 // failing elements outside the sample, named too (bounded)
	for i := 0; i < n; i++ {
		e := excessOf(o, b, i)
		if i%stride != 0 {
			if !(e > 1) || extra >= maxProfileElements {
				continue
			}
			extra++
		}
		coords := o.Ref.Coords.Name(tensor.Unravel(i, shape))
		if gx == "" {
			gy, gx = gridAxes(coords, shape)
		}
		var xv, yv int
		for _, cd := range coords {
			m := aggs[cd.Name()]
			if m == nil {
				m = map[int]*agg{}
				aggs[cd.Name()] = m
				order = append(order, cd.Name())
			}
			a := m[cd.Value]
			if a == nil {
				a = &agg{}
				m[cd.Value] = a
			}
			a.max = math.Max(a.max, e)
			if e > 1 {
				a.fails++
			}
			if i%stride == 0 {
				a.count++
				if math.IsInf(e, 0) || math.IsNaN(e) {
					a.infinite = true
				} else {
					a.sum += e
				}
			}
			switch cd.Name() {
			case gx:
				xv = cd.Value
			case gy:
				yv = cd.Value
			}
			if cd.Kind == kernel.KindSplitStart && !seenStart[cd.Value] {
				seenStart[cd.Value] = true
				starts = append(starts, cd.Value)
			}
		}
		if gx != "" {
			k := [2]int{yv, xv}
			if v, ok := grid[k]; !ok || e > v {
				grid[k] = e
			}
		}
	}
	for _, name := range order {
		p.Coords = append(p.Coords, coordProfile(name, aggs[name]))
	}
	if gx != "" && gy != "" {
		p.Map = gridOf(gx, gy, grid)
	}
	return p, starts
}

func coordProfile(name string, m map[int]*agg) CoordProfile {
	vals := make([]int, 0, len(m))
	for v := range m {
		vals = append(vals, v)
	}
	sort.Ints(vals)
	cp := CoordProfile{Name: name, Width: 1}
	width := 1
	if len(vals) > maxValues {
		width = (vals[len(vals)-1] - vals[0] + maxValues) / maxValues
		cp.Width = width
	}
	var cur *agg
	curBin := 0
	flush := func() {
		if cur == nil {
			return
		}
		mean := 0.0
		switch {
		case cur.infinite:
			mean = math.Inf(1)
		case cur.count > 0:
			mean = cur.sum / float64(cur.count)
		}
		cp.Values = append(cp.Values, curBin)
		cp.Max = append(cp.Max, compare.Float(cur.max))
		cp.Mean = append(cp.Mean, compare.Float(mean))
		cp.Failing = append(cp.Failing, cur.fails)
		cp.Count = append(cp.Count, cur.count)
	}
	for _, v := range vals {
		bin := v
		if width > 1 {
			bin = vals[0] + (v-vals[0])/width*width
		}
		if cur == nil || bin != curBin {
			flush()
			cur, curBin = &agg{}, bin
		}
		a := m[v]
		cur.max = math.Max(cur.max, a.max)
		cur.sum += a.sum
		cur.count += a.count
		cur.fails += a.fails
		cur.infinite = cur.infinite || a.infinite
	}
	flush()
	if cp.Width == 1 {
		cp.Width = 0
	}
	return cp
}

// gridPairs are the heat maps worth drawing, rows first: head by request
// for attention, page by page offset for caches, row by 16-element block
// for NVFP4, row by split for split-K.
var gridPairs = [][2]string{
	{"head", "request"}, {"head", "q_pos"}, {"head", "context_len"},
	{"block", "page_offset"}, {"page", "page_offset"},
	{"row", "block16"}, {"sf_row", "sf_col"}, {"row", "col"}, {"row", "split"},
	{"row", "latent"}, {"request", "token"}, {"request", "rank"},
}

// gridAxes picks the heat map's coordinates from those of one element.
func gridAxes(coords []kernel.Coord, shape []int) (y, x string) {
	has := map[string]bool{}
	for _, c := range coords {
		has[c.Name()] = true
	}
	for _, pr := range gridPairs {
		if has[pr[0]] && has[pr[1]] {
			return pr[0], pr[1]
		}
	}
	// The two leading axes with more than one value.
	var axes []string
	for d, s := range shape {
		if s > 1 && d < len(coords) {
			axes = append(axes, coords[d].Name())
		}
	}
	if len(axes) >= 2 {
		return axes[0], axes[1]
	}
	return "", ""
}

func gridOf(x, y string, cells map[[2]int]float64) *Grid {
	xs, ys := map[int]bool{}, map[int]bool{}
	for k := range cells {
		ys[k[0]] = true
		xs[k[1]] = true
	}
	xv, xw := binned(xs)
	yv, yw := binned(ys)
	if len(xv) < 2 && len(yv) < 2 {
		return nil
	}
	g := &Grid{X: x, Y: y, XVals: xv, YVals: yv, XWidth: xw, YWidth: yw}
	g.Max = make([][]compare.Float, len(yv))
	for i := range g.Max {
		g.Max[i] = make([]compare.Float, len(xv))
		for j := range g.Max[i] {
			g.Max[i][j] = compare.Float(math.NaN())
		}
	}
	for k, e := range cells {
		i, j := binIndex(yv, yw, k[0]), binIndex(xv, xw, k[1])
		if cur := float64(g.Max[i][j]); math.IsNaN(cur) || e > cur {
			g.Max[i][j] = compare.Float(e)
		}
	}
	return g
}

// binned returns the sorted values, or bin starts of equal width when there
// are more than maxGrid of them.
func binned(set map[int]bool) ([]int, int) {
	v := make([]int, 0, len(set))
	for x := range set {
		v = append(v, x)
	}
	sort.Ints(v)
	if len(v) <= maxGrid {
		return v, 0
	}
	w := (v[len(v)-1] - v[0] + maxGrid) / maxGrid
	var out []int
	for _, x := range v {
		b := v[0] + (x-v[0])/w*w
		if len(out) == 0 || out[len(out)-1] != b {
			out = append(out, b)
		}
	}
	return out, w
}

func binIndex(vals []int, width, v int) int {
	if width > 1 {
		v = vals[0] + (v-vals[0])/width*width
	}
	return sort.SearchInts(vals, v)
}

// tokenLike reports whether a coordinate counts tokens, so that page and
// split boundaries can be drawn on it.
func tokenLike(name string) bool {
	n := strings.ToLower(name)
	for _, s := range []string{"token", "context", "visible", "position", "seq_len", "split_start"} {
		if strings.Contains(n, s) {
			return true
		}
	}
	return false
}

// profileFromSignature rebuilds what can be drawn from a check's JSON
// alone: the mean err/tol of the signature's groups along its coordinate.
func profileFromSignature(c compare.Check) *Profile {
	s := c.Signature
	if s == nil || s.Coord == "" || len(s.Groups) < 2 || c.Mode == "bitwise" {
		return nil
	}
	g := append([]signature.Group(nil), s.Groups...)
	sort.Slice(g, func(i, j int) bool { return g[i].Value < g[j].Value })
	cp := CoordProfile{Name: s.Coord}
	for _, x := range g {
		cp.Values = append(cp.Values, x.Value)
		cp.Max = append(cp.Max, compare.Float(x.MeanExcess))
		cp.Mean = append(cp.Mean, compare.Float(x.MeanExcess))
		cp.Failing = append(cp.Failing, x.Failing)
		cp.Count = append(cp.Count, 0)
	}
	return &Profile{Tensor: c.Tensor, Coords: []CoordProfile{cp}, Axes: 0, FromSignature: true,
		Worst: c.Metrics.MaxExcess, Verdict: c.Verdict, Sampled: 1}
}
