package diagnose

import (
	"github.com/kcheck-dev/kcheck/internal/evidence"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

const fx = "../../fixtures/examples/"

func load(t *testing.T, name string) evidence.Capture {
	t.Helper()
	c, closeFn, err := check.Load(fx+name, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeFn)
	return c
}

// The shipped pipeline examples: the culprit, the stage table's shape
// (local fails only at the culprit, later stages fail only propagated).
// deref prints a culprit stage, "null" for none (as --json does).
func deref(s *string) string {
	if s == nil {
		return "null"
	}
	return *s
}

func TestCaptureAttribution(t *testing.T) {
	tests := []struct {
		file, verdict, culprit string
	}{
		{"pipeline_ok.safetensors", "pass", ""},
		{"pipeline_quant_nibble_order.safetensors", "fail", "quant"},
	}
	for _, tc := range tests {
		rep := Capture(t.Context(), load(t, tc.file), check.Options{})
		want := tc.culprit
		if want == "" {
			want = "null"
		}
		if string(rep.Verdict) != tc.verdict || deref(rep.Stage) != want {
			t.Errorf("%s: verdict %s, stage %s; want %s, %s", tc.file, rep.Verdict, deref(rep.Stage), tc.verdict, want)
		}
		a := rep.Capture
		if a == nil || len(a.Stages) != 4 {
			t.Fatalf("%s: want a 4-stage table, got %+v", tc.file, a)
		}
		if a.Stages[0].PropagatedError != nil {
			t.Errorf("%s: the first stage has a propagated error", tc.file)
		}
		for _, r := range a.Stages {
			culprit := r.Prefix == tc.culprit
			if (r.Verdict == check.Fail) != culprit {
				t.Errorf("%s: stage %s local verdict %s", tc.file, r.Prefix, r.Verdict)
			}
			if tc.culprit != "" && r.Prefix != tc.culprit && r.PropagatedVerdict != check.Fail {
				t.Errorf("%s: stage %s downstream of %s should fail propagated, got %q", tc.file, r.Prefix, tc.culprit, r.PropagatedVerdict)
			}
		}
		if tc.culprit != "" {
			if len(a.Evidence) == 0 || len(a.Evidence[0].Worst) == 0 {
				t.Errorf("%s: no evidence with worst elements", tc.file)
			}
			if !strings.Contains(a.Explanation, "cache, attn, combine are correct on what they were given") {
				t.Errorf("%s: explanation %q", tc.file, a.Explanation)
			}
			if rep.FirstStep == nil || *rep.FirstStep != 0 || rep.FirstContextLen == nil || *rep.FirstContextLen != 33 {
				t.Errorf("%s: first step %v, context %v; want 0 and 33 (the capture's longest seq_len)", tc.file, rep.FirstStep, rep.FirstContextLen)
			}
		}
	}
}

func TestStepOf(t *testing.T) {
	for prefix, want := range map[string]int{"cache": 0, "s0.cache": 0, "s12.attn": 12, "s1x.attn": 0, "sx.cache": 0} {
		if got := stepOf(prefix); got != want {
			t.Errorf("stepOf(%q) = %d, want %d", prefix, got, want)
		}
	}
}

func TestContextLens(t *testing.T) {
	i32 := func(v ...int64) *tensor.Tensor { return tensor.FromInt64s(tensor.I32, []int{len(v)}, v) }
	c := evidence.Capture{Tensors: map[string]*tensor.Tensor{
		"s0.attn.seq_lens": i32(5, 9), "s1.attn.seq_lens": i32(6, 10), "s1.cache.kv_c": tensor.New(tensor.BF16, 2, 4),
		"s2.attn.seq_lens": tensor.New(tensor.BF16, 2), // not integers: ignored
	}}
	got := ContextLens(c)
	if len(got) != 2 || got[0] != 9 || got[1] != 10 {
		t.Errorf("ContextLens = %v, want map[0:9 1:10]", got)
	}
}

func TestErrorCapture(t *testing.T) {
	rep := Capture(t.Context(), evidence.Capture{Name: "x", Metadata: map[string]string{"kcheck.kernel": "pipeline"}}, check.Options{})
	if rep.Verdict != check.Error || rep.Error == nil || !strings.Contains(*rep.Error, "kcheck.stages") {
		t.Errorf("verdict %s, error %v; want an error naming kcheck.stages", rep.Verdict, rep.Error)
	}
}
