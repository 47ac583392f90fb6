package check

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/bounded"
	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/parallel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Resource bounds. The references run in this process, and Go cannot
// recover from running out of memory: the kernel kills the process, every
// result of a long run is lost and the user sees "Killed". So the working
// set of a reference is estimated from the shapes before it runs (a few
// header bytes can claim an output of a terabyte: seq_lens near 2^31 over a
// block table that points every request at the same pages is legal and
// small on disk), and a check whose estimate exceeds the bound is refused
// with the tensor and the numbers, verdict error. Time is bounded by a
// context deadline (RunContext).

// DefaultMaxMemory is the working-set bound when none is given: half the
// machine's physical memory, at most 8 GiB (8 GiB when it cannot be read).
func DefaultMaxMemory() int64 {
	const cap = 8 << 30
	if m := physicalMemory(); m > 0 && m/2 < cap {
		return max(m/2, 256<<20)
	}
	return cap
}

// physicalMemory reads MemTotal from /proc/meminfo (0 when unknown).
func physicalMemory() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			if err == nil && kb > 0 && kb < math.MaxInt64/1024 {
				return kb * 1024
			}
		}
	}
	return 0
}

// ParseBytes reads a memory size: a plain byte count or a number with a
// binary suffix (K, M, G, T, with or without "iB"/"B"): "8G", "512MiB",
// "1.5GiB". "0" and "unlimited" mean no bound (-1); any other size below
// one byte is an error.
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if t == "unlimited" || t == "0" {
		return -1, nil
	}
	up := strings.ToUpper(t)
	up = strings.TrimSuffix(strings.TrimSuffix(up, "IB"), "B")
	mult := 1.0
	if n := len(up); n > 0 {
		switch up[n-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult != 1 {
			up = up[:n-1]
		}
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(up), 64)
	if err != nil || v < 0 || math.IsNaN(v) || v*mult >= math.MaxInt64 {
		return 0, fmt.Errorf("memory size %q: want bytes or a number with K, M, G or T (binary units), e.g. 8G", s)
	}
	if v*mult < 1 {
		// Only the two spellings above turn the bound off: a size that
		// rounds below one byte ("0.5", "0B", "1e-300") is a slip, and
		// reading it as "no bound" would lift the bound the user meant to set.
		return 0, fmt.Errorf("memory size %q is less than one byte: give a size such as 8G, or 0 or unlimited for no bound", s)
	}
	return int64(v * mult), nil
}

// FormatBytes writes n in binary units, as the refusals print it.
func FormatBytes(n int64) string { return bounded.FormatBytes(n) }

// Estimate is a reference's working set and work, estimated from shapes
// before it runs. It errs on the large side: it counts every output twice
// in float64 (exact and expected), once more for the comparison and once
// for the stored reference output, plus the kernel's float64 copies of its
// inputs and its per-kernel intermediates. The outputs the size of a cache
// (kv_cache_write, kv_cache_gather) compute their values on demand and
// count only what they hold (lazyOutput).
type Estimate struct {
	// Bytes is the peak working set, saturating at about 2^61.
	Bytes int64
	// Ops is roughly the number of multiply-adds (for a timeout's message).
	Ops int64
	// What names the largest term: the tensor and shape behind it.
	What string
}

// sat is where the estimates saturate: far above any memory, and far
// enough below MaxInt64 that sums of a few saturated terms do not wrap.
const sat = math.MaxInt64 / 4

// mul multiplies non-negative sizes, saturating; a negative or zero factor
// gives 0 (such a shape is refused by the reference itself).
func mul(xs ...int64) int64 {
	r := int64(1)
	for _, x := range xs {
		if x <= 0 {
			return 0
		}
		if r > sat/x {
			return sat
		}
		r *= x
	}
	return r
}

func add(xs ...int64) int64 {
	r := int64(0)
	for _, x := range xs {
		r += max(x, 0)
		if r > sat {
			return sat
		}
	}
	return r
}

// outputBytes is what one output element costs: exact and expected float64
// (16), the comparison's per-element work (16), the stored reference
// output of a pipeline chain (8) and slack (8).
const outputBytes = 48

