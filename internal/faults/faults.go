// Package faults is the framework of kcheck's catalog of planted bugs:
// each a small, documented corruption of a reference kernel that mirrors a
// class of bug seen in public engines (a swapped nibble order, a page
// off-by-one, a mixed-up LSE base...). They exist so kcheck can prove, on
// any machine, that it detects real bugs and attributes them to the right
// stage. `--backend faulty:NAME` runs the catalog's reference with one
// fault planted.
//
// A fault is one mechanism with four optional hooks applied around the
// reference: corrupt the inputs the kernel reads, the parameters it
// believes, the precision it computes at, or the outputs it writes. Kernels
// a fault does not name run correctly, so a pipeline run through a faulty
// backend corrupts only the fault's own stage.
//
// The faults themselves live beside their kernels, in each family's folder
// under internal/kernels, and Register themselves there as the kernels do:
// a program that needs the whole catalog (the faulty backend, `kcheck
// faults`) imports internal/kernels/all. This package imports no family.
package faults

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/backend"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/suggest"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Fault is one planted bug.
type Fault struct {
	Name  string `json:"name"`
	Stage string `json:"stage"`
	// BugClass names the public class of bug it stands for.
	BugClass string `json:"bug_class"`
	Doc      string `json:"doc,omitempty"`
	// Kernels are the kernels the bug lives in.
	Kernels []string `json:"kernels"`

	Inputs    func(in map[string]*tensor.Tensor, p kernel.Params) (map[string]*tensor.Tensor, error) `json:"-"`
	Params    func(p kernel.Params) kernel.Params                                                    `json:"-"`
	Precision func(p kernel.Precision) kernel.Precision                                              `json:"-"`
	Outputs   func(ctx context.Context, in kernel.Inputs, out map[string]*tensor.Tensor) error       `json:"-"`

	// Trigger is a small case on which the fault changes its kernel's
	// outputs; the catalog's table test runs every fault's trigger.
	Trigger *Trigger `json:"-"`
	// Simulate holds the `kcheck diagnose --simulate` settings (flag name
	// without dashes, value) under which the fault fires in the simulated
	// decoder; nil when the default simulation already triggers it. Faults
	// that need an fp8 cache, s_q > 1 or high block ids say so here.
	Simulate map[string]string `json:"simulate,omitempty"`
	// NotSimulated, when set, says why the simulated decoder cannot show
	// the fault (it runs no kernel the fault lives in); its trigger and
	// captures still do.
	NotSimulated string `json:"not_simulated,omitempty"`
	// Needs says what a case must hold for the fault to fire, when not
	// every input of its kernels does ("an fp8_e4m3 cache"): what a run in
	// which it does not fire says.
	Needs string `json:"needs,omitempty"`
	// Signatures are the signatures the fault leaves, at least one on each
	// kernel it lives in: the catalog's signature table, declared beside
	// the fault so that a fault cannot join the catalog without saying
	// what `kcheck check` must call it (signatures_test.go judges every
	// row and fails a kernel of a fault that has none).
	Signatures []Expect `json:"-"`
}

// Expect is the signature a fault leaves on one case: the pattern
// `kcheck check` names on one output's check, and the kind of coordinate
// that shows it.
type Expect struct {
	// On is the case judged (On.Case.Kernel is the kernel); nil is the
	// fault's own trigger.
	On *Trigger
	// Tensor is the output whose check carries the signature.
	Tensor string
	// Pattern is the signature's pattern, one of internal/signature's
	// names, spelled out as kernels spell their suspects' (signature's
	// tests run every family, so no family imports it).
	Pattern string
	// Coord is the kind of coordinate that shows the pattern: "" for a
	// pattern in the values themselves, or for none.
	Coord kernel.CoordKind
	// Why says, where the pattern is generic ("uniform", "concentrated")
	// or surprising, why that is what the fault genuinely does.
	Why string
}

