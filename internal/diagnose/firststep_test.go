package diagnose

import (
	"testing"

	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/compare"
)

// TestCaptureFirstStepIsTheCulprits: a pipeline whose step-2 attention is
// wrong on its own inputs starts going wrong at step 2, even when an
// earlier combine fails only against the reference chain (as a correct
// SGLang decode's does when its attention deviates within tolerance and the
// chain's answer is fed forward: python/tests/test_capture_sglang_e2e.py);
// without a culprit the first step off the floor by any measure is the
// start.
func TestCaptureFirstStepIsTheCulprits(t *testing.T) {
	pass := []compare.Check{{Tensor: "out", Verdict: compare.Pass}}
	fail := []compare.Check{{Tensor: "out", Verdict: compare.Fail}}
	stage := func(prefix string, local, prop []compare.Check) check.StageResult {
		return check.StageResult{Prefix: prefix, Kernel: "splitk_combine", Stage: "combine", Verdict: compare.FileVerdict(local), Local: local, Propagated: prop}
	}
	for _, tc := range []struct {
		name   string
		stages []check.StageResult
		want   int
	}{
		{"culprit at step 2, propagated-only failure at step 0", []check.StageResult{
			stage("s0.attn", pass, nil), stage("s0.combine", pass, fail),
			stage("s1.attn", pass, nil), stage("s1.combine", pass, pass),
			stage("s2.attn", fail, nil), stage("s2.combine", pass, fail)}, 2},
		{"no culprit: the first propagated failure", []check.StageResult{
			stage("s0.attn", pass, nil), stage("s0.combine", pass, pass),
			stage("s1.attn", pass, nil), stage("s1.combine", pass, fail)}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := FromCheck(check.Result{File: "p", Kernel: "pipeline", Verdict: compare.Fail, Stages: tc.stages}, map[int]int{0: 36, 1: 36, 2: 37})
			if rep.FirstStep == nil || *rep.FirstStep != tc.want {
				t.Fatalf("first step %v, want %d (reason %q)", rep.FirstStep, tc.want, rep.Reason)
			}
		})
	}
}