// estimator collects the terms of one estimate.
type estimator struct {
	e     Estimate
	terms []term
}

type term struct {
	what  string
	bytes int64
}

func (es *estimator) add(what string, bytes int64) {
	es.terms = append(es.terms, term{what, bytes})
	es.e.Bytes = add(es.e.Bytes, bytes)
}

func (es *estimator) ops(n int64) { es.e.Ops = add(es.e.Ops, n) }

// output adds an output of shape dims.
func (es *estimator) output(name string, dims ...int64) {
	es.add(fmt.Sprintf("output %s %s", name, fmtDims(dims)), mul(append(dims, outputBytes)...))
}

// lazyOutput adds an output of shape dims whose reference values are
// computed on demand (kernel.Values over the cache: kv_cache_write,
// kv_cache_gather), so that nothing is held per element but the output
// stored in its own dtype (elemSize bytes) where the reference backend or
// a pipeline chain stores it, and, when the check fails, the signature's
// bitmap of failing elements (a bit each) and its quantile selection
// (bounded: internal/signature). Its statistics per coordinate value are
// the caller's to add: they depend on the coordinates.
func (es *estimator) lazyOutput(name string, elemSize int64, dims ...int64) {
	n := mul(dims...)
	es.add(fmt.Sprintf("output %s %s", name, fmtDims(dims)), add(mul(n, elemSize), n/8+8, mul(min(n, 1<<20), 8), 1<<19))
}

// coordStatBytes is what the signature keeps per distinct value of a
// coordinate: four map entries and a sorted copy (generously).
const coordStatBytes = 256

// input adds a per-element cost for a decoded copy of an input.
func (es *estimator) input(name string, dims []int64, perElement int64) {
	es.add(fmt.Sprintf("input %s %s", name, fmtDims(dims)), mul(append(append([]int64(nil), dims...), perElement)...))
}

func (es *estimator) done() Estimate {
	// Fixed costs: lookup tables, the result, the process's own heap, the
	// comparison's per-CPU scratch.
	es.e.Bytes = add(es.e.Bytes, 1<<20, compare.ScratchBytes())
	if len(es.terms) > 0 {
		sort.SliceStable(es.terms, func(i, j int) bool { return es.terms[i].bytes > es.terms[j].bytes })
		es.e.What = es.terms[0].what
	}
	return es.e
}

func fmtDims(d []int64) string {
	s := make([]string, len(d))
	for i, v := range d {
		s[i] = strconv.FormatInt(v, 10)
		if v >= sat { // a saturated sum, not a size anyone gave
			s[i] = "more than 2^61"
		}
	}
	return "[" + strings.Join(s, ", ") + "]"
}

// shapes is what an estimate reads: every tensor's shape, and the values
// of seq_lens (the one input whose values set output sizes).
type shapes struct {
	dims    map[string][]int64
	dtypes  map[string]tensor.DType
	seqLens contexts // none when absent or unreadable
}

// contexts are the seq_lens of a batch: a list (a capture's tensor, a
// case's explicit seq_lens), or the generator's defaults for a case that
// gives none, first, first+1, ..., first+n-1, whose n is a number in a case
// file ("batch": 2^40) and so is never made into a list.
type contexts struct {
	list     []int64
	first, n int64 // the run, when list is nil
}

// count is the number of requests.
func (c contexts) count() int64 {
	if c.list != nil {
		return int64(len(c.list))
	}
	return max(c.n, 0)
}

// tokens returns Σ min(max(seq_len, 0), capacity) and the longest term.
func (c contexts) tokens(capacity int64) (total, longest int64) {
	if c.list != nil {
		for _, n := range c.list {
			n = min(max(n, 0), capacity)
			total = add(total, n)
			longest = max(longest, n)
		}
		return total, longest
	}
	if c.count() == 0 {
		return 0, 0
	}
	// first+i < capacity for the first k requests; the rest are clipped.
	k := min(max(capacity-c.first, 0), c.n)
	return satFloat(float64(k)*float64(c.first) + float64(k)*float64(k-1)/2 + float64(c.n-k)*float64(capacity)),
		min(c.first+c.n-1, capacity)
}

