package check

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"github.com/kcheck-dev/kcheck/internal/evidence"
	"math"
	"os"

	"strconv"
	"strings"
	"time"

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
// context deadline (Run).

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

// estimator collects the terms of one estimate: kernel.Cost, with the
// check's own fixed costs added when it is done.
type estimator struct{ c kernel.Cost }

func (es *estimator) add(what string, bytes int64) { es.c.Add(what, bytes) }

func (es *estimator) ops(n int64) { es.c.Ops(n) }

func (es *estimator) input(name string, dims []int64, perElement int64) {
	es.c.Input(name, dims, perElement)
}

// done adds the fixed costs: lookup tables, the result, the process's own
// heap, the comparison's per-CPU scratch.
func (es *estimator) done() kernel.Estimate {
	return es.c.Estimate(kernel.AddSizes(1<<20, compare.ScratchBytes()))
}

// EstimateKernel estimates kernel kname's reference on inputs in, with
// parameters p. An unknown kernel estimates at the fixed costs only (the
// check refuses it anyway).
func EstimateKernel(kname string, in map[string]*tensor.Tensor, p kernel.Params) kernel.Estimate {
	return estimate(kname, kernel.ShapesOf(in), p)
}

func estimate(kname string, s kernel.Shapes, p kernel.Params) kernel.Estimate {
	es := &estimator{}
	if k, err := kernel.Lookup(kname); err == nil {
		k.(kernel.Coster).Cost(s, p, &es.c)
	}
	return es.done()
}

// Estimator adds up an estimate outside this package (the simulated
// decoder's, internal/sim) with the same saturating arithmetic and
// the same fixed costs.
type Estimator struct{ es estimator }

// Add adds a term named what of the product of factors bytes.
func (e *Estimator) Add(what string, factors ...int64) { e.es.add(what, kernel.MulSizes(factors...)) }

// AddEstimate adds another estimate (a kernel's, EstimateKernel) as one term.
func (e *Estimator) AddEstimate(sub kernel.Estimate) { e.es.c.AddEstimate(sub) }

// Estimate is the sum of the terms and the fixed costs, named by the largest term.
func (e *Estimator) Estimate() kernel.Estimate { return e.es.done() }

// ErrMemory is wrapped by the refusals of a check whose estimated working
// set exceeds the bound.
var ErrMemory = errors.New("over the memory bound")

type memoryError struct {
	e     kernel.Estimate
	limit int64
	what  string
}

func (m memoryError) Error() string {
	about := "about "
	if m.e.Bytes >= kernel.Saturated {
		about = "" // FormatBytes says "more than 2^61 B"
	}
	return fmt.Sprintf("%s needs %s%s (the largest part: %s), more than the memory bound %s: refused (raise it with --max-memory)",
		m.what, about, bounded.FormatBytes(m.e.Bytes), m.e.What, bounded.FormatBytes(m.limit))
}

func (m memoryError) Unwrap() error { return ErrMemory }

// CheckMemory returns an error when e exceeds limit (limit < 0: no bound, 0:
// the default). what says whose estimate it is ("the mla_decode reference").
func CheckMemory(e kernel.Estimate, limit int64, what string) error {
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
	return CheckMemory(EstimateKernel(kname, in, p), limit, "the "+kname+" reference")
}

// EstimateCase estimates a catalog case before anything is built: the
// input generator's own memory and the tensors it makes (its kernel's
// Generator.PlanCost), plus the reference (which is also what the
// reference and faulty backends run) on the inputs it would build, with
// the case's parameters (c.Params). An unknown kernel estimates at the
// fixed costs only (the case is refused anyway).
func EstimateCase(c kernel.Case) kernel.Estimate {
	es := &estimator{}
	k, err := kernel.Lookup(c.Kernel)
	if err != nil {
		return es.done()
	}
	s := k.(kernel.Generator).PlanCost(c, &es.c)
	es.c.AddEstimate(estimate(c.Kernel, s, c.Params))
	return es.done()
}