// Trigger is a configuration that makes a fault visible: a case, and for
// faults that need particular data (an all-zero block, subnormal block
// scales, a page from an earlier sequence) a reshaping of the case's
// generated inputs.
type Trigger struct {
	Case cases.Case
	// Shape, when set, edits the generated inputs. It owns in.Tensors (a
	// fresh map of freshly generated tensors) and may replace entries.
	Shape func(in kernel.Inputs) (kernel.Inputs, error)
}

// Inputs builds the trigger's inputs.
func (t *Trigger) Inputs() (kernel.Inputs, error) {
	in, err := t.Case.Inputs()
	if err != nil || t.Shape == nil {
		return in, err
	}
	return t.Shape(in)
}

var catalog = map[string]*Fault{}

// Register adds f to the catalog.
func Register(f *Fault) {
	if _, dup := catalog[f.Name]; dup {
		panic("faults: " + f.Name + " registered twice")
	}
	catalog[f.Name] = f
}

// All returns the catalog sorted by stage then name.
func All() []*Fault {
	order := map[string]int{kernel.StageQuant: 0, kernel.StageCache: 1, kernel.StageAttn: 2, kernel.StageCombine: 3}
	var fs []*Fault
	for _, f := range catalog {
		fs = append(fs, f)
	}
	sort.Slice(fs, func(i, j int) bool {
		if order[fs[i].Stage] != order[fs[j].Stage] {
			return order[fs[i].Stage] < order[fs[j].Stage]
		}
		return fs[i].Name < fs[j].Name
	})
	return fs
}

// Lookup returns the named fault.
func Lookup(name string) (*Fault, error) {
	f, ok := catalog[name]
	if !ok {
		var names []string
		for n := range catalog {
			names = append(names, n)
		}
		sort.Strings(names)
		return nil, fmt.Errorf("unknown fault %q%s (known: %s)", name, suggest.DidYouMean(name, names), strings.Join(names, ", "))
	}
	return f, nil
}

// Affects reports whether the fault lives in kernel name.
func (f *Fault) Affects(name string) bool {
	for _, k := range f.Kernels {
		if k == name {
			return true
		}
	}
	return false
}

// Applies returns an error when the fault lives in none of kernels, the
// kernels a run calls: the run cannot show it, and a pass would be taken
// for a proof.
func (f *Fault) Applies(kernels ...string) error {
	for _, k := range kernels {
		if f.Affects(k) {
			return nil
		}
	}
	return fmt.Errorf("fault %s lives in %s, and this run calls %s: a pass would prove nothing (kcheck faults lists where each fault lives)",
		f.Name, strings.Join(f.Kernels, ", "), strings.Join(kernels, ", "))
}

// Fired returns an error when out, the fault's
// outputs of kernel k on in (what Run returned), are byte for byte what a
// correct kernel writes on in: the bug did not fire on these inputs. It
// runs the reference once more, on the unplanted inputs.
func (f *Fault) Fired(ctx context.Context, k kernel.Kernel, in kernel.Inputs, out map[string]*tensor.Tensor) error {
	if err := f.Applies(k.Spec().Name); err != nil {
		return err
	}
	prec, err := kernel.PrecisionFrom(in.Params)
	if err != nil {
		return err
	}
	correct, err := kernel.Produce(ctx, k, in, prec, nil)
	if err != nil {
		return err
	}
	for name, t := range correct {
		if o, ok := out[name]; !ok || o.DType != t.DType || !bytes.Equal(o.Data, t.Data) {
			return nil
		}
	}
	return fmt.Errorf("fault %s did not fire: %s's outputs on these inputs are byte for byte a correct kernel's, so a pass would prove nothing; %s",
		f.Name, k.Spec().Name, f.needs())
}

// needs says what the fault needs to fire, for the errors above.
func (f *Fault) needs() string {
	if f.Needs != "" {
		return "it needs " + f.Needs
	}
	return "these inputs do not exercise it (its trigger case, in the catalog's table test, does)"
}

