package sim

import (
	"context"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/backend"
	"github.com/kcheck-dev/kcheck/internal/faults"
)

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
