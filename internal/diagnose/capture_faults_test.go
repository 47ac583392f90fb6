package diagnose

import (
	"context"
	"github.com/kcheck-dev/kcheck/internal/evidence"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/faults"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// diagnose on a capture names every catalog fault's own stage (quant,
// cache, attn, combine: reference/CONTRACTS.md §7.1), single-kernel captures included.
// (That the reference passes the same triggers is internal/faults' table
// test.)
func TestCaptureDiagnosisNamesEveryFaultsStage(t *testing.T) {
	for _, f := range faults.All() {
		if f.Trigger == nil {
			t.Errorf("fault %s has no trigger case", f.Name)
			continue
		}
		t.Run(f.Name, func(t *testing.T) {
			in, err := f.Trigger.Inputs()
			if err != nil {
				t.Fatal(err)
			}
			meta, err := f.Trigger.Case.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			outs, err := faults.Backend{Fault: f}.Run(context.Background(), f.Trigger.Case.Kernel, in)
			if err != nil {
				t.Fatal(err)
			}
			ts := map[string]*tensor.Tensor{}
			for k, v := range in.Tensors {
				ts[k] = v
			}
			for k, v := range outs {
				ts[k] = v
			}
			rep := FromCheck(check.Run(t.Context(), evidence.Capture{Name: f.Name, Metadata: meta, Tensors: ts}, check.Options{}), nil)
			if rep.Verdict != "fail" || rep.Stage == nil || *rep.Stage != f.Stage {
				t.Fatalf("verdict %s stage %v, want fail in %s", rep.Verdict, deref(rep.Stage), f.Stage)
			}
		})
	}
}
