package diagnose

import (
	"reflect"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/sim"
)

// FromSim carries every field of a simulation's diagnosis into the report:
// a field the simulation adds and FromSim forgets would vanish from
// --json and the text without a word.
func TestFromSimCarriesEveryField(t *testing.T) {
	stage, first, ctxLen := "cache", 8, 20
	d := &sim.Diagnosis{Backend: "faulty:stale_pages", Verdict: compare.Fail, Stage: &stage, FirstStep: &first,
		FirstContextLen: &ctxLen, Steps: []sim.StepResult{{Step: 8, OffFloor: true}},
		Prompts: []sim.PromptSummary{{Prompt: 1}}, Swaps: []sim.SwapResult{{Stage: "cache", RemovesDrift: true}},
		Isolated: []sim.SwapResult{{Stage: "attn"}}, Reason: "why", Notes: []string{"a note"},
		Config: sim.DefaultConfig(), FreeRunning: true, Thresholds: sim.DefaultThresholds()}
	rep := FromSim(d)
	if rep.Mode != "simulation" {
		t.Errorf("mode %q, want simulation", rep.Mode)
	}
	dv, rv := reflect.ValueOf(d).Elem(), reflect.ValueOf(rep).Elem()
	for i := 0; i < dv.NumField(); i++ {
		name := dv.Type().Field(i).Name
		want := dv.Field(i)
		if want.IsZero() {
			t.Errorf("the test leaves Diagnosis.%s zero: give it a value", name)
			continue
		}
		got := rv.FieldByName(name)
		if !got.IsValid() {
			t.Errorf("Report has no field %s", name)
			continue
		}
		if got.Kind() == reflect.Pointer && want.Kind() != reflect.Pointer {
			got = got.Elem() // Config: a pointer, omitted from capture reports
		}
		if !reflect.DeepEqual(got.Interface(), want.Interface()) {
			t.Errorf("Report.%s = %v, want %v", name, got.Interface(), want.Interface())
		}
	}
}
