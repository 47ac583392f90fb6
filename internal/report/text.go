// Package report renders check results for people: the terminal summary
// `kcheck check` prints, and the Markdown, JSON and plots that `--report`
// writes for a bug report.
package report

import (
	"fmt"
	"io"
	"strings"

	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/printable"
)

// TextOptions tune the terminal summary.
type TextOptions struct {
	// Quiet prints only the verdict line.
	Quiet bool
}

// Text writes a readable summary of res: special-value mismatches first,
// then the error metrics against their noise floor, the worst elements in
// the kernel's coordinates, and the signature, as FlashMLA's compare.py
// orders them.
//
// Every name and message in it is escaped (printable.Escape): they come
// from files, and a terminal must not act on them.
func Text(w io.Writer, res check.Result, opt TextOptions) {
	label := esc(res.Kernel)
	if res.Stage != nil {
		label += ", culprit stage " + esc(*res.Stage)
	}
	if label != "" { // a file that says no kernel gets no empty "()"
		label = "  (" + label + ")"
	}
	fmt.Fprintf(w, "%-12s %s%s\n", strings.ToUpper(esc(string(res.Verdict))), esc(res.File), label)
	if opt.Quiet {
		return
	}
	if res.Error != nil {
		fmt.Fprintf(w, "  error: %s\n", esc(*res.Error))
	}
	for _, n := range res.Notes {
		fmt.Fprintf(w, "  note: %s\n", esc(n))
	}
	if len(res.Stages) > 0 {
		fmt.Fprintf(w, "  %-10s %-18s %-13s %-28s %s\n", "stage", "kernel", "local", "local worst err/tol", "propagated worst err/tol")
		for _, st := range res.Stages {
			fmt.Fprintf(w, "  %-10s %-18s %-13s %-28s %s\n", esc(st.Prefix), esc(st.Kernel), esc(string(st.Verdict)), worstExcess(st.Local), worstExcess(st.Propagated))
		}
	}
	for _, c := range res.Checks {
		writeCheck(w, c)
	}
}

func worstExcess(cs []compare.Check) string {
	if len(cs) == 0 {
		return "-"
	}
	best, name := -1.0, ""
	for _, c := range cs {
		if v := float64(c.Metrics.MaxExcess); v > best || name == "" {
			best, name = v, c.Tensor
		}
	}
	return fmt.Sprintf("%.3g (%s)", best, esc(name))
}

func writeCheck(w io.Writer, c compare.Check) {
	m := c.Metrics
	fmt.Fprintf(w, "  %s %s %v: %s", esc(c.Tensor), esc(string(c.DType)), c.Shape, esc(string(c.Verdict)))
	if c.Reason != "" {
		fmt.Fprintf(w, ": %s", esc(c.Reason))
	}
	fmt.Fprintln(w)
	if c.Verdict == compare.Pass {
		fmt.Fprintf(w, "      max abs %.3g, max ulp %.3g, cos diff %.3g (floor %.3g), worst err/tol %.3g\n",
			float64(m.MaxAbs), float64(m.MaxULP), float64(m.CosDiff), float64(m.FloorCosDiff), float64(m.MaxExcess))
		return
	}
	for _, s := range m.Specials {
		if s.Mismatch > 0 {
			fmt.Fprintf(w, "      special values: %s\n", esc(s.String()))
		}
	}
	fmt.Fprintf(w, "      %d of %d elements over tolerance (%.3g%%); %d excused as rounding ties\n", m.OverTol, m.N, 100*float64(m.OverFrac), m.Excused)
	fmt.Fprintf(w, "      max abs %.4g, max rel %.4g, max ulp %.4g\n", float64(m.MaxAbs), float64(m.MaxRel), float64(m.MaxULP))
	fmt.Fprintf(w, "      cos diff %.3g (floor %.3g), rmse %.3g (floor %.3g), sqnr %.1f dB\n",
		float64(m.CosDiff), float64(m.FloorCosDiff), float64(m.RMSE), float64(m.FloorRMSE), float64(m.SQNRdB))
	for i, e := range c.Worst {
		if i == 0 {
			fmt.Fprintln(w, "      worst elements:")
		}
		fmt.Fprintf(w, "        %s: actual %.6g, expected %.6g, exact %.6g (err %.3g, tol %.3g)\n",
			esc(e.Where()), float64(e.Actual), float64(e.Expected), float64(e.Exact), float64(e.Err), float64(e.Tol))
	}
	if where := coordLegend(c.Worst); where != "" {
		fmt.Fprintf(w, "      (%s)\n", where)
	}
	if c.Signature != nil {
		fmt.Fprintf(w, "      signature: %s\n", signatureLine(c))
	}
	if c.Tolerance != "" {
		fmt.Fprintf(w, "      tolerance: %s\n", esc(c.Tolerance))
	}
}

// coordLegend says what the coordinates of the worst elements mean, those
// whose name does not say it (kernel.CoordMeaning), in the order they
// first appear: "part: region of the cache entry, 0 latent, ...".
func coordLegend(worst []compare.Element) string {
	var parts []string
	seen := map[string]bool{}
	for _, e := range worst {
		for _, c := range e.Coords {
			if m := kernel.CoordMeaning(c.Name); m != "" && !seen[c.Name] {
				seen[c.Name] = true
				parts = append(parts, c.Name+": "+m)
			}
		}
	}
	return strings.Join(parts, "; ")
}

// signatureLine renders the named pattern and its evidence in one line.
func signatureLine(c compare.Check) string {
	s := c.Signature
	line := s.Pattern
	if s.Coord != "" {
		line += " (by " + s.Coord + ")"
	}
	if s.Detail != "" {
		line += ": " + s.Detail
	}
	return esc(line)
}

// esc is printable.Escape, for everything Text prints that is not its own.
func esc(s string) string { return printable.Escape(s) }
