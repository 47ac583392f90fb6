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
	// Sampled is 1 over the share of the clean elements the counts and
	// means come from (1: every element; signature.Profile samples an
	// output of more than 2^21 elements); every failing element is counted.
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
	// infinite: an element's err/tol is infinite (or NaN), which makes the
	// group's mean infinite too: the mean of its finite rest would look
	// better than the elements are (0 for an all-NaN output).
	infinite bool
}

// profileOf draws on the profile compare built for the check (the one the
// signature was read from): the report judges no element itself.
func profileOf(o check.Observation) (Profile, []int) {
	c := o.Check
	name := c.Tensor
	if o.Stage != "" {
		name = o.Stage + "." + name
	}
	p := Profile{Tensor: name, Kind: o.Kind, Kernel: o.Kernel, Bitwise: o.Ref != nil && o.Ref.Mode == kernel.Bitwise,
		Worst: c.Metrics.MaxExcess, Verdict: c.Verdict, Sampled: 1}
	if ps, err := strconv.Atoi(o.Params["page_size"]); err == nil && ps > 0 {
		p.PageSize = ps
	}
	sp := c.Profile
	if sp == nil || sp.N == 0 || o.Actual == nil {
		return p, nil
	}
	shape := o.Actual.Shape
	if tensor.NumElements(shape) != sp.N {
		shape = []int{sp.N}
	}
	p.Axes = len(shape)
	if sp.Rate < 1 {
		p.Sampled = int(math.Ceil(1 / sp.Rate))
	}
	var starts []int
	for _, cv := range sp.Coords() {
		m := make(map[int]*agg, len(cv.Values))
		for j, v := range cv.Values {
			m[v] = &agg{max: cv.Max[j], sum: cv.FiniteSum[j], count: int(math.Round(cv.Count[j])), fails: cv.Failing[j],
				infinite: math.IsInf(cv.Max[j], 1) || math.IsNaN(cv.Max[j])}
		}
		p.Coords = append(p.Coords, coordProfile(cv.Name, m))
		if cv.Kind == kernel.KindSplitStart {
			starts = append(starts, cv.Values...)
		}
	}
	if gy, gx, cells, ok := sp.Grid(); ok {
		p.Map = gridOf(gx, gy, cells)
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
