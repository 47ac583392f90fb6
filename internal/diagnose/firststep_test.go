package diagnose

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/signature"
)

// TestCaptureFirstStepIsTheCulprits: a pipeline whose step-2 attention is
// wrong on its own inputs starts going wrong at step 2, even when an
// earlier combine fails only against the reference chain (as a correct
// SGLang decode's does when its attention deviates within tolerance and the
// chain's answer is fed forward: python/tests/test_capture_sglang_e2e.py).
// Without a culprit nothing goes wrong: a propagated excess is then the
// earlier stages' accepted deviations carried forward, which the
// explanation and the table say, with no first step, no step off the floor
// and no signature.
func TestCaptureFirstStepIsTheCulprits(t *testing.T) {
	pass := []compare.Check{{Tensor: "out", Verdict: compare.Pass}}
	fail := []compare.Check{{Tensor: "out", Verdict: compare.Fail, Signature: &signature.Signature{Pattern: "concentrated", Coord: "row"}}}
	inc := []compare.Check{{Tensor: "out", Verdict: compare.Inconclusive}}
	stage := func(prefix string, local, prop []compare.Check) check.StageResult {
		return check.StageResult{Prefix: prefix, Kernel: "splitk_combine", Stage: "combine", Verdict: compare.FileVerdict(local), Local: local, Propagated: prop}
	}
	for _, tc := range []struct {
		name     string
		stages   []check.StageResult
		want     int // -1: no first step
		offFloor []bool
		reason   []string
		table    []string // substrings of the text table
		noTable  []string
	}{
		{"culprit at step 2, propagated-only failure at step 0", []check.StageResult{
			stage("s0.attn", pass, nil), stage("s0.combine", pass, fail),
			stage("s1.attn", pass, nil), stage("s1.combine", pass, pass),
			stage("s2.attn", fail, nil), stage("s2.combine", pass, fail)}, 2,
			[]bool{false, false, true},
			[]string{"s2.attn (splitk_combine) is the first stage", "s2.combine is correct on what it was given and fails only against the reference chain"},
			[]string{"over ", "FAIL", "not a fault"}, nil},
		{"no culprit: propagated excesses carried, nothing off", []check.StageResult{
			stage("s0.attn", pass, nil), stage("s0.combine", pass, pass),
			stage("s1.attn", pass, nil), stage("s1.combine", pass, fail),
			stage("s2.attn", pass, nil), stage("s2.combine", pass, inc)}, -1,
			[]bool{false, false, false},
			[]string{"every stage is correct on its own captured inputs; against the reference chain s1.combine, s2.combine go past their own tolerance", "a measurement, not a fault"},
			[]string{"over ", "not a fault"}, []string{"FAIL", "INC", "concentrated", "differs"}},
		{"no culprit, no excess", []check.StageResult{
			stage("s0.attn", pass, nil), stage("s0.combine", pass, pass)}, -1,
			[]bool{false},
			[]string{"every stage is correct on its own captured inputs and against the reference chain"},
			nil, []string{"over ", "FAIL"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := FromCheck(check.Result{File: "p", Kernel: "pipeline", Verdict: compare.Fail, Stages: tc.stages}, map[int]int{0: 36, 1: 36, 2: 37})
			switch {
			case tc.want < 0 && rep.FirstStep != nil:
				t.Fatalf("first step %d, want none (reason %q)", *rep.FirstStep, rep.Reason)
			case tc.want >= 0 && (rep.FirstStep == nil || *rep.FirstStep != tc.want):
				t.Fatalf("first step %v, want %d (reason %q)", rep.FirstStep, tc.want, rep.Reason)
			}
			var off []bool
			for _, s := range rep.Steps {
				off = append(off, s.OffFloor)
			}
			if !slices.Equal(off, tc.offFloor) {
				t.Errorf("off the floor by step %v, want %v", off, tc.offFloor)
			}
			for _, w := range tc.reason {
				if !strings.Contains(rep.Reason, w) {
					t.Errorf("reason %q does not say %q", rep.Reason, w)
				}
			}
			var b bytes.Buffer
			writeStageTable(&b, rep.Capture)
			for _, w := range tc.table {
				if !strings.Contains(b.String(), w) {
					t.Errorf("table does not say %q:\n%s", w, b.String())
				}
			}
			for _, w := range tc.noTable {
				if strings.Contains(b.String()+rep.Reason, w) {
					t.Errorf("table or reason says %q:\n%s%s", w, rep.Reason, b.String())
				}
			}
		})
	}
}