// blocks returns Σ ceil(seq_len / page) (the pages the requests own) and
// the most pages one request owns.
func (c contexts) blocks(page int64) (total, most int64) {
	if c.list != nil {
		for _, n := range c.list {
			nb := (max(n, 0) + page - 1) / page
			total = add(total, nb)
			most = max(most, nb)
		}
		return total, most
	}
	if c.count() == 0 {
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
	last := c.first + c.n - 1
	return satFloat(f(float64(c.first)+float64(c.n)) - f(float64(c.first))), (max(last, 0) + page - 1) / page
}

// satFloat converts a non-negative size to int64, saturating at sat.
func satFloat(v float64) int64 {
	if !(v < sat) {
		return sat
	}
	return int64(max(v, 0))
}

func (s shapes) dim(name string, i int) int64 {
	d := s.dims[name]
	if i < 0 {
		i += len(d)
	}
	if i < 0 || i >= len(d) {
		return 0
	}
	return d[i]
}

func (s shapes) numel(name string) int64 {
	d, ok := s.dims[name]
	if !ok {
		return 0
	}
	return mul(append(d, 1)...)
}

func shapesOf(ts map[string]*tensor.Tensor) shapes {
	s := shapes{dims: map[string][]int64{}, dtypes: map[string]tensor.DType{}}
	for name, t := range ts {
		d := make([]int64, len(t.Shape))
		for i, v := range t.Shape {
			d[i] = int64(v)
		}
		s.dims[name] = d
		s.dtypes[name] = t.DType
	}
	if t, ok := ts["seq_lens"]; ok && t.DType.IsInt() && t.Check() == nil {
		s.seqLens.list = make([]int64, t.Len())
		for i := range s.seqLens.list {
			s.seqLens.list[i] = t.Int64At(i)
		}
	}
	return s
}

// pageSize is the page size a paged kernel reads: the cache's second
// dimension, which the references require page_size to equal (a page_size
// that differs is refused by them, with a better message than an estimate
// built on it would give).
func (s shapes) pageSize(p kernel.Params, cache string) int64 {
	if d := s.dim(cache, 1); d > 0 {
		return d
	}
	return intParam(p, "page_size", 0)
}

// intParam reads an integer parameter, def when absent or unreadable (the
// reference reports unreadable ones itself).
func intParam(p kernel.Params, name string, def int64) int64 {
	v, err := p.Int(name, int(def))
	if err != nil {
		return def
	}
	return int64(v)
}

// tokens returns Σ min(seq_lens[b], capacity) over requests, the rows a
// gather produces (seq_lens beyond the block table's capacity are refused
// by the reference, which says so better), and the longest one.
func (s shapes) tokens(capacity int64) (total, longest int64) { return s.seqLens.tokens(capacity) }

// workers is how many goroutines the references run (GOMAXPROCS), each with
// its own buffers.
func workers() int { return max(runtime.GOMAXPROCS(0), 1) }

// EstimateKernel estimates kernel kname's reference on inputs in, with
// parameters p. An unknown kernel estimates at the fixed costs only (the
// check refuses it anyway).
func EstimateKernel(kname string, in map[string]*tensor.Tensor, p kernel.Params) Estimate {
	return estimate(kname, shapesOf(in), p)
}

func estimate(kname string, s shapes, p kernel.Params) Estimate {
	es := &estimator{}
	switch kname {
	case "nvfp4_quantize":
		m, k := s.dim("x", 0), s.dim("x", 1)
		// x decoded (8), codes (1), their inputs (8), packed and scales out.
		es.input("x", []int64{m, k}, 24)
		es.output("packed", m, k/2+1)
		es.output("block_scale", m+128, k/16+4)
		es.ops(mul(m, k, 16))
	case "nvfp4_dequantize":
		m, k := s.dim("packed", 0), mul(s.dim("packed", 1), 2)
		es.input("packed", []int64{m, k}, 16)
		es.output("out", m, k)
		es.ops(mul(m, k))
	case "nvfp4_gemm":
		m, n, k := s.dim("a_packed", 0), s.dim("b_packed", 0), mul(s.dim("a_packed", 1), 2)
		es.input("a_packed", []int64{m, k}, 24) // dequantized float32 and float64
		es.input("b_packed", []int64{n, k}, 24)
		es.output("out", m, n)
		es.ops(mul(m, n, k, 2))
	case "kv_cache_write":
		// cache_after is cache_before with the written entries computed on
		// demand from their tokens (kvcache.Overlay): no copy of the cache
		// but the stored output, in the cache's dtype (2 bytes at most).
		d := s.dims["cache_before"]
		es.lazyOutput("cache_after", 2, d...)
		t := s.dim("kv_c", 0)
		es.input("kv_c", []int64{t, add(s.dim("kv_c", 1), s.dim("k_pe", 1))}, 16)
		// the duplicate check's map (64), the overlay's slot list (16) and
		// fp8_ds_mla's tile amaxes (32), per token
		es.input("slot_mapping", []int64{s.numel("slot_mapping")}, 64+16+32)
		// the signature's statistics: per block, page offset, column and token
		es.add("signature statistics of cache_after", mul(add(s.dim("cache_before", 0), s.dim("cache_before", 1), s.dim("cache_before", 2), t, 8), coordStatBytes))
		es.ops(mul(t, add(s.dim("kv_c", 1), s.dim("k_pe", 1))))
	case "kv_cache_gather":
		page := s.pageSize(p, "cache")
		rows, _ := s.tokens(mul(s.dim("block_table", 1), page))
		d := s.dim("cache", 2)
		if p.String("kv_cache_dtype", "bf16") == "fp8_ds_mla" {
			d = 576
		}
		// Rows are dequantized on demand from the cache (a row at a time):
		// the stored output (F32 at most), the three-way policy's and the
		// signature's statistics per row (and per request, token, page...).
		es.lazyOutput("gathered", 4, rows, d)
		es.add(fmt.Sprintf("statistics of %d gathered rows", rows), mul(add(rows, s.dim("cache", 0), d, 8), coordStatBytes))
		es.input("block_table", s.dims["block_table"], 8)
		es.ops(mul(rows, d, 2))
	case "mla_decode", "mla_decode_sparse":
		b, sq, h, d := s.dim("q", 0), s.dim("q", 1), s.dim("q", 2), s.dim("q", 3)
		l := d
		if d > 64 {
			l = d - 64
		}
		l = max(intParam(p, "latent_dim", l), 1)
		// q decoded, packed and transposed per request.
		es.input("q", []int64{b, sq, h, d}, 32)
		// Each worker holds a block of cache rows (exact and as the expected
		// kernel holds them), its values in float32, and per query row its
		// accumulators and block probabilities (reference/mla worker).
		const block = 64
		perWorker := add(mul(block, d, 24), mul(block, l, 4), mul(h, sq, add(mul(l, 16), mul(d, 16), 2048)))
		es.add(fmt.Sprintf("%d reference workers' buffers", workers()), mul(int64(workers()), perWorker))
		es.output("out", b, sq, h, l)
		es.output("lse", b, h, sq)
		if kname == "mla_decode_sparse" {
			topk := s.dim("indices", 2)
			es.input("indices", []int64{b, sq, topk}, 16)
			es.ops(mul(b, sq, h, topk, d, 2))
			break
		}
		page := s.pageSize(p, "kv_cache")
		total, _ := s.tokens(mul(s.dim("block_table", 1), page))
		splits := intParam(p, "num_splits", 0)
		if po := s.dims["partial_out"]; len(po) == 5 { // a capture's partials give S (reference/CONTRACTS.md §3.6.1)
			splits = max(splits, po[3])
		}
		if sb, ok := s.dims["split_bounds"]; ok && len(sb) == 2 {
			splits = max(splits, sb[1]-1)
			es.input("split_bounds", sb, 8)
		}
		passes := int64(2) // exact and expected
		if splits > 0 {
			es.output("partial_out", b, sq, h, splits, l)
			es.output("partial_lse", b, sq, h, splits)
			passes = 4
		}
		es.ops(mul(total, sq, h, d, passes))
	case "splitk_combine":
		n, sp, l := s.dim("partial_out", 0), s.dim("partial_out", 1), s.dim("partial_out", 2)
		// the fp32 partials are read in place, or copied (4 bytes) when
		// the file's data is not 4-byte aligned
		es.input("partial_out", []int64{n, sp, l}, 4)
		es.input("partial_lse", []int64{n, sp}, 8)
		es.output("out", n, l)
		es.output("lse", n)
		es.ops(mul(n, sp, l, 2))
	case "dsa_indexer":
		b := s.dim("q", 0)
		page := s.pageSize(p, "k_cache")
		total, longest := s.tokens(mul(s.dim("block_table", 1), page))
		width := max(intParam(p, "max_seq", -1), longest)
		if width < 0 {
			width = 0
		}
		es.output("scores", b, width)
		es.add(fmt.Sprintf("scores bound [%d, %d]", b, width), mul(b, width, 8))
		topk := intParam(p, "topk", s.dim("topk_indices", 1))
		es.output("topk_indices", b, topk)
		es.input("top-k candidates of one request", []int64{longest}, 8)
		es.ops(mul(total, s.dim("q", 1), s.dim("q", 2)))
	}
	return es.done()
}

// Estimator adds up an estimate outside this package (the simulated
// decoder's, internal/diagnose) with the same saturating arithmetic and
// the same fixed costs.
type Estimator struct{ es estimator }

// MulSizes and AddSizes are the estimates' saturating product and sum of
// non-negative sizes, for estimates made outside this package.
func MulSizes(xs ...int64) int64 { return mul(xs...) }

// AddSizes is the saturating sum (see MulSizes).
func AddSizes(xs ...int64) int64 { return add(xs...) }

// Add adds a term named what of the product of factors bytes.
func (e *Estimator) Add(what string, factors ...int64) { e.es.add(what, mul(factors...)) }

// AddEstimate adds another estimate (a kernel's, EstimateKernel) as one term.
func (e *Estimator) AddEstimate(sub Estimate) {
	e.es.add(sub.What, sub.Bytes)
	e.es.ops(sub.Ops)
}

// Estimate is the sum of the terms and the fixed costs, named by the largest term.
func (e *Estimator) Estimate() Estimate { return e.es.done() }

// CheckMemory refuses what ("the simulation") when its estimate e exceeds
// limit (0: DefaultMaxMemory, negative: no bound).
func CheckMemory(e Estimate, limit int64, what string) error { return within(e, limit, what) }

// ErrMemory is wrapped by the refusals of a check whose estimated working
// set exceeds the bound.
var ErrMemory = errors.New("over the memory bound")

type memoryError struct {
	e     Estimate
	limit int64
	what  string
}

func (m memoryError) Error() string {
	about := "about "
	if m.e.Bytes >= sat {
		about = "" // FormatBytes says "more than 2^61 B"
	}
	return fmt.Sprintf("%s needs %s%s (the largest part: %s), more than the memory bound %s: refused (raise it with --max-memory)",
		m.what, about, FormatBytes(m.e.Bytes), m.e.What, FormatBytes(m.limit))
}

func (m memoryError) Unwrap() error { return ErrMemory }

// within returns an error when e exceeds limit (limit < 0: no bound, 0:
// the default). what says whose estimate it is ("the mla_decode reference").
func within(e Estimate, limit int64, what string) error {
	if limit == 0 {
		limit = DefaultMaxMemory()
	}
	if limit > 0 && e.Bytes > limit {
		return memoryError{e, limit, what}
	}
	return nil
}

// readLimit is the bound on numpy array bytes read into memory for a
// memory bound (0: the default; negative: none).
func readLimit(maxMemory int64) int64 {
	if maxMemory == 0 {
		return DefaultMaxMemory()
	}
	return maxMemory
}

// CheckKernelMemory refuses kernel kname on in when its estimated working
// set exceeds limit (0: DefaultMaxMemory, negative: no bound).
func CheckKernelMemory(kname string, in map[string]*tensor.Tensor, p kernel.Params, limit int64) error {
	return within(EstimateKernel(kname, in, p), limit, "the "+kname+" reference")
}

// EstimateCase estimates a catalog case before anything is built: the
// input generator's float64 values and tensors, plus the reference (which
// is also what the reference and faulty backends run) on the inputs it
// would build. It mirrors the generator's defaults (cases/build.go) and
// rounds up where it has to guess.
func EstimateCase(c cases.Case) Estimate {
	s := shapes{dims: map[string][]int64{}, dtypes: map[string]tensor.DType{}}
	p := kernel.Params{}
	if meta, err := c.Metadata(); err == nil {
		for k, v := range meta {
			p[k] = v
		}
	}
	es := &estimator{}
	switch c.Kernel {
	case "nvfp4_quantize", "nvfp4_dequantize", "nvfp4_gemm":
		m, k, n := int64(c.M), int64(c.K), int64(c.N)
		if m == 0 {
			m = 32
		}
		if k == 0 {
			k = 256
		}
		if n == 0 {
			n = 64
		}
		es.input("x", []int64{m, k}, 48) // generated float64, bf16, quantized
		s.dims["x"] = []int64{m, k}
		s.dims["packed"] = []int64{m, k / 2}
		s.dims["a_packed"] = []int64{m, k / 2}
		s.dims["b_packed"] = []int64{n, k / 2}
		if c.Kernel == "nvfp4_gemm" {
			es.input("b", []int64{n, k}, 48)
		}
	default:
		g := caseGeometry(c)
		d := g.latent + g.rope
		blocks, maxBlocks := g.seqLens.blocks(g.page)
		tokens, _ := g.seqLens.tokens(sat)
		blocks = add(blocks, 2)
		maxBlocks = max(maxBlocks, 1)
		s.seqLens = g.seqLens
		b := g.seqLens.count()
		// The generator draws every token's values in float64, writes them
		// through the cache reference, and builds the block table.
		es.input("generated tokens", []int64{tokens, d}, 40)
		es.input("cache", []int64{blocks, g.page, add(d, 80)}, 2*4)
		es.input("block_table", []int64{b, maxBlocks}, 16)
		s.dims["block_table"] = []int64{b, maxBlocks}
		s.dims["seq_lens"] = []int64{b}
		switch c.Kernel {
		case "kv_cache_write":
			s.dims["cache_before"] = []int64{blocks, g.page, add(d, 80)}
			s.dims["kv_c"] = []int64{tokens, g.latent}
			s.dims["k_pe"] = []int64{tokens, g.rope}
			s.dims["slot_mapping"] = []int64{tokens}
		case "kv_cache_gather":
			s.dims["cache"] = []int64{blocks, g.page, d}
		case "mla_decode", "mla_decode_sparse":
			s.dims["q"] = []int64{b, g.sq, g.heads, d}
			s.dims["kv_cache"] = []int64{blocks, g.page, d}
			if c.Kernel == "mla_decode_sparse" {
				topk := int64(c.TopK)
				if topk <= 0 {
					topk = 2048 // the largest preset's; the default is 64
				}
				s.dims["indices"] = []int64{b, g.sq, topk}
				// one permutation of the context per query row
				_, longest := s.tokens(sat)
				es.input("index permutation of one query", []int64{longest}, 8)
				es.input("indices", []int64{b, g.sq, topk}, 16)
			}
		case "splitk_combine":
			sp := max(g.splits, 4)
			n := mul(b, g.sq, g.heads)
			es.input("partial_out", []int64{n, sp, g.latent}, 24)
			s.dims["partial_out"] = []int64{n, sp, g.latent}
			s.dims["partial_lse"] = []int64{n, sp}
		case "dsa_indexer":
			heads := max(g.heads, 64)
			s.dims["q"] = []int64{b, heads, 128}
			s.dims["k_cache"] = []int64{blocks, g.page, 128}
			es.input("k_cache", []int64{blocks, g.page, 128}, 16)
		}
	}
	ref := estimate(c.Kernel, s, p)
	es.add(ref.What, ref.Bytes)
	es.ops(ref.Ops)
	return es.done()
}

type geometry struct {
	heads, latent, rope, sq, page, splits int64
	seqLens                               contexts
}

// caseGeometry mirrors cases' geometry defaults, rounding up where a
// preset or tp is unreadable (the case's own validation reports those).
func caseGeometry(c cases.Case) geometry {
	g := geometry{heads: 128, latent: 512, rope: 64, sq: int64(c.SQ), page: int64(c.PageSize), splits: int64(c.Splits)}
	name := c.Preset
	if name == "" {
		name = "deepseek-v3"
	}
	if pr, err := cases.LookupPreset(name); err == nil {
		g.heads, g.latent, g.rope = int64(pr.Heads), int64(pr.Latent), int64(pr.Rope)
		tp := c.TP
		if tp == 0 {
			tp = 1
		}
		if h, err := pr.HeadsFor(tp); err == nil {
			g.heads = int64(h)
		}
	}
	if c.Heads > 0 {
		g.heads = int64(c.Heads)
	}
	if c.Latent > 0 {
		g.latent = int64(c.Latent)
	}
	if c.Rope > 0 {
		g.rope = int64(c.Rope)
	}
	g.sq = max(g.sq, 1)
	if g.page <= 0 {
		g.page = 64
	}
	for _, n := range c.SeqLens {
		g.seqLens.list = append(g.seqLens.list, int64(n))
	}
	if len(g.seqLens.list) == 0 {
		b := int64(max(c.Batch, 0))
		if b == 0 {
			b = 2
		}
		g.seqLens = contexts{first: 4*g.page + 1, n: b} // cases' defaults
	}
	return g
}

// CheckCaseMemory refuses case c when its estimate exceeds limit (0:
// DefaultMaxMemory, negative: no bound).
func CheckCaseMemory(c cases.Case, limit int64) error {
	return within(EstimateCase(c), limit, "case "+c.Name)
}

// ErrTimeout is wrapped by the error of a check that ran past its deadline,
// reading its file included (the readers' own: internal/bounded).
var ErrTimeout = bounded.ErrTimeout

// deadlineError says how long a check ran and how much work it had.
func deadlineError(ctx context.Context, started time.Time, what string) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return fmt.Errorf("%s: interrupted after %v: %w", what, time.Since(started).Round(time.Millisecond), context.Canceled)
	}
	return fmt.Errorf("%s: %w after %v (the per-file time limit; raise it with --timeout)", what, ErrTimeout, time.Since(started).Round(time.Millisecond))
}

