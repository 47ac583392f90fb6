package diagnose

import (
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/kcheck-dev/kcheck/internal/printable"
	"github.com/kcheck-dev/kcheck/internal/sim"
)

// WriteText writes the report for a person: the verdict and culprit first,
// then the evidence (the stage table and worst elements of a capture; the
// drift curve and the swaps of a simulation).
// Names and messages are escaped (printable.Escape): they come from files
// and flags, and a terminal must not act on them.
func (r *Report) WriteText(w io.Writer) {
	what := esc(r.File)
	if r.Mode == "simulation" {
		what = fmt.Sprintf("simulation on %s", esc(r.Backend))
	}
	head := fmt.Sprintf("%-12s %s", strings.ToUpper(esc(string(r.Verdict))), what)
	if r.Stage != nil {
		head += ": culprit stage " + esc(*r.Stage)
	}
	fmt.Fprintln(w, head)
	if r.Error != nil {
		fmt.Fprintf(w, "  error: %s\n", esc(*r.Error))
		return
	}
	if r.Config != nil {
		fmt.Fprintf(w, "  %s\n", esc(fmt.Sprint(r.Config)))
	}
	if r.Reason != "" {
		fmt.Fprintf(w, "  %s\n", esc(r.Reason))
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "  note: %s\n", esc(n))
	}
	if r.Capture != nil {
		writeStageTable(w, r.Capture)
	}
	if r.Mode == "simulation" {
		writeDrift(w, r)
	}
}

func writeStageTable(w io.Writer, a *CaptureAttribution) {
	fmt.Fprintf(w, "\n  %-12s %-18s %-30s %-30s %s\n", "stage", "kernel", "local error (floor)", "propagated error (floor)", "signature")
	carried := map[string]bool{}
	for _, p := range carriedWithinTolerance(a) {
		carried[p] = true
	}
	for _, r := range a.Stages {
		local := fmt.Sprintf("%-4s %s (%s)", short(string(r.Verdict)), fmtErr(float64(r.LocalError)), fmtErr(float64(r.LocalFloor)))
		prop := "-"
		if r.PropagatedError != nil {
			v := short(string(r.PropagatedVerdict))
			if carried[r.Prefix] {
				v = "over"
			}
			prop = fmt.Sprintf("%-4s %s (%s)", v, fmtErr(float64(*r.PropagatedError)), fmtErr(float64(*r.PropagatedFloor)))
		}
		sig := ""
		if r.Signature != nil && r.Signature.Pattern != "none" {
			sig = esc(r.Signature.Pattern)
			if r.Signature.Coord != "" {
				sig += " (" + esc(r.Signature.Coord) + ")"
			}
		}
		mark := " "
		if a.Culprit != nil && *a.Culprit == r.Prefix {
			mark = ">"
		}
		fmt.Fprintf(w, "%s %-12s %-18s %-30s %-30s %s\n", mark, esc(r.Prefix), esc(r.Kernel), local, prop, sig)
	}
	if len(carried) > 0 {
		fmt.Fprintf(w, "  over: past the stage's own tolerance against the reference chain, by earlier stages' deviations that no check failed, carried forward: not a fault\n")
	}
	for _, c := range a.Evidence {
		fmt.Fprintf(w, "\n  evidence: %s %s %v: %s\n", esc(c.Tensor), esc(string(c.DType)), c.Shape, esc(c.Reason))
		m := c.Metrics
		for _, s := range m.Specials {
			if s.Mismatch > 0 {
				fmt.Fprintf(w, "    special values: %s\n", esc(s.String()))
			}
		}
		fmt.Fprintf(w, "    %d of %d elements over tolerance; max abs %.4g, cos diff %.3g (floor %.3g)\n",
			m.OverTol, m.N, float64(m.MaxAbs), float64(m.CosDiff), float64(m.FloorCosDiff))
		for i, e := range c.Worst {
			if i == 0 {
				fmt.Fprintln(w, "    worst elements:")
			}
			fmt.Fprintf(w, "      %s: actual %.6g, expected %.6g, exact %.6g (%.3g× tolerance)\n",
				esc(e.Where()), float64(e.Actual), float64(e.Expected), float64(e.Exact), float64(e.Excess))
		}
		if c.Signature != nil {
			fmt.Fprintf(w, "    signature: %s", esc(c.Signature.Pattern))
			if c.Signature.Detail != "" {
				fmt.Fprintf(w, ": %s", esc(c.Signature.Detail))
			}
			fmt.Fprintln(w)
		}
	}
}

