package faults_test

import (
	"context"
	"encoding/json"
	"sort"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/backend"
	"github.com/kcheck-dev/kcheck/internal/check"
	. "github.com/kcheck-dev/kcheck/internal/faults"
	"github.com/kcheck-dev/kcheck/internal/kernel"
)

// runTrigger runs f's trigger on be and checks the outputs as `kcheck run`
// would: the capture holds the (reshaped) inputs and be's outputs.
func runTrigger(t *testing.T, f *Fault, be backend.Backend) check.Result {
	t.Helper()
	in, err := f.Trigger.Inputs()
	if err != nil {
		t.Fatalf("%s: trigger inputs: %v", f.Name, err)
	}
	meta, err := f.Trigger.Case.Metadata()
	if err != nil {
		t.Fatalf("%s: trigger metadata: %v", f.Name, err)
	}
	capt, err := backend.Capture(context.Background(), be, f.Name, f.Trigger.Case.Kernel, in, meta)
	if err != nil {
		t.Fatalf("%s: %v", f.Trigger.Case.Kernel, err)
	}
	return check.Run(t.Context(), capt, check.Options{})
}

// Every fault of the catalog must be caught on its own trigger, while the
// reference passes the very same inputs: the catalog proves the checker
// detects each bug class, and the trigger proves the fault is not a no-op.
func TestEveryFaultFailsItsTrigger(t *testing.T) {
	all := All()
	if len(all) < 24 {
		t.Errorf("catalog holds %d faults; the issue asks for at least 24", len(all))
	}
	sampled := map[string]bool{}
	for _, f := range all {
		if raceEnabled && sampled[f.Stage] {
			continue // one fault a stage: see raceEnabled
		}
		sampled[f.Stage] = true
		t.Run(f.Name, func(t *testing.T) {
			if f.Trigger == nil {
				t.Fatalf("fault %s has no trigger case", f.Name)
			}
			if !f.Affects(f.Trigger.Case.Kernel) {
				t.Fatalf("trigger kernel %s is not one of the fault's kernels %v", f.Trigger.Case.Kernel, f.Kernels)
			}
			ref := runTrigger(t, f, backend.Reference{})
			if ref.Verdict != check.Pass {
				t.Errorf("reference on %s's trigger: verdict %s, want pass (%v)", f.Name, ref.Verdict, reasons(ref))
			}
			bad := runTrigger(t, f, Backend{Fault: f})
			if bad.Verdict != check.Fail {
				t.Errorf("faulty:%s on its trigger: verdict %s, want fail (%v)", f.Name, bad.Verdict, reasons(bad))
			}
		})
	}
}

// triggerOf is a copy of the named fault's trigger case.
func triggerOf(t *testing.T, name string) cases.Case {
	t.Helper()
	f, err := Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return f.Trigger.Case
}

func reasons(r check.Result) string {
	var s []string
	if r.Error != nil {
		s = append(s, *r.Error)
	}
	for _, c := range r.Checks {
		s = append(s, c.Tensor+": "+string(c.Verdict)+": "+c.Reason)
	}
	return strings.Join(s, "; ")
}

// Every fault names a spec stage, a bug class, a doc and kernels that exist
// and belong to that stage (a fault in two stages could not be attributed).
func TestCatalogIsWellFormed(t *testing.T) {
	for _, f := range All() {
		if f.BugClass == "" || f.Doc == "" || len(f.Kernels) == 0 {
			t.Errorf("%s: bug class, doc and kernels are required", f.Name)
		}
		for _, kn := range f.Kernels {
			k, err := kernel.Lookup(kn)
			if err != nil {
				t.Errorf("%s: %v", f.Name, err)
				continue
			}
			if k.Spec().Stage != f.Stage {
				t.Errorf("%s (stage %s) lives in %s, a %s kernel", f.Name, f.Stage, kn, k.Spec().Stage)
			}
		}
	}
	// All is sorted by stage order, then name.
	order := map[string]int{kernel.StageQuant: 0, kernel.StageCache: 1, kernel.StageAttn: 2, kernel.StageCombine: 3}
	all := All()
	if !sort.SliceIsSorted(all, func(i, j int) bool {
		if order[all[i].Stage] != order[all[j].Stage] {
			return order[all[i].Stage] < order[all[j].Stage]
		}
		return all[i].Name < all[j].Name
	}) {
		t.Error("All() is not sorted by stage then name")
	}
	stages := map[string]int{}
	for _, f := range all {
		stages[f.Stage]++
	}
	for _, s := range []string{kernel.StageQuant, kernel.StageCache, kernel.StageAttn, kernel.StageCombine} {
		if stages[s] == 0 {
			t.Errorf("no fault in stage %s", s)
		}
	}
}

