package diagnose

import (
	"context"
	"fmt"
	"github.com/kcheck-dev/kcheck/internal/evidence"
	"math"
	"regexp"
	"strconv"
	"strings"

	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/signature"
	"github.com/kcheck-dev/kcheck/internal/sim"
)

// CaptureAttribution is a pipeline capture's stage table: for each stage
// its LOCAL error (its output against the reference run on its own captured
// inputs) and PROPAGATED error (against the reference chain run from the
// first stage's inputs), and the culprit, the first stage whose local
// check fails.
type CaptureAttribution struct {
	Stages []StageRow `json:"stages"`
	// Culprit is the culprit stage's prefix ("cache", "s1.attn"), null
	// when no stage fails locally.
	Culprit *string `json:"culprit"`
	// Explanation says in words why the culprit is the culprit.
	Explanation string `json:"explanation"`
	// Evidence holds the culprit's failing local checks: worst elements
	// in the kernel's coordinates, signature, metrics.
	Evidence []compare.Check `json:"evidence,omitempty"`
}

// StageRow is one stage of the table. Errors are relative: sqrt(2·cos_diff)
// (about the relative RMS error) for numeric outputs, the fraction of
// differing elements for bitwise ones (cache bytes, FP4 codes), and the
// worst of the stage's output tensors.
type StageRow struct {
	Prefix  string          `json:"prefix"`
	Kernel  string          `json:"kernel"`
	Stage   string          `json:"stage"`
	Step    int             `json:"step"`
	Verdict compare.Verdict `json:"verdict"`
	// Tensor is the output the local error was worst on.
	Tensor     string        `json:"tensor"`
	LocalError compare.Float `json:"local_error"`
	LocalFloor compare.Float `json:"local_floor"`
	// LocalExcess is the worst element's error over its tolerance.
	LocalExcess compare.Float `json:"local_excess"`
	// Propagated* are absent for the first stage (nothing propagates into
	// it). PropagatedVerdict is the propagated check's verdict against this
	// stage's own tolerance; before a culprit (or with none) a fail there is
	// the earlier stages' accepted deviations carried forward, never a
	// fault (carriedWithinTolerance), and the table prints it as "over".
	PropagatedVerdict compare.Verdict      `json:"propagated_verdict,omitempty"`
	PropagatedError   *compare.Float       `json:"propagated_error,omitempty"`
	PropagatedFloor   *compare.Float       `json:"propagated_floor,omitempty"`
	Signature         *signature.Signature `json:"signature,omitempty"`
}

// checkError is a check's relative error and floor (see StageRow).
func checkError(c compare.Check) (err, floor float64) {
	m := c.Metrics
	if m.NaNMismatch+m.InfMismatch > 0 {
		return math.Inf(1), 0
	}
	if c.Mode == "bitwise" {
		return float64(m.OverFrac), 0
	}
	return math.Sqrt(math.Max(0, 2*float64(m.CosDiff))), math.Sqrt(math.Max(0, 2*float64(m.FloorCosDiff)))
}

// worstOf returns the check with the largest error, its error and floor.
func worstOf(cs []compare.Check) (*compare.Check, float64, float64) {
	var w *compare.Check
	we, wf := -1.0, 0.0
	for i := range cs {
		e, f := checkError(cs[i])
		if e > we || math.IsNaN(e) {
			w, we, wf = &cs[i], e, f
		}
	}
	if w == nil {
		return nil, 0, 0
	}
	return w, we, wf
}

func verdictOf(cs []compare.Check) compare.Verdict {
	if len(cs) == 0 {
		return ""
	}
	return compare.FileVerdict(cs)
}

var stepPrefix = regexp.MustCompile(`^s(\d+)\.`)

// stepOf reads the decode step of a stage prefix ("s3.attn" is step 3; a
// prefix without one is step 0).
func stepOf(prefix string) int {
	if m := stepPrefix.FindStringSubmatch(prefix); m != nil {
		n, _ := strconv.Atoi(m[1])
		return n
	}
	return 0
}

