// Package conformance runs kcheck's case catalog against any
// implementation of its kernel contracts, judging every output three-way
// (exact float64, expected at the declared precision, actual) with the
// same checker as `kcheck check`. It is gonum's blas/testblas for kcheck:
// a backend (the CUDA kernels, a worker that calls an engine's kernels, a
// user's own) conforms when one line of a test passes:
//
//	func TestConformance(t *testing.T) { conformance.Run(t, myBackend{}) }
//
// The Backend interface uses only public types (reference/tensor and
// string maps), so a module outside kcheck can implement it.
package conformance

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/backend"
	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/evidence"
	_ "github.com/kcheck-dev/kcheck/internal/faults" // the faulty: backends
	"github.com/kcheck-dev/kcheck/internal/kernel"
	_ "github.com/kcheck-dev/kcheck/internal/kernels/all" // every kernel registers itself
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Backend is an implementation of the kernel contracts under test.
type Backend interface {
	// Name names the implementation in failure messages.
	Name() string
	// Run returns the outputs of kernel (a contract name: "mla_decode")
	// on inputs (contract tensor names), with params the case's metadata
	// parameters (page_size, kv_cache_dtype, softmax_scale...). meta, when
	// not nil, is kept in the capture (the device, the launch). An error
	// wrapping ErrUnsupported skips the case; any other fails it.
	Run(ctx context.Context, kernel string, inputs map[string]*tensor.Tensor, params map[string]string) (outputs map[string]*tensor.Tensor, meta map[string]string, err error)
}

// ErrUnsupported is what a backend's error wraps for a kernel, dtype or
// shape it does not implement: the case is skipped, saying so.
var ErrUnsupported = errors.New("not implemented by the backend")

// Selector is a backend that runs only some cases (a test narrowed by its
// user to a kernel).
type Selector interface {
	Selects(caseName string) bool
}

// Outcome is one case's result.
type Outcome struct {
	Case, Kernel string
	// Verdict is check's (pass, fail, inconclusive, error), or
	// "unsupported" or "skipped".
	Verdict, Reason string
	// Capture is the evidence judged (nil when the backend did not run):
	// what to save when the case fails, to re-check anywhere.
	Capture *evidence.Capture
}

// Reporter is a backend that keeps a record of each case's outcome (a
// results table, the captures of failing cases).
type Reporter interface {
	Report(t *testing.T, o Outcome)
}

// Cases are the catalog cases Run judges: every case but those tagged long
// under -short; under the race detector, which slows the references about
// fifteenfold, only the smallest case of each kernel and cache dtype
// (Smallest).
func Cases() ([]cases.Case, error) {
	all, err := cases.Catalog()
	if err != nil {
		return nil, err
	}
	var sel []cases.Case
	for _, c := range all {
		if c.HasTag("long") && (testing.Short() || raceEnabled) {
			continue
		}
		sel = append(sel, c)
	}
	if raceEnabled {
		return Smallest(sel), nil
	}
	return sel, nil
}