// Simulated returns an error when the simulated decoder, which calls
// kernels, cannot show the fault.
func (f *Fault) Simulated(kernels ...string) error {
	if f.NotSimulated != "" {
		return fmt.Errorf("fault %s does not show in the simulated decoder: %s", f.Name, f.NotSimulated)
	}
	return f.Applies(kernels...)
}

// SimulateFlags is Simulate as command-line flags, sorted
// ("--kv-cache-dtype fp8_e4m3"), or "" when the default simulation shows
// the fault.
func (f *Fault) SimulateFlags() string {
	keys := make([]string, 0, len(f.Simulate))
	for k := range f.Simulate {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		keys[i] = "--" + k + " " + f.Simulate[k]
	}
	return strings.Join(keys, " ")
}

// Showed returns an error when a simulation on the faulty backend changed
// nothing (changed: whether any step's output
// differs from the reference's), saying which settings make it show.
func (f *Fault) Showed(changed bool) error {
	if changed {
		return nil
	}
	hint := f.needs()
	if flags := f.SimulateFlags(); flags != "" {
		hint = "it shows with " + flags
	}
	return fmt.Errorf("fault %s had no effect on the simulation: every step's output equals the reference's bit for bit, so a pass would prove nothing; %s",
		f.Name, hint)
}

// Run produces kernel k's outputs with the fault planted (the plain
// reference when the fault does not live in k); it stops when ctx is done.
func (f *Fault) Run(ctx context.Context, k kernel.Kernel, in kernel.Inputs) (map[string]*tensor.Tensor, error) {
	prec, err := kernel.PrecisionFrom(in.Params)
	if err != nil {
		return nil, err
	}
	if !f.Affects(k.Spec().Name) {
		return kernel.Produce(ctx, k, in, prec, nil)
	}
	run := kernel.Inputs{Tensors: in.Tensors, Params: in.Params}
	if f.Params != nil {
		run.Params = f.Params(CloneParams(in.Params))
	}
	if f.Inputs != nil {
		ts := make(map[string]*tensor.Tensor, len(in.Tensors))
		for name, t := range in.Tensors {
			ts[name] = t // hooks replace what they corrupt and never write into the caller's tensors
		}
		if run.Tensors, err = f.Inputs(ts, run.Params); err != nil {
			return nil, err
		}
	}
	if f.Precision != nil {
		prec = f.Precision(prec)
	}
	out, err := kernel.Produce(ctx, k, run, prec, nil)
	if err != nil {
		return nil, err
	}
	if f.Outputs != nil {
		if err := f.Outputs(ctx, in, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Backend runs the reference with one fault planted.
type Backend struct{ Fault *Fault }

// Name implements backend.Backend.
func (b Backend) Name() string { return "faulty:" + b.Fault.Name }

// InProcess implements backend.InProcess: a fault is the reference's Go
// code with a change, and keeps no state between runs.
func (b Backend) InProcess() bool { return true }

// Run implements backend.Backend.
func (b Backend) Run(ctx context.Context, name string, in kernel.Inputs) (map[string]*tensor.Tensor, error) {
	k, err := kernel.Lookup(name)
	if err != nil {
		return nil, err
	}
	return b.Fault.Run(ctx, k, in)
}

// Proving is a faulty backend for runs that judge one kernel call (kcheck
// run): it refuses, with the reason, a kernel the fault does not live in and
// outputs the fault did not change, where a pass would prove nothing.
type Proving struct{ Backend }

// Run implements backend.Backend.
func (b Proving) Run(ctx context.Context, name string, in kernel.Inputs) (map[string]*tensor.Tensor, error) {
	k, err := kernel.Lookup(name)
	if err != nil {
		return nil, err
	}
	if err := b.Fault.Applies(name); err != nil {
		return nil, err
	}
	out, err := b.Backend.Run(ctx, name, in)
	if err != nil {
		return nil, err
	}
	return out, b.Fault.Fired(ctx, k, in, out)
}

func init() {
	backend.Register("faulty", func(arg string) (backend.Backend, error) {
		f, err := Lookup(arg)
		if err != nil {
			return nil, err
		}
		return Backend{Fault: f}, nil
	})
}