// FromCheck lays out a checked capture for a human: the stage table, the
// culprit and its evidence, and (reference/CONTRACTS.md §7.5) the per-step error curve of a
// multi-step pipeline. A single-kernel capture is a one-stage pipeline.
// contextLens gives each step's longest context (from the capture's
// seq_lens), when known.
func FromCheck(res check.Result, contextLens map[int]int) *Report {
	rep := &Report{Mode: "capture", File: res.File, Verdict: res.Verdict, Thresholds: sim.DefaultThresholds(), Notes: res.Notes, Steps: []sim.StepResult{}}
	if res.Error != nil {
		rep.Error = res.Error
		rep.Reason = *res.Error
		return rep
	}
	att := &CaptureAttribution{}
	stages := res.Stages
	if len(stages) == 0 {
		// A single kernel is a one-stage pipeline named by its stage
		// (reference/CONTRACTS.md §7.1: stages are quant, cache, attn, combine
		// everywhere, diagnose included).
		stage := res.Kernel
		if k, err := kernel.Lookup(res.Kernel); err == nil {
			stage = k.Spec().Stage
		}
		stages = []check.StageResult{{Prefix: stage, Kernel: res.Kernel, Stage: stage, Verdict: res.Verdict, Local: res.Checks}}
	}
	for _, st := range stages {
		row := StageRow{Prefix: st.Prefix, Kernel: st.Kernel, Stage: st.Stage, Step: stepOf(st.Prefix), Verdict: st.Verdict}
		if w, e, f := worstOf(st.Local); w != nil {
			row.Tensor, row.LocalError, row.LocalFloor, row.LocalExcess = w.Tensor, compare.Float(e), compare.Float(f), w.Metrics.MaxExcess
			row.Signature = w.Signature
		}
		if w, e, f := worstOf(st.Propagated); w != nil {
			pe, pf := compare.Float(e), compare.Float(f)
			row.PropagatedVerdict, row.PropagatedError, row.PropagatedFloor = verdictOf(st.Propagated), &pe, &pf
			// The pattern of a propagated error names something only when
			// it is a culprit's error carried forward; before a culprit it is
			// the pattern of deviations every earlier check accepted.
			if row.Signature == nil && att.Culprit != nil {
				row.Signature = w.Signature
			}
		}
		att.Stages = append(att.Stages, row)
		if st.Verdict == check.Fail && att.Culprit == nil {
			p := st.Prefix
			att.Culprit = &p
			for _, c := range st.Local {
				if c.Verdict != compare.Pass {
					att.Evidence = append(att.Evidence, c)
				}
			}
		}
	}
	if res.Stage != nil {
		att.Culprit = res.Stage
	}
	rep.Stage = att.Culprit
	att.Explanation = explain(att)
	rep.Reason = att.Explanation
	rep.Capture = att

	// The per-step curve: a step's error is its last stage's propagated
	// error (the end of the chain so far), or its local one. A step is off
	// the floor when a stage of it is wrong on its own inputs, or carries a
	// culprit's error past its tolerance; a propagated excess before any
	// culprit is not: see carriedWithinTolerance.
	afterCulprit := false
	for _, row := range att.Stages {
		if len(rep.Steps) == 0 || rep.Steps[len(rep.Steps)-1].Step != row.Step {
			rep.Steps = append(rep.Steps, sim.StepResult{Step: row.Step, ContextLen: contextLens[row.Step]})
		}
		sr := &rep.Steps[len(rep.Steps)-1]
		sr.Error, sr.Floor = row.LocalError, row.LocalFloor
		if row.PropagatedError != nil {
			sr.Error, sr.Floor = *row.PropagatedError, *row.PropagatedFloor
		}
		afterCulprit = afterCulprit || (att.Culprit != nil && row.Prefix == *att.Culprit)
		sr.OffFloor = sr.OffFloor || row.Verdict == check.Fail || (afterCulprit && row.PropagatedVerdict == check.Fail)
	}
	// The first step that goes wrong is the culprit's: the first stage wrong
	// on its own inputs, every stage before it correct on what it was given.
	// Without a culprit no step goes wrong.
	if att.Culprit != nil {
		f := stepOf(*att.Culprit)
		for _, s := range rep.Steps {
			if s.Step == f {
				c := s.ContextLen
				rep.FirstStep, rep.FirstContextLen = &f, &c
			}
		}
	}
	return rep
}