// esc is printable.Escape, for everything WriteText prints that is not its
// own.
func esc(s string) string { return printable.Escape(s) }

func short(v string) string {
	switch v {
	case "fail":
		return "FAIL"
	case "inconclusive":
		return "INC"
	}
	return v
}

func writeDrift(w io.Writer, r *Report) {
	if r.FirstStep != nil {
		st := r.Steps[*r.FirstStep]
		fmt.Fprintf(w, "  first off the floor: step %d (prompt %d, its step %d), context %d: error %s against a floor of %s\n",
			st.Step, st.Prompt, st.PromptStep, st.ContextLen, fmtErr(float64(st.Error)), fmtErr(float64(st.Floor)))
	}
	fmt.Fprintf(w, "\n  %5s %6s %7s  %-10s %-10s %-8s %s\n", "step", "prompt", "context", "error", "floor", "x thr", "")
	for _, s := range r.Steps {
		flag := ""
		if s.OffFloor {
			flag = "OFF THE FLOOR"
		}
		if s.TokensChanged > 0 {
			flag += fmt.Sprintf("  (%d next token%s changed)", s.TokensChanged, plural(s.TokensChanged, "", "s"))
		}
		fmt.Fprintf(w, "  %5d %6d %7d  %-10s %-10s %-8s %s\n", s.Step, s.Prompt, s.ContextLen,
			fmtErr(float64(s.Error)), fmtErr(float64(s.Floor)), fmtRatio(float64(s.Error)/float64(s.Threshold)), bar(float64(s.Error)/float64(s.Threshold))+" "+flag)
	}
	if len(r.Swaps) > 0 {
		fmt.Fprintln(w, "\n  each stage swapped for its reference:")
		for _, s := range r.Swaps {
			fmt.Fprintf(w, "    %-8s %s\n", esc(s.Stage), swapLine(s, "removes the drift", "still drifts"))
		}
	}
	if len(r.Isolated) > 0 {
		fmt.Fprintln(w, "\n  each stage alone on the backend:")
		for _, s := range r.Isolated {
			fmt.Fprintf(w, "    %-8s %s\n", esc(s.Stage), swapLine(s, "drifts", "stays on the floor"))
		}
	}
}

func swapLine(s sim.SwapResult, yes, no string) string {
	verb := no
	if s.RemovesDrift {
		verb = yes
	}
	line := fmt.Sprintf("%s (worst %s x the threshold, max error %s", verb, fmtRatio(float64(s.MaxRatio)), fmtErr(float64(s.MaxError)))
	if s.FirstStep != nil {
		line += fmt.Sprintf(", off the floor from step %d", *s.FirstStep)
	}
	return line + ")"
}

func fmtRatio(x float64) string {
	if math.IsInf(x, 0) || math.IsNaN(x) {
		return "inf"
	}
	return fmt.Sprintf("%.3g", x)
}

// bar draws error/threshold on a log scale: one # a factor of 2 above 1/8.
func bar(ratio float64) string {
	if !(ratio > 0.125) {
		return ""
	}
	n := int(math.Log2(ratio/0.125)) + 1
	if math.IsInf(ratio, 0) || math.IsNaN(ratio) || n > 16 {
		n = 16
	}
	s := strings.Repeat("#", n)
	if ratio > 1 && n > 3 {
		s = s[:3] + "|" + s[3:] // the | marks the threshold
	}
	return s
}