// InternalErrorPrefix starts the error of a check that panicked: a kcheck
// bug, which the fuzz targets look for.
const InternalErrorPrefix = "internal error: "

// interrupted returns the context's error, wrapped, once RunContext's
// context is done (nil without one).
func (o Options) interrupted() error {
	if o.ctx == nil || o.ctx.Err() == nil {
		return nil
	}
	if errors.Is(o.ctx.Err(), context.Canceled) {
		return fmt.Errorf("interrupted: %w", context.Canceled)
	}
	return fmt.Errorf("%w (the per-file time limit; raise it with --timeout)", ErrTimeout)
}

// stopped turns the error of a reference or comparison that stopped because
// RunContext's context is done into interrupted's (timed out, or
// interrupted); any other error is returned as it is.
func (o Options) stopped(err error) error {
	if err != nil && o.ctx != nil && o.ctx.Err() != nil && errors.Is(err, o.ctx.Err()) {
		return o.interrupted()
	}
	return err
}

// RunContext is Run under ctx: when ctx is done (a deadline, an interrupt)
// the result is verdict error, saying so. The references and the
// comparison stop soon after ctx is done and are waited for; the check's
// estimated working set is charged against the memory bound while it runs
// and, should it not stop within a grace period, until it does
// (inflight.go), so timed-out checks cannot pile up in memory.
func RunContext(ctx context.Context, c Capture, opts Options) Result {
	return runContext(ctx, c, opts, func() {})
}

