package diagnose

import (
	"context"
	"testing"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/backend"
	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/faults"
)

func TestSearch(t *testing.T) {
	for _, tc := range []struct {
		lo, hi, first, want int
	}{
		{1, 10, 7, 7}, {1, 10, 1, 1}, {1, 10, 10, 10}, {1, 10, 11, 11}, {1, 1, 1, 1}, {1, 1, 2, 2},
	} {
		probes := 0
		got, err := search(tc.lo, tc.hi, func(n int) (bool, error) { probes++; return n >= tc.first, nil })
		if err != nil || got != tc.want {
			t.Errorf("search(%d, %d) with first bad %d = %d, %v; want %d", tc.lo, tc.hi, tc.first, got, err, tc.want)
		}
		if probes > 5 { // 1 + ceil(log2 10)
			t.Errorf("search(%d, %d) probed %d times", tc.lo, tc.hi, probes)
		}
	}
}

// Bisecting the step count finds the same first step as the full
// diagnosis, and nothing for the reference.
func TestBisectSteps(t *testing.T) {
	for _, tc := range []struct {
		fault string
		want  int // -1: pass
	}{{"stale_pages", 0}, {"negative_slot_wraps", 0}, {"", -1}} {
		if (raceEnabled || testing.Short()) && tc.fault == "negative_slot_wraps" {
			continue // see raceEnabled
		}
		name := tc.fault
		var be backend.Backend = backend.Reference{}
		cfg := tableConfig()
		if tc.fault != "" {
			f, _ := faults.Lookup(tc.fault)
			be = faults.Backend{Fault: f}
			cfg = configFor(t, f)
		} else {
			name = "reference"
		}
		s, base := cachedSim(t, cfg)
		want := tc.want
		if tc.fault != "" {
			rep, err := s.Diagnose(context.Background(), be, DiagnoseOptions{Baseline: base, Quick: true})
			if err != nil {
				t.Fatal(err)
			}
			want = *rep.FirstStep
		}
		res, err := s.BisectSteps(context.Background(), be, base, DefaultThresholds())
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case want < 0 && (res.Verdict != "pass" || res.FirstStep != nil):
			t.Errorf("%s: verdict %s, first step %v; want pass", name, res.Verdict, res.FirstStep)
		case want >= 0 && (res.FirstStep == nil || *res.FirstStep != want || res.Verdict != "fail"):
			t.Errorf("%s: first step %v (%s); the full diagnosis says %d", name, res.FirstStep, res.Verdict, want)
		}
		if len(res.Probes) > 5 { // 1 + ceil(log2 8) for 8 steps
			t.Errorf("%s: %d probes", name, len(res.Probes))
		}
	}
}

// A gather reading token t from block_table[(t-1)/P] is first wrong at the
// context that holds token P, i.e. P+1: with P = 16, 17.
func TestBisectContext(t *testing.T) {
	f, _ := faults.Lookup("page_boundary_off_by_one")
	c := cases.Case{Name: "g", Kernel: "kv_cache_gather", Latent: 32, Rope: 16, SeqLens: []int{50, 40}, PageSize: 16, Seed: 5}
	res, err := BisectContext(context.Background(), c, faults.Backend{Fault: f}, check.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.FirstContextLen == nil || *res.FirstContextLen != 17 || res.Verdict != "fail" {
		t.Errorf("first context %v (%s, %v); want 17", res.FirstContextLen, res.Verdict, res.Probes)
	}
	pass, err := BisectContext(context.Background(), c, backend.Reference{}, check.Options{})
	if err != nil || pass.Verdict != "pass" || pass.FirstContextLen != nil {
		t.Errorf("reference: %+v, %v; want pass", pass, err)
	}
	if _, err := BisectContext(context.Background(), cases.Case{Name: "q", Kernel: "nvfp4_gemm"}, backend.Reference{}, check.Options{}); err == nil {
		t.Error("a GEMM case was bisected on context length")
	}
}