// CheckCaseMemory refuses case c when its estimate exceeds limit (0:
// DefaultMaxMemory, negative: no bound).
func CheckCaseMemory(c kernel.Case, limit int64) error {
	return CheckMemory(EstimateCase(c), limit, "case "+c.Name)
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

// interrupted returns the context's error, wrapped, once Run's context is
// done (nil without one).
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
// Run's context is done into interrupted's (timed out, or interrupted); any
// other error is returned as it is.
func (o Options) stopped(err error) error {
	if err != nil && o.ctx != nil && o.ctx.Err() != nil && errors.Is(err, o.ctx.Err()) {
		return o.interrupted()
	}
	return err
}

// Run checks one capture under ctx and returns when the check is done or
// soon after ctx is: every step of a check (the anomaly scan, the
// references, the comparison and its signature, a pipeline's stages)
// stops between its units of work once ctx is done, so a deadline or an
// interrupt is an ordinary return with verdict error, saying which and
// after how long. The check's estimated working set is charged against the
// memory bound while it runs (inflight.go), so that checks run side by
// side in one process wait for memory rather than exhaust it.
//
// A panic is turned into verdict error, so one file cannot end a run over
// many: a memory fault reading the capture's mapped bytes is the file
// shrinking while it is checked (a re-capture into the same path), said as
// such (faults.go); any other panic is a kcheck bug, never the data's
// fault.
func Run(ctx context.Context, c evidence.Capture, opts Options) Result {
	if ctx == nil {
		ctx = context.Background()
	}
	started := time.Now()
	kname := c.Metadata["kcheck.kernel"]
	if ctx.Err() != nil {
		return errorResult(c.Name, kname, deadlineError(ctx, started, "not started"))
	}
	opts.ctx = ctx
	var e kernel.Estimate // it reads seq_lens: guarded, as the check is, against the file shrinking
	if err := Guard(c, func() { e = estimateCapture(c) }); err != nil {
		return errorResult(c.Name, kname, err)
	}
	release, err := charge(ctx, e.Bytes, opts.MaxMemory)
	if err != nil {
		return errorResult(c.Name, kname, fmt.Errorf("%s: %w", deadlineError(ctx, started, "not started"), err))
	}
	defer release()
	r := run(c, opts)
	if ctx.Err() != nil {
		what := "the check"
		if kname != "" {
			what = "the " + kname + " check"
		}
		if e.Ops > 1e6 {
			what += fmt.Sprintf(" (about %.1e multiply-adds)", float64(e.Ops))
		}
		return errorResult(c.Name, kname, deadlineError(ctx, started, what))
	}
	return r
}

// File checks one evidence file (.safetensors, or .npy/.npz with the
// metadata given in extraMeta since numpy files carry none) under ctx (see
// Run), loading included: a file that cannot be opened or read before ctx
// is done (a named pipe with no writer) gets verdict error at the
// deadline. The file stays mapped until the check has returned.
func File(ctx context.Context, path string, extraMeta map[string]string, opts Options) Result {
	if ctx == nil {
		ctx = context.Background()
	}
	c, closeFn, err := LoadContext(ctx, path, extraMeta, opts.MaxMemory)
	if err != nil {
		if errors.Is(err, ErrTimeout) {
			err = fmt.Errorf("%w (the per-file time limit; raise it with --timeout)", err)
		}
		return errorResult(path, "", err)
	}
	defer closeFn()
	return Run(ctx, c, opts)
}

// estimateCapture estimates a check of c: its kernel's reference, or a
// pipeline's largest stage (the stages run one after another).
func estimateCapture(c evidence.Capture) kernel.Estimate {
	kname := c.Metadata["kcheck.kernel"]
	if kname != "pipeline" {
		return EstimateKernel(kname, c.Tensors, params(c.Metadata))
	}
	var largest kernel.Estimate
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
		ops = kernel.AddSizes(ops, e.Ops)
	}
	largest.Ops = ops
	return largest
}

// panicSite names the function and line that panicked, for the report of
// an internal error (called from the deferred recover).
func panicSite() string { return parallel.Site(4) }
