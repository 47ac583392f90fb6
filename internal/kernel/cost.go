package kernel

import (
	"fmt"
	"math"
	"runtime"
	"sort"
	"strconv"
	"strings"

	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Estimate is a reference's working set and work, estimated from shapes
// before it runs. It errs on the large side: it counts every output twice
// in float64 (exact and expected), once more for the comparison and once
// for the stored reference output, plus the kernel's float64 copies of its
// inputs and its per-kernel intermediates. The outputs the size of a cache
// (kv_cache_write, kv_cache_gather, kv_cache_transfer) and of a weight
// (nvfp4_dequantize's, read from its codes) compute their values on
// demand and count only what they hold (LazyOutput).
type Estimate struct {
	// Bytes is the peak working set, saturating at about 2^61.
	Bytes int64
	// Ops is roughly the number of multiply-adds (for a timeout's message).
	Ops int64
	// What names the largest term: the tensor and shape behind it.
	What string
}

// Saturated is where the estimates saturate: far above any memory, and
// far enough below MaxInt64 that sums of a few saturated terms do not wrap.
const Saturated = math.MaxInt64 / 4

// MulSizes multiplies non-negative sizes, saturating; a negative or zero
// factor gives 0 (such a shape is refused by the reference itself).
func MulSizes(xs ...int64) int64 {
	r := int64(1)
	for _, x := range xs {
		if x <= 0 {
			return 0
		}
		if r > Saturated/x {
			return Saturated
		}
		r *= x
	}
	return r
}

// AddSizes is the saturating sum of non-negative sizes (a negative one
// counts 0).
func AddSizes(xs ...int64) int64 {
	r := int64(0)
	for _, x := range xs {
		r += max(x, 0)
		if r > Saturated {
			return Saturated
		}
	}
	return r
}

// SatFloat converts a non-negative size to int64, saturating.
func SatFloat(v float64) int64 {
	if !(v < Saturated) {
		return Saturated
	}
	return int64(max(v, 0))
}

// OutputBytes is what one output element costs: exact and expected float64
// (16), the comparison's per-element work (16), the stored reference
// output of a pipeline chain (8) and slack (8).
const OutputBytes = 48

// CoordStatBytes is what the signature keeps per distinct value of a
// coordinate: four map entries and a sorted copy (generously).
const CoordStatBytes = 256

// Cost collects the terms of one estimate: a Coster adds its kernel's.
type Cost struct {
	e     Estimate
	terms []costTerm
}

type costTerm struct {
	what  string
	bytes int64
}

// Add adds a term named what of bytes.
func (c *Cost) Add(what string, bytes int64) {
	c.terms = append(c.terms, costTerm{what, bytes})
	c.e.Bytes = AddSizes(c.e.Bytes, bytes)
}

// Ops adds n multiply-adds of work.
func (c *Cost) Ops(n int64) { c.e.Ops = AddSizes(c.e.Ops, n) }

// Output adds an output of shape dims.
func (c *Cost) Output(name string, dims ...int64) {
	c.Add(fmt.Sprintf("output %s %s", name, FormatDims(dims)), MulSizes(append(dims, OutputBytes)...))
}

// LazyOutput adds an output of shape dims whose reference values are
// computed on demand (Values over the cache: kv_cache_write,
// kv_cache_gather; over the codes: nvfp4_dequantize), so that nothing is
// held per element but the output stored in its own dtype (elemSize
// bytes) where the reference backend or a pipeline chain stores it, and,
// when the check fails, the signature's
// bitmap of failing elements (a bit each) and its quantile selection
// (bounded: internal/signature). Its statistics per coordinate value are
// the caller's to add: they depend on the coordinates.
func (c *Cost) LazyOutput(name string, elemSize int64, dims ...int64) {
	n := MulSizes(dims...)
	c.Add(fmt.Sprintf("output %s %s", name, FormatDims(dims)), AddSizes(MulSizes(n, elemSize), n/8+8, MulSizes(min(n, 1<<20), 8), 1<<19))
}

// Input adds a per-element cost for a decoded copy of an input.
func (c *Cost) Input(name string, dims []int64, perElement int64) {
	c.Add(fmt.Sprintf("input %s %s", name, FormatDims(dims)), MulSizes(append(append([]int64(nil), dims...), perElement)...))
}

// AddEstimate adds another estimate as one term.
func (c *Cost) AddEstimate(e Estimate) {
	c.Add(e.What, e.Bytes)
	c.Ops(e.Ops)
}

// Estimate is the sum of the terms plus fixed bytes, named by the largest
// term.
func (c *Cost) Estimate(fixed int64) Estimate {
	e := c.e
	e.Bytes = AddSizes(e.Bytes, fixed)
	if len(c.terms) > 0 {
		terms := append([]costTerm(nil), c.terms...)
		sort.SliceStable(terms, func(i, j int) bool { return terms[i].bytes > terms[j].bytes })
		e.What = terms[0].what
	}
	return e
}

// FormatDims writes a shape of sizes as an estimate's term names it.
func FormatDims(d []int64) string {
	s := make([]string, len(d))
	for i, v := range d {
		s[i] = strconv.FormatInt(v, 10)
		if v >= Saturated { // a saturated sum, not a size anyone gave
			s[i] = "more than 2^61"
		}
	}
	return "[" + strings.Join(s, ", ") + "]"
}

// Shapes is what an estimate reads: every tensor's shape, and the values
// of seq_lens (the one input whose values set output sizes).
type Shapes struct {
	Dims    map[string][]int64
	DTypes  map[string]tensor.DType
	SeqLens Contexts // none when absent or unreadable
}

// NewShapes returns empty Shapes to fill in.
func NewShapes() Shapes {
	return Shapes{Dims: map[string][]int64{}, DTypes: map[string]tensor.DType{}}
}

// ShapesOf reads the shapes of ts, and seq_lens' values.
func ShapesOf(ts map[string]*tensor.Tensor) Shapes {
	s := NewShapes()
	for name, t := range ts {
		d := make([]int64, len(t.Shape))
		for i, v := range t.Shape {
			d[i] = int64(v)
		}
		s.Dims[name] = d
		s.DTypes[name] = t.DType
	}
	if t, ok := ts["seq_lens"]; ok && t.DType.IsInt() && t.Check() == nil {
		s.SeqLens.List = make([]int64, t.Len())
		for i := range s.SeqLens.List {
			s.SeqLens.List[i] = t.Int64At(i)
		}
	}
	return s
}

// Dim is dimension i of tensor name (negative i counts from the end), 0
// when it has none.
func (s Shapes) Dim(name string, i int) int64 {
	d := s.Dims[name]
	if i < 0 {
		i += len(d)
	}
	if i < 0 || i >= len(d) {
		return 0
	}
	return d[i]
}

// Numel is the element count of tensor name (0 when absent).
func (s Shapes) Numel(name string) int64 {
	d, ok := s.Dims[name]
	if !ok {
		return 0
	}
	return MulSizes(append(d, 1)...)
}

// PageSize is the page size a paged kernel reads: the cache's second
// dimension, which the references require page_size to equal (a page_size
// that differs is refused by them, with a better message than an estimate
// built on it would give).
func (s Shapes) PageSize(p Params, cache string) int64 {
	if d := s.Dim(cache, 1); d > 0 {
		return d
	}
	return IntParam(p, "page_size", 0)
}

// Tokens returns Σ min(seq_lens[b], capacity) over requests, the rows a
// gather produces (seq_lens beyond the block table's capacity are refused
// by the reference, which says so better), and the longest one.
func (s Shapes) Tokens(capacity int64) (total, longest int64) { return s.SeqLens.Tokens(capacity) }

// IntParam reads an integer parameter for an estimate, def when absent or
// unreadable (the reference reports unreadable ones itself).
func IntParam(p Params, name string, def int64) int64 {
	v, err := p.Int(name, int(def))
	if err != nil {
		return def
	}
	return int64(v)
}

// Workers is how many goroutines the references run (GOMAXPROCS), each
// with its own buffers.
func Workers() int { return max(runtime.GOMAXPROCS(0), 1) }

// Contexts are the seq_lens of a batch: a list (a capture's tensor, a
// case's explicit seq_lens), or the generator's defaults for a case that
// gives none, First, First+1, ..., First+N-1, whose N is a number in a case
// file ("batch": 2^40) and so is never made into a list.
type Contexts struct {
	List     []int64
	First, N int64 // the run, when List is nil
}

// Count is the number of requests.
func (c Contexts) Count() int64 {
	if c.List != nil {
		return int64(len(c.List))
	}
	return max(c.N, 0)
}

// Tokens returns Σ min(max(seq_len, 0), capacity) and the longest term.
func (c Contexts) Tokens(capacity int64) (total, longest int64) {
	if c.List != nil {
		for _, n := range c.List {
			n = min(max(n, 0), capacity)
			total = AddSizes(total, n)
			longest = max(longest, n)
		}
		return total, longest
	}
	if c.Count() == 0 {
		return 0, 0
	}
	// First+i < capacity for the first k requests; the rest are clipped.
	k := min(max(capacity-c.First, 0), c.N)
	return SatFloat(float64(k)*float64(c.First) + float64(k)*float64(k-1)/2 + float64(c.N-k)*float64(capacity)),
		min(c.First+c.N-1, capacity)
}

// Blocks returns Σ ceil(seq_len / page) (the pages the requests own) and
// the most pages one request owns.
func (c Contexts) Blocks(page int64) (total, most int64) {
	if c.List != nil {
		for _, n := range c.List {
			nb := (max(n, 0) + page - 1) / page
			total = AddSizes(total, nb)
			most = max(most, nb)
		}
		return total, most
	}
	if c.Count() == 0 {
		return 0, 0
	}
	// F(N) = Σ_{m<N} ceil(m/P): for m = qP + r, ceil(m/P) is q, plus 1
	// when r > 0; over full rows of P that is P·q(q-1)/2 + q(P-1), and
	// the last partial row of r adds r·q + max(r-1, 0). Float64 is exact
	// for every sum a memory could hold and saturates beyond.
	p := float64(page)
	f := func(n float64) float64 {
		q := math.Floor(n / p)
		r := n - q*p
		return p*q*(q-1)/2 + q*(p-1) + r*q + max(r-1, 0)
	}
	last := c.First + c.N - 1
	return SatFloat(f(float64(c.First)+float64(c.N)) - f(float64(c.First))), (max(last, 0) + page - 1) / page
}