func TestLookupAndBackend(t *testing.T) {
	if _, err := Lookup("no_such_fault"); err == nil || !strings.Contains(err.Error(), "nibble_order") {
		t.Errorf("Lookup of an unknown fault: %v, want an error listing the known ones", err)
	}
	be, err := backend.Parse("faulty:nibble_order")
	if err != nil || be.Name() != "faulty:nibble_order" {
		t.Errorf("backend.Parse(faulty:nibble_order) = %v, %v", be, err)
	}
	if _, err := backend.Parse("faulty:bogus"); err == nil {
		t.Error("backend.Parse(faulty:bogus) accepted")
	}
	b, _ := json.Marshal(All()[0])
	if !strings.Contains(string(b), `"bug_class"`) || strings.Contains(string(b), "Inputs") {
		t.Errorf("fault JSON %s: want bug_class and no hooks", b)
	}
}

// A fault says when it cannot show (issue 11 item 4): on a kernel it does
// not live in, on inputs where its outputs are a correct kernel's, and in a
// simulation that cannot run it or that it did not change; and the Proving
// backend of kcheck run refuses such a run rather than pass it. On its own
// trigger every fault fires.
func TestFaultsSayWhenTheyCannotShow(t *testing.T) {
	for _, f := range All() {
		t.Run("fires on its trigger/"+f.Name, func(t *testing.T) {
			in, err := f.Trigger.Inputs()
			if err != nil {
				t.Fatal(err)
			}
			out, err := (Proving{Backend{Fault: f}}).Run(context.Background(), f.Trigger.Case.Kernel, in)
			if err != nil {
				t.Fatalf("Proving refuses the trigger: %v", err)
			}
			if len(out) == 0 {
				t.Fatal("no outputs")
			}
		})
	}
	// fp8_scale_ignored's trigger over a bf16 cache, and page_tail_attended's
	// over contexts that end on page boundaries.
	bf16Write := triggerOf(t, "fp8_scale_ignored")
	bf16Write.KVCacheDType = "bf16"
	onPage := triggerOf(t, "page_tail_attended")
	onPage.SeqLens = []int{32, 16}
	for _, tc := range []struct {
		fault string
		c     cases.Case
		want  []string
	}{
		{"fp8_scale_ignored", bf16Write, []string{"fault fp8_scale_ignored did not fire", "kv_cache_write's outputs on these inputs are byte for byte a correct kernel's",
			"it needs an fp8_e4m3 cache (kv_cache_dtype = fp8_e4m3)"}},
		{"page_tail_attended", onPage, []string{"fault page_tail_attended did not fire", "a context that ends inside a page"}},
		{"nibble_order", bf16Write, []string{"fault nibble_order lives in nvfp4_quantize, nvfp4_dequantize, nvfp4_gemm, and this run calls kv_cache_write"}},
	} {
		t.Run("cannot show/"+tc.fault+" on "+tc.c.Kernel, func(t *testing.T) {
			f, err := Lookup(tc.fault)
			if err != nil {
				t.Fatal(err)
			}
			in, err := tc.c.Inputs()
			if err != nil {
				t.Fatal(err)
			}
			_, err = (Proving{Backend{Fault: f}}).Run(context.Background(), tc.c.Kernel, in)
			for _, w := range tc.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("Proving run: %v; want an error saying %q", err, w)
				}
			}
			// the plain faulty backend (a simulation's) still runs it
			if _, err := (Backend{Fault: f}).Run(context.Background(), tc.c.Kernel, in); err != nil {
				t.Errorf("Backend run: %v", err)
			}
		})
	}
	sim := []string{"nvfp4_dequantize", "nvfp4_quantize", "nvfp4_gemm", "kv_cache_write", "mla_decode", "splitk_combine"}
	indexer, _ := Lookup("indexer_weights_ignored")
	if err := indexer.Simulated(sim...); err == nil || !strings.Contains(err.Error(), "does not show in the simulated decoder: "+indexer.NotSimulated) {
		t.Errorf("indexer_weights_ignored in a simulation: %v, want its not_simulated reason", err)
	}
	scale, _ := Lookup("fp8_scale_ignored")
	if err := scale.Simulated(sim...); err != nil {
		t.Errorf("fp8_scale_ignored in a simulation: %v", err)
	}
	if err := scale.Showed(false); err == nil || !strings.Contains(err.Error(), "had no effect on the simulation") || !strings.Contains(err.Error(), "it shows with --kv-cache-dtype fp8_e4m3") {
		t.Errorf("fp8_scale_ignored with no effect: %v, want the settings it shows under", err)
	}
	if err := scale.Showed(true); err != nil {
		t.Errorf("a fault that changed a step: %v", err)
	}
}