// Smallest keeps the smallest case (by its memory estimate) of each kernel
// and cache dtype of cs, in the order of their names.
func Smallest(cs []cases.Case) []cases.Case {
	smallest := map[string]cases.Case{}
	for _, c := range cs {
		key := c.Kernel + "/" + c.KVCacheDType
		if old, ok := smallest[key]; !ok || check.EstimateCase(c.Sizes()).Bytes < check.EstimateCase(old.Sizes()).Bytes {
			smallest[key] = c
		}
	}
	keys := make([]string, 0, len(smallest))
	for k := range smallest {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var sel []cases.Case
	for _, k := range keys {
		sel = append(sel, smallest[k])
	}
	return sel
}

// raceOps bounds the work of a case judged under the race detector: the
// real-size GEMMs (10^8 multiply-adds and more) would take minutes each.
const raceOps = 5e7

// Run judges b on every case of Cases, each a subtest named after the
// case: a case fails when its verdict is not pass (inconclusive, within a
// small band of the bound, is logged).
func Run(t *testing.T, b Backend) {
	t.Helper()
	sel, err := Cases()
	if err != nil {
		t.Fatal(err)
	}
	RunCases(t, b, sel)
}

// RunCases is Run on the cases sel.
func RunCases(t *testing.T, b Backend, sel []cases.Case) {
	t.Helper()
	only, narrowed := b.(Selector)
	for _, c := range sel {
		if narrowed && !only.Selects(c.Name) {
			continue
		}
		t.Run(c.Name, func(t *testing.T) {
			if ops := check.EstimateCase(c.Sizes()).Ops; raceEnabled && ops > raceOps {
				t.Skipf("about %.1e multiply-adds: too slow for the references under the race detector (go test without -race runs it)", float64(ops))
			}
			o := runCase(t.Context(), c, b)
			if r, ok := b.(Reporter); ok {
				r.Report(t, o)
			}
			switch o.Verdict {
			case string(check.Pass):
			case "unsupported":
				t.Skip(o.Reason)
			case string(check.Inconclusive):
				t.Logf("%s: inconclusive: %s", b.Name(), o.Reason)
			default:
				t.Errorf("%s: %s: %s", b.Name(), o.Verdict, o.Reason)
			}
		})
	}
}

// runCase builds c's inputs, runs b and judges the capture, under ctx.
func runCase(ctx context.Context, c cases.Case, b Backend) Outcome {
	o := Outcome{Case: c.Name, Kernel: c.Kernel}
	in, err := c.InputsContext(ctx)
	if err != nil {
		o.Verdict, o.Reason = string(check.Error), "building the inputs: "+err.Error()
		return o
	}
	meta, err := c.Metadata()
	if err != nil {
		o.Verdict, o.Reason = string(check.Error), "metadata: "+err.Error()
		return o
	}
	meta["kcheck.backend"] = b.Name()
	outs, bmeta, err := b.Run(ctx, c.Kernel, in.Tensors, in.Params)
	if errors.Is(err, ErrUnsupported) {
		o.Verdict, o.Reason = "unsupported", err.Error()
		return o
	}
	if err != nil {
		o.Verdict, o.Reason = string(check.Error), "the backend failed: "+err.Error()
		return o
	}
	capt := evidence.Assemble(c.Name, in.Tensors, outs, meta, bmeta)
	o.Capture = &capt
	r := check.Run(ctx, capt, check.Options{})
	o.Verdict, o.Reason = string(r.Verdict), explain(r)
	return o
}

// explain is one line per output that did not pass: what the check said
// and where.
func explain(r check.Result) string {
	if r.Error != nil {
		return *r.Error
	}
	var parts []string
	for _, ch := range r.Checks {
		if ch.Verdict == compare.Pass {
			continue
		}
		p := fmt.Sprintf("%s %s: %s", ch.Tensor, ch.Verdict, ch.Reason)
		if len(ch.Worst) > 0 {
			p += " (worst at " + ch.Worst[0].Where() + ")"
		}
		if ch.Signature != nil {
			p += fmt.Sprintf(" [signature %v]", *ch.Signature)
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}

// Reference is kcheck's own Go reference at each case's declared
// precision: the implementation every other is held to, and the one the
// suite's own test runs (make test).
func Reference() Backend { return internalBackend{backend.Reference{}} }

// Faulty is the reference with the catalog's planted fault name: a backend
// that must not conform on the cases where the fault fires (the suite's
// own test shows it has teeth).
func Faulty(name string) (Backend, error) {
	be, err := backend.Parse("faulty:" + name)
	if err != nil {
		return nil, err
	}
	return internalBackend{be}, nil
}

// internalBackend adapts one of kcheck's own backends.
type internalBackend struct{ be backend.Backend }

func (b internalBackend) Name() string { return b.be.Name() }

func (b internalBackend) Run(ctx context.Context, kname string, inputs map[string]*tensor.Tensor, params map[string]string) (map[string]*tensor.Tensor, map[string]string, error) {
	return backend.RunWithMeta(ctx, b.be, kname, kernel.Inputs{Tensors: inputs, Params: params})
}
