package all

import (
	"context"
	"slices"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/faults"
	"github.com/kcheck-dev/kcheck/internal/kernel"
)

// capabilities are what the tools ask every kernel for: a kernel without
// one would fall through a tool silently (no memory bound, no inputs for
// its cases...), so the registry requires each.
var capabilities = []struct {
	name string
	has  func(kernel.Kernel) bool
}{
	{"Coster (the memory bound, internal/check)", func(k kernel.Kernel) bool { _, ok := k.(kernel.Coster); return ok }},
	{"Generator (the inputs of catalog cases, package cases)", func(k kernel.Kernel) bool { _, ok := k.(kernel.Generator); return ok }},
	{"Slicer (kcheck shrink)", func(k kernel.Kernel) bool { _, ok := k.(kernel.Slicer); return ok }},
	{"Contexter (kcheck bisect --context)", func(k kernel.Kernel) bool { _, ok := k.(kernel.Contexter); return ok }},
	{"Roofliner (kcheck bench)", func(k kernel.Kernel) bool { _, ok := k.(kernel.Roofliner); return ok }},
}

// missingCapabilities lists, for each kernel, the capabilities it lacks.
func missingCapabilities(ks []kernel.Kernel) []string {
	var missing []string
	for _, k := range ks {
		for _, c := range capabilities {
			if !c.has(k) {
				missing = append(missing, k.Spec().Name+" lacks "+c.name)
			}
		}
	}
	return missing
}

// TestEveryKernelHasEveryCapability: the registry holds the families
// this package imports, and each of their kernels answers every tool.
func TestEveryKernelHasEveryCapability(t *testing.T) {
	ks := kernel.All()
	if len(ks) != 10 {
		t.Errorf("%d kernels registered (%v), want the 10 of the six families", len(ks), kernel.Names())
	}
	for _, m := range missingCapabilities(ks) {
		t.Error(m)
	}
}

// A kernel that lacks a capability is named, with the capability: the
// check above has teeth.
func TestMissingCapabilityIsNamed(t *testing.T) {
	var bare kernel.Kernel = bareKernel{}
	got := missingCapabilities([]kernel.Kernel{bare})
	if len(got) != len(capabilities) {
		t.Fatalf("a kernel with no capability: %v, want every capability named", got)
	}
	for i, c := range capabilities {
		if want := "bare_kernel lacks " + c.name; got[i] != want {
			t.Errorf("got %q, want %q", got[i], want)
		}
	}
}

// Every spec names its kernel, its stage and its tensors, and documents
// each parameter it declares.
func TestSpecsAreComplete(t *testing.T) {
	stages := map[string]bool{kernel.StageQuant: true, kernel.StageCache: true, kernel.StageAttn: true, kernel.StageCombine: true}
	for _, k := range kernel.All() {
		s := k.Spec()
		if s.Name == "" || s.Summary == "" || !stages[s.Stage] || len(s.Inputs) == 0 || len(s.Outputs) == 0 {
			t.Errorf("kernel %q: incomplete spec (stage %q, %d inputs, %d outputs)", s.Name, s.Stage, len(s.Inputs), len(s.Outputs))
		}
		seen := map[string]bool{}
		for _, p := range s.Params {
			if p.Name == "" || p.Doc == "" || (p.Kind == kernel.ParamEnum) != (len(p.Allowed) > 0) {
				t.Errorf("kernel %s: parameter %q is not documented (kind %v, allowed %v)", s.Name, p.Name, p.Kind, p.Allowed)
			}
			if seen[p.Name] {
				t.Errorf("kernel %s: parameter %s declared twice", s.Name, p.Name)
			}
			seen[p.Name] = true
			if p.Kind == kernel.ParamEnum && p.Default != "" && !slices.Contains(p.Allowed, p.Default) {
				t.Errorf("kernel %s: parameter %s defaults to %q, which it does not allow (%v)", s.Name, p.Name, p.Default, p.Allowed)
			}
		}
	}
}

// unplanted lists the kernels of ks that no fault of fs lives in.
func unplanted(ks []kernel.Kernel, fs []*faults.Fault) []string {
	var missing []string
	for _, k := range ks {
		if !slices.ContainsFunc(fs, func(f *faults.Fault) bool { return f.Affects(k.Spec().Name) }) {
			missing = append(missing, k.Spec().Name)
		}
	}
	return missing
}

// Every kernel has a planted fault: each family registers its faults from
// its own folder, and a family whose faults were not registered (a file
// lost in a move, an init dropped) would shrink the catalog without a word.
// The catalog is what proves, on any machine, that kcheck catches a bug in
// each kernel.
func TestEveryKernelHasAFault(t *testing.T) {
	for _, name := range unplanted(kernel.All(), faults.All()) {
		t.Errorf("kernel %s: no planted fault lives in it", name)
	}
	if got := unplanted([]kernel.Kernel{bareKernel{}}, faults.All()); !slices.Equal(got, []string{"bare_kernel"}) {
		t.Errorf("unplanted(bare_kernel) = %v, want it named", got)
	}
}

// bareKernel is a Kernel with none of the capabilities.
type bareKernel struct{}

func (bareKernel) Spec() *kernel.Spec { return &kernel.Spec{Name: "bare_kernel"} }

func (bareKernel) Validate(kernel.Inputs) (kernel.Problem, error) { return nil, nil }

func (bareKernel) Reference(context.Context, kernel.Problem, kernel.Precision, kernel.OutDTypes) ([]kernel.Output, error) {
	return nil, nil
}
