package faults_test

import (
	"context"
	"strings"
	"testing"

	. "github.com/kcheck-dev/kcheck/internal/faults"
)

// Every catalog fault, on every kernel it lives in (and the cache dtypes
// its trigger needs), leaves the signature that names its pattern and the
// kind of coordinate that shows it: the rows are each fault's Signatures,
// declared beside it in its family's folder, and a fault registered
// without a row for one of its kernels fails TestEveryFaultHasASignatureRow.
func TestFaultSignatures(t *testing.T) {
	sampled := map[string]bool{}
	for _, f := range All() {
		for _, row := range f.Signatures {
			tr := row.On
			if tr == nil {
				tr = f.Trigger
			}
			kern := tr.Case.Kernel
			if raceEnabled && sampled[kern] {
				continue // one row a kernel: see raceEnabled
			}
			sampled[kern] = true
			t.Run(f.Name+"/"+kern+"/"+row.Tensor, func(t *testing.T) {
				in, err := tr.Inputs()
				if err != nil {
					t.Fatal(err)
				}
				if _, err := (Proving{Backend{Fault: f}}).Run(context.Background(), kern, in); err != nil {
					t.Fatalf("the fault does not show on this case: %v", err)
				}
				ff := *f
				ff.Trigger = tr
				r := runTrigger(t, &ff, Backend{Fault: f})
				for _, c := range r.Checks {
					if c.Tensor != row.Tensor {
						continue
					}
					if c.Signature == nil {
						t.Fatalf("%s: verdict %s, no signature", c.Tensor, c.Verdict)
					}
					t.Logf("%s: %s (by %q)", c.Tensor, c.Signature.Pattern, c.Signature.Coord)
					if c.Signature.Pattern != row.Pattern || c.Signature.Coord != string(row.Coord) {
						t.Errorf("%s: signature %s (by %q), want %s (by %q): %s", c.Tensor, c.Signature.Pattern, c.Signature.Coord, row.Pattern, row.Coord, c.Signature.Detail)
					}
					return
				}
				t.Fatalf("no check of %s", row.Tensor)
			})
		}
	}
}

// unsigned lists, for each fault, the kernels it lives in that none of its
// Signatures rows runs.
func unsigned(fs []*Fault) []string {
	var missing []string
	for _, f := range fs {
		has := map[string]bool{}
		for _, row := range f.Signatures {
			tr := row.On
			if tr == nil {
				tr = f.Trigger
			}
			if tr != nil {
				has[tr.Case.Kernel] = true
			}
		}
		for _, k := range f.Kernels {
			if !has[k] {
				missing = append(missing, "fault "+f.Name+" on "+k+" has no Signatures row")
			}
		}
	}
	return missing
}

// Every fault of the catalog has a row for every kernel it lives in, so
// that no fault's pattern goes unjudged.
func TestEveryFaultHasASignatureRow(t *testing.T) {
	for _, m := range unsigned(All()) {
		t.Error(m)
	}
}

// A fault with a kernel no row runs is named with the kernel: the check
// above has teeth.
func TestUnsignedKernelIsNamed(t *testing.T) {
	f, err := Lookup("page_boundary_off_by_one") // rows on kv_cache_write and kv_cache_gather
	if err != nil {
		t.Fatal(err)
	}
	ff := *f
	ff.Signatures = f.Signatures[:1] // drop the gather's row
	got := unsigned([]*Fault{&ff})
	if want := "fault page_boundary_off_by_one on kv_cache_gather has no Signatures row"; len(got) != 1 || got[0] != want {
		t.Errorf("unsigned = %q, want [%q]", got, want)
	}
	if got := unsigned([]*Fault{f}); len(got) != 0 {
		t.Errorf("unsigned(%s) = %q, want none", f.Name, strings.Join(got, "; "))
	}
}