// FileContext is File under ctx (see RunContext), loading included: a file
// that cannot be opened or read before ctx is done (a named pipe with no
// writer) gets verdict error at the deadline. The file stays mapped until
// the check has returned, waited for or not.
func FileContext(ctx context.Context, path string, extraMeta map[string]string, opts Options) Result {
	c, closeFn, err := LoadContext(ctx, path, extraMeta, opts.MaxMemory)
	if err != nil {
		if errors.Is(err, ErrTimeout) {
			err = fmt.Errorf("%w (the per-file time limit; raise it with --timeout)", err)
		}
		return errorResult(path, "", err)
	}
	return runContext(ctx, c, opts, closeFn)
}

// RunLoaded is RunContext on a capture that LoadContext returned, with
// its closeFn: the mapping is released once the check has returned,
// whether its result was waited for or abandoned at ctx's deadline (a
// reference left running still reads it).
func RunLoaded(ctx context.Context, c Capture, closeFn func(), opts Options) Result {
	return runContext(ctx, c, opts, closeFn)
}

// runContext runs c under ctx and calls release once Run has returned,
// whether or not its result was waited for.
func runContext(ctx context.Context, c Capture, opts Options, release func()) Result {
	if ctx == nil {
		ctx = context.Background()
	}
	started := time.Now()
	kname := c.Metadata["kcheck.kernel"]
	if ctx.Err() != nil {
		release()
		return errorResult(c.Name, kname, deadlineError(ctx, started, "not started"))
	}
	opts.ctx = ctx
	// A check past its deadline must not report to the caller's observer (a
	// report's recorder) while the caller has moved on to the next file.
	var mu sync.Mutex
	abandoned := false
	if observe := opts.Observe; observe != nil {
		opts.Observe = func(o Observation) {
			mu.Lock()
			defer mu.Unlock()
			if !abandoned {
				observe(o)
			}
		}
	}
	// What a timeout would report is worked out before the check starts:
	// a check left running releases the file (unmapping its tensors) when
	// it finishes, so nothing here may read c.Tensors once it is running.
	what := "the check"
	if kname != "" {
		what = "the " + kname + " check"
	}
	var e Estimate // it reads seq_lens: guarded, as Run is, against the file shrinking
	if err := Guard(c, func() { e = estimateCapture(c) }); err != nil {
		release()
		return errorResult(c.Name, kname, err)
	}
	if e.Ops > 1e6 {
		what += fmt.Sprintf(" (about %.1e multiply-adds)", float64(e.Ops))
	}
	r, finished, err := Charged(ctx, e.Bytes, opts.MaxMemory, func() Result {
		defer release()
		return Run(c, opts)
	})
	switch {
	case err != nil:
		release()
		return errorResult(c.Name, kname, fmt.Errorf("%s: %w", deadlineError(ctx, started, "not started"), err))
	case ctx.Err() != nil || !finished:
		mu.Lock()
		abandoned = true
		mu.Unlock()
		return errorResult(c.Name, kname, deadlineError(ctx, started, what))
	}
	return r
}

// estimateCapture estimates a check of c: its kernel's reference, or a
// pipeline's largest stage (the stages run one after another).
func estimateCapture(c Capture) Estimate {
	kname := c.Metadata["kcheck.kernel"]
	if kname != "pipeline" {
		return EstimateKernel(kname, c.Tensors, params(c.Metadata))
	}
	var largest Estimate
	var ops int64
	stages, err := parseStages(c.Metadata)
	if err != nil {
		return EstimateKernel(kname, nil, nil) // refused by the check itself
	}
	for _, st := range stages {
		in, err := stageInputs(st, c.Tensors, c.Tensors)
		if err != nil {
			continue
		}
		e := EstimateKernel(st.k.Spec().Name, in, st.params)
		if e.Bytes > largest.Bytes {
			largest = e
		}
		ops = add(ops, e.Ops)
	}
	largest.Ops = ops
	return largest
}

// panicSite names the function and line that panicked, for the report of
// an internal error (called from the deferred recover).
func panicSite() string { return parallel.Site(4) }