// carriedWithinTolerance lists the stages before the culprit (every stage
// when there is none) whose propagated check fails or is inconclusive.
//
// Such an excess is never a fault. The propagated check feeds a stage the
// reference chain's outputs where the capture links an earlier stage, and
// the same stored tensors as the local check everywhere else, so the two
// runs differ only by the earlier stages' outputs, none of which its own
// local check failed. Their deviations within their tolerances, carried
// through this stage, can exceed this stage's own, much tighter, tolerance:
// a correct SGLang decode's attention partials, within their bf16-P
// tolerance, move its merged output past the merge's f32 rounding
// (python/tests/test_capture_sglang_e2e.py).
func carriedWithinTolerance(att *CaptureAttribution) []string {
	var carried []string
	for _, r := range att.Stages {
		if att.Culprit != nil && r.Prefix == *att.Culprit {
			break
		}
		if r.PropagatedVerdict == check.Fail || r.PropagatedVerdict == check.Inconclusive {
			carried = append(carried, r.Prefix)
		}
	}
	return carried
}

func explain(att *CaptureAttribution) string {
	if att.Culprit == nil {
		if carried := carriedWithinTolerance(att); len(carried) > 0 {
			return fmt.Sprintf("every stage is correct on its own captured inputs; against the reference chain %s %s past %s own tolerance by the earlier stages' deviations, none of which fails its own check, carried forward (a measurement, not a fault)",
				strings.Join(carried, ", "), plural(len(carried), "goes", "go"), plural(len(carried), "its", "their"))
		}
		return "every stage is correct on its own captured inputs and against the reference chain"
	}
	var row StageRow
	var later []string
	found := false
	for _, r := range att.Stages {
		switch {
		case r.Prefix == *att.Culprit:
			row, found = r, true
		case found && r.Verdict != check.Fail && r.PropagatedVerdict == check.Fail:
			later = append(later, r.Prefix)
		}
	}
	s := fmt.Sprintf("%s (%s) is the first stage whose output is wrong on its own captured inputs (%s off by %s, %.3g× its tolerance at worst)",
		row.Prefix, row.Kernel, row.Tensor, fmtErr(float64(row.LocalError)), float64(row.LocalExcess))
	if len(later) > 0 {
		s += fmt.Sprintf("; %s %s correct on what %s given and %s only against the reference chain, through it",
			strings.Join(later, ", "), plural(len(later), "is", "are"), plural(len(later), "it was", "they were"), plural(len(later), "fails", "fail"))
	}
	return s
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// fmtErr renders a relative error as a percentage (or "NaN/Inf").
func fmtErr(e float64) string {
	switch {
	case math.IsInf(e, 0) || math.IsNaN(e):
		return "NaN/Inf"
	case e == 0:
		return "0"
	case e < 1e-7:
		return fmt.Sprintf("%.2g", e)
	}
	return fmt.Sprintf("%.3g%%", 100*e)
}

// Capture checks a capture under ctx and lays out its attribution.
func Capture(ctx context.Context, c evidence.Capture, opts check.Options) *Report {
	return FromCheck(check.Run(ctx, c, opts), ContextLens(c))
}

// ContextLens reads each step's longest context from the capture's
// seq_lens tensors ("seq_lens", "<stage>.seq_lens", "s2.attn.seq_lens").
func ContextLens(c evidence.Capture) map[int]int {
	out := map[int]int{}
	for name, t := range c.Tensors {
		if name != "seq_lens" && !strings.HasSuffix(name, ".seq_lens") || !t.DType.IsInt() || t.Check() != nil {
			continue
		}
		step := stepOf(name)
		for i := 0; i < t.Len(); i++ {
			out[step] = max(out[step], int(t.Int64At(i)))
		}
	}
	return out
}
