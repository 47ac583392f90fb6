package report

import (
	"fmt"
	"io"
	"math"
	"path"
	"sort"
	"strings"

	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/signature"
)

// Figure is a plot the Markdown links to, or one that could not be drawn.
type Figure struct {
	Path    string // relative to the report directory
	Caption string
	// Err says why the plot (Caption names it) was not drawn.
	Err string
}

// figures are the plots of a bundle: by item index and check tensor, and
// the drift plot.
type figures struct {
	byCheck map[int]map[string][]Figure
	drift   *Figure
}

// MarkdownOptions tune the Markdown.
type MarkdownOptions struct {
	// MaxDetails bounds the items given a detailed section (default 10);
	// the rest appear in the summary table only.
	MaxDetails int
}

// detailed picks the items worth a section: every item that does not
// pass (or all of them when everything passes), at most max.
func detailed(items []Item, max int) []int {
	if max <= 0 {
		max = 10
	}
	var idx []int
	for i, it := range items {
		if it.Result.Verdict != check.Pass {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		for i := range items {
			idx = append(idx, i)
		}
	}
	if len(idx) > max {
		idx = idx[:max]
	}
	return idx
}

// Markdown writes the report: a summary, a section per failing item
// (reproduction, capture provenance, stage attribution, a metrics table per
// output, worst elements, signature, plots), the drift of a diagnosis, the
// environment and the evidence hashes. It is written to paste into a GitHub
// issue.
func Markdown(w io.Writer, b Bundle, opt MarkdownOptions) error {
	return markdown(w, b, figures{}, opt)
}

func markdown(w io.Writer, b Bundle, figs figures, opt MarkdownOptions) error {
	mw := &mdWriter{w: w}
	mw.p("## %s\n\n", title(b))
	if n := figs.drawn(); n > 0 {
		files := "PNG file"
		if n > 1 {
			files = "PNG files"
		}
		// A pasted report.md cannot show plots/; the reader attaches them.
		mw.p("*The %d plots below are %s in `plots/` beside this report, each named in its figure's caption: attach them to the issue with it. The text says what each one shows and reads whole without them.*\n\n", n, files)
	}
	if len(b.Items) > 1 || (len(b.Items) == 1 && b.Diagnosis != nil) {
		mw.p("| # | file or case | kernel | verdict | culprit stage | worst err/tol |\n|---|---|---|---|---|---|\n")
		for i, it := range b.Items {
			r := it.Result
			mw.p("| %d | %s | %s | %s | %s | %s |\n", i+1, cellCode(r.File), text(r.Kernel), verdictCell(r.Verdict), stageCell(r.Stage), worstCell(r.Checks))
		}
		mw.p("\n")
	}
	if d := b.Diagnosis; d != nil {
		writeDiagnosis(mw, d, figs.drift)
	}
	for _, i := range detailed(b.Items, opt.MaxDetails) {
		writeItem(mw, i, len(b.Items), b.Items[i], figs.byCheck[i])
	}
	writeEnvironment(mw, b)
	return mw.err
}

type mdWriter struct {
	w   io.Writer
	err error
	fig int // figures written so far
}

func (m *mdWriter) p(format string, args ...any) {
	if m.err == nil {
		_, m.err = fmt.Fprintf(m.w, format, args...)
	}
}

func title(b Bundle) string {
	if b.Title != "" {
		return text(b.Title)
	}
	count := map[compare.Verdict]int{}
	for _, it := range b.Items {
		count[it.Result.Verdict]++
	}
	var parts []string
	for _, v := range []compare.Verdict{check.Fail, check.Error, check.Inconclusive, check.Pass} {
		if count[v] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", count[v], text(string(v))))
		}
	}
	t := "kcheck report"
	if b.Diagnosis != nil {
		t = "kcheck diagnosis: " + text(string(b.Diagnosis.Verdict))
		if b.Diagnosis.Stage != nil {
			t += ", culprit stage " + code(*b.Diagnosis.Stage)
		}
		if len(parts) == 0 {
			return t
		}
	}
	if len(b.Items) == 1 && b.Diagnosis == nil {
		r := b.Items[0].Result
		t = fmt.Sprintf("kcheck: %s: %s", text(strings.ToUpper(string(r.Verdict))), text(r.Kernel))
		if r.Stage != nil {
			t += ", culprit stage " + code(*r.Stage)
		}
		return t
	}
	return t + ": " + strings.Join(parts, ", ")
}

func verdictCell(v compare.Verdict) string {
	if v == check.Pass {
		return "pass"
	}
	return "**" + text(strings.ToUpper(string(v))) + "**"
}

func stageCell(s *string) string {
	if s == nil {
		return "–"
	}
	return cellCode(*s)
}

func worstCell(cs []compare.Check) string {
	best, name := -1.0, ""
	for _, c := range cs {
		if v := float64(c.Metrics.MaxExcess); v > best || name == "" {
			best, name = v, c.Tensor
		}
	}
	if name == "" {
		return "–"
	}
	return fmt.Sprintf("%s (%s)", num(best), cellCode(name))
}

// num formats a metric: 4 significant digits, Inf and NaN spelled.
func num(v float64) string {
	switch {
	case math.IsNaN(v):
		return "NaN"
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	}
	return fmt.Sprintf("%.4g", v)
}

func writeItem(mw *mdWriter, i, n int, it Item, figs map[string][]Figure) {
	r := it.Result
	head := "###"
	if n > 1 {
		mw.p("%s %d. %s: %s, %s\n\n", head, i+1, code(r.File), text(r.Kernel), verdictCell(r.Verdict))
	} else {
		mw.p("%s %s: %s, %s\n\n", head, code(r.File), text(r.Kernel), verdictCell(r.Verdict))
	}
	if r.Error != nil {
		mw.p("**The file could not be checked:** %s\n\n", text(*r.Error))
	}
	if sum := summary(r); sum != "" {
		mw.p("**In short:** %s\n\n", sum)
	}
	if it.Reproduce != "" {
		mw.p("Reproduce:\n\n%s\n\n", fenced("sh", it.Reproduce))
	}
	if len(r.Provenance) > 0 {
		mw.p("Capture: %s\n\n", provenanceLine(r.Provenance))
	}
	if pr := r.Precision; pr != nil {
		sat := "saturating"
		if !pr.FP8Saturate {
			sat = "non-saturating"
		}
		mw.p("Declared precision: accumulation %s, P %s, KV dequantized to %s, FP8 stores %s. Tolerance policy: %s.\n\n",
			text(pr.Acc), text(pr.P), text(pr.KVDequant), sat, text(r.Policy))
	}
	if len(r.Stages) > 0 {
		writeStages(mw, r)
	}
	// Full detail for what did not pass (or for everything when all
	// passed); a passing output beside a failing one gets one table row.
	var passing []compare.Check
	for _, c := range r.Checks {
		if c.Verdict == compare.Pass && r.Verdict != check.Pass {
			passing = append(passing, c)
			continue
		}
		writeCheckMD(mw, c, figs[c.Tensor])
	}
	if len(passing) > 0 {
		mw.p("Outputs that pass:\n\n| output | dtype | shape | worst err/tol | cos diff (floor) | RMSE (floor) |\n|---|---|---|---|---|---|\n")
		for _, c := range passing {
			m := c.Metrics
			mw.p("| %s | %s | %s | %s | %s (%s) | %s (%s) |\n", cellCode(c.Tensor), text(string(c.DType)), shapeOf(c.Shape), num(float64(m.MaxExcess)),
				num(float64(m.CosDiff)), num(float64(m.FloorCosDiff)), num(float64(m.RMSE)), num(float64(m.FloorRMSE)))
		}
		mw.p("\n")
	}
	if len(r.Notes) > 0 {
		mw.p("Notes:\n\n")
		for _, note := range r.Notes {
			mw.p("- %s\n", text(note))
		}
		mw.p("\n")
	}
}

func provenanceLine(p map[string]string) string {
	labels := []struct{ key, label string }{
		{"source", "source"}, {"device", "device"}, {"driver", "driver"},
		{"kernel_build", "kernel build"}, {"captured_at", "captured"},
	}
	var parts []string
	seen := map[string]bool{}
	for _, l := range labels {
		if v, ok := p[l.key]; ok {
			parts = append(parts, fmt.Sprintf("%s %s", l.label, code(v)))
			seen[l.key] = true
		}
	}
	var rest []string
	for k := range p {
		if !seen[k] {
			rest = append(rest, k)
		}
	}
	sort.Strings(rest)
	for _, k := range rest {
		parts = append(parts, fmt.Sprintf("%s %s", text(k), code(p[k])))
	}
	return strings.Join(parts, " · ")
}

func writeStages(mw *mdWriter, r check.Result) {
	mw.p("Stage attribution: each stage's LOCAL error (its output against the reference run on the stage's own captured inputs) and PROPAGATED error (against the reference chain run from the first stage's inputs).\n\n")
	mw.p("err/tol is an element's error over its tolerance: at most 1 is within it.\n\n")
	mw.p("| stage | kernel | verdict | local worst err/tol | propagated worst err/tol |\n|---|---|---|---|---|\n")
	for _, st := range r.Stages {
		mw.p("| %s | %s | %s | %s | %s |\n", cellCode(st.Prefix), text(st.Kernel), verdictCell(st.Verdict), worstCell(st.Local), worstCell(st.Propagated))
	}
	if r.Stage != nil {
		mw.p("\nThe first stage whose local error leaves its budget is **%s**: the stages before it are correct on their own inputs, so the error starts there.\n\n", code(*r.Stage))
	} else {
		mw.p("\nNo stage's local error leaves its budget.\n\n")
	}
}

func writeCheckMD(mw *mdWriter, c compare.Check, figs []Figure) {
	m := c.Metrics
	mw.p("#### %s %s %s: %s\n\n", code(c.Tensor), text(string(c.DType)), shapeOf(c.Shape), verdictCell(c.Verdict))
	if c.Reason != "" {
		mw.p("%s.\n\n", text(strings.TrimSuffix(c.Reason, ".")))
	}
	for _, s := range m.Specials {
		if s.Mismatch > 0 {
			mw.p("**Special values** (judged before any number): %s.\n\n", text(s.String()))
		}
	}
	mw.p("| metric | value | noise floor (expected vs exact) | bound |\n|---|---|---|---|\n")
	f := func(v compare.Float) string { return num(float64(v)) }
	bound := func(v compare.Float) string {
		if v == 0 {
			return "–"
		}
		return f(v)
	}
	mw.p("| max abs error | %s | %s | |\n", f(m.MaxAbs), f(m.FloorMaxAbs))
	mw.p("| max rel error | %s | | |\n", f(m.MaxRel))
	mw.p("| max ULP (vs expected, %s) | %s | | |\n", text(string(c.DType)), f(m.MaxULP))
	mw.p("| cos diff | %s | %s | %s |\n", f(m.CosDiff), f(m.FloorCosDiff), bound(m.CosDiffBound))
	mw.p("| RMSE | %s | %s | %s |\n", f(m.RMSE), f(m.FloorRMSE), bound(m.RMSEBound))
	mw.p("| SQNR (dB) | %s | | |\n", f(m.SQNRdB))
	mw.p("| over tolerance | %d of %d (%s%%) | | |\n", m.OverTol, m.N, num(100*float64(m.OverFrac)))
	if m.Excused > 0 {
		mw.p("| accepted as equivalent | %d | | |\n", m.Excused)
	}
	mw.p("| worst err/tol | %s | | 1 |\n\n", f(m.MaxExcess))
	if len(c.Worst) > 0 && c.Verdict != compare.Pass {
		mw.p("Worst elements:\n\n| where | actual | expected | exact | err | tol | err/tol |\n|---|---|---|---|---|---|---|\n")
		for _, e := range c.Worst {
			where := e.Where()
			if where == "" {
				where = fmt.Sprint(e.Index)
			}
			mw.p("| %s | %s | %s | %s | %s | %s | %s |\n", text(where), num(float64(e.Actual)), num(float64(e.Expected)),
				num(float64(e.Exact)), num(float64(e.Err)), num(float64(e.Tol)), num(float64(e.Excess)))
		}
		mw.p("\n")
	}
	if s := c.Signature; s != nil {
		mw.p("**Signature: %s**", code(s.Pattern))
		if s.Coord != "" {
			mw.p(" (by %s)", code(s.Coord))
		}
		if s.Detail != "" {
			mw.p(": %s", text(s.Detail))
		}
		mw.p("\n\n")
		var groups []signature.Group
		for _, g := range s.Groups {
			// A concentration lists the values holding the excess; a trend
			// lists samples along the coordinate, each worth showing.
			if g.Share > 0 || g.Failing > 0 || s.Pattern == signature.GrowthWithContext {
				groups = append(groups, g)
			}
		}
		if len(groups) > 0 && s.Coord != "" {
			mw.p("| %s | share of the excess | share of the elements | failing | mean err/tol |\n|---|---|---|---|---|\n", text(s.Coord))
			for _, g := range groups {
				mw.p("| %d | %s%% | %s%% | %d | %s |\n", g.Value, num(100*g.Share), num(100*g.Elements), g.Failing, num(g.MeanExcess))
			}
			mw.p("\n")
		}
	}
	for _, fg := range figs {
		writeFigure(mw, fg)
	}
	if c.Tolerance != "" {
		mw.p("<details><summary>How the tolerance was set</summary>\n\n%s\n\n</details>\n\n", text(c.Tolerance))
	}
}

func writeDiagnosis(mw *mdWriter, d *Diagnosis, fig *Figure) {
	mw.p("### Drift\n\n")
	if d.Mode != "" || d.Backend != "" || d.File != "" {
		var what []string
		if d.Mode != "" {
			what = append(what, text(d.Mode))
		}
		if d.Backend != "" {
			what = append(what, "backend "+code(d.Backend))
		}
		if d.File != "" {
			what = append(what, "capture "+code(d.File))
		}
		mw.p("Diagnosis of a %s.\n\n", strings.Join(what, ", "))
	}
	mw.p("Verdict: %s. ", verdictCell(d.Verdict))
	if d.Stage != nil {
		mw.p("Culprit stage: **%s**. ", code(*d.Stage))
	} else {
		mw.p("No stage is to blame. ")
	}
	if d.FirstStep != nil {
		mw.p("The error first leaves the noise floor at step %d", *d.FirstStep)
		if d.FirstContextLen != nil {
			mw.p(" (context length %d)", *d.FirstContextLen)
		}
		mw.p(".")
	} else {
		mw.p("The error never leaves the noise floor.")
	}
	mw.p("\n\n")
	if d.Reason != "" {
		mw.p("%s\n\n", text(d.Reason))
	}
	if len(d.Swaps) > 0 {
		mw.p("Each stage swapped for its reference, one at a time:\n\n| swapped stage | largest error | drift removed |\n|---|---|---|\n")
		for _, s := range d.Swaps {
			yes := "no"
			if s.RemovesDrift {
				yes = "**yes**"
			}
			mw.p("| %s | %s | %s |\n", cellCode(s.Stage), num(float64(s.MaxError)), yes)
		}
		mw.p("\n")
	}
	if fig != nil {
		writeFigure(mw, *fig)
	}
	if len(d.Steps) > 0 {
		rows := stepRows(d)
		mw.p("| step | prompt | context length | error | floor | error/floor |\n|---|---|---|---|---|---|\n")
		for _, i := range rows {
			s := d.Steps[i]
			ratio := "–"
			if s.Floor > 0 {
				ratio = num(float64(s.Error) / float64(s.Floor))
			}
			mark := ""
			if d.FirstStep != nil && s.Step == *d.FirstStep {
				mark = " ←"
			}
			mw.p("| %d%s | %d | %d | %s | %s | %s |\n", s.Step, mark, s.Prompt, s.ContextLen, num(float64(s.Error)), num(float64(s.Floor)), ratio)
		}
		if len(rows) < len(d.Steps) {
			mw.p("\n(%d of %d steps shown: evenly spaced, and the first step off the floor; report.json has all.)\n", len(rows), len(d.Steps))
		}
		mw.p("\n")
	}
	for _, n := range d.Notes {
		mw.p("- %s\n", text(n))
	}
	if len(d.Notes) > 0 {
		mw.p("\n")
	}
}

// stepRows picks at most 16 steps to tabulate: evenly spaced, plus the
// first step off the floor and its predecessor.
func stepRows(d *Diagnosis) []int {
	n := len(d.Steps)
	if n <= 16 {
		out := make([]int, n)
		for i := range out {
			out[i] = i
		}
		return out
	}
	set := map[int]bool{0: true, n - 1: true}
	for k := 1; k < 13; k++ {
		set[k*(n-1)/13] = true
	}
	if d.FirstStep != nil {
		for i, s := range d.Steps {
			if s.Step == *d.FirstStep {
				set[i] = true
				if i > 0 {
					set[i-1] = true
				}
			}
		}
	}
	var out []int
	for i := range set {
		out = append(out, i)
	}
	sort.Ints(out)
	return out
}

func writeEnvironment(mw *mdWriter, b Bundle) {
	e := b.Environment
	rev := e.Revision
	if rev == "" {
		rev = "unknown"
	} else if len(rev) > 12 {
		rev = rev[:12]
	}
	if e.Modified {
		rev += " (modified)"
	}
	mw.p("### Environment\n\n| | |\n|---|---|\n")
	mw.p("| kcheck | %s, revision %s |\n", text(e.Kcheck), text(rev))
	if e.Built != "" {
		mw.p("| revision time | %s |\n", text(e.Built))
	}
	mw.p("| Go | %s |\n| OS / arch | %s / %s, %d CPUs |\n", text(e.Go), text(e.OS), text(e.Arch), e.CPUs)
	if b.Command != "" {
		mw.p("| command | %s |\n", cellCode(b.Command))
	}
	mw.p("\n")
	var ev []Evidence
	for _, it := range b.Items {
		ev = append(ev, it.Evidence...)
	}
	if len(ev) > 0 {
		mw.p("### Evidence files\n\n| file | bytes | sha256 |\n|---|---|---|\n")
		for _, e := range ev {
			if e.NotHashed != "" {
				mw.p("| %s | | not hashed: %s |\n", cellCode(e.File), text(e.NotHashed))
				continue
			}
			mw.p("| %s | %d | %s |\n", cellCode(e.File), e.Bytes, cellCode(e.SHA256))
		}
		mw.p("\n")
	}
}

// writeFigure links a plot with its caption, or says why it is missing.
// Figures are numbered in the order they appear, and each caption names
// its file, which is also the alt text: GitHub names an attached image
// after its file, so the figures match the attachments.
func writeFigure(mw *mdWriter, fg Figure) {
	if fg.Err != "" {
		mw.p("*The %s plot could not be drawn: %s.*\n\n", fg.Caption, text(fg.Err))
		return
	}
	mw.fig++
	name := path.Base(fg.Path)
	mw.p("![%s](%s)\n\n*Figure %d, %s: %s.*\n\n", text(fmt.Sprintf("Figure %d, %s", mw.fig, name)), fg.Path, mw.fig, code(name), fg.Caption)
}

// drawn counts the figures drawn to a PNG.
func (f figures) drawn() int {
	n := 0
	for _, byTensor := range f.byCheck {
		for _, fs := range byTensor {
			for _, fg := range fs {
				if fg.Err == "" {
					n++
				}
			}
		}
	}
	if f.drift != nil && f.drift.Err == "" {
		n++
	}
	return n
}

// shapeOf writes a shape as [2, 512].
func shapeOf(shape []int) string {
	parts := make([]string, len(shape))
	for i, d := range shape {
		parts[i] = fmt.Sprint(d)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// summary says in a sentence or two what a result means.
func summary(r check.Result) string {
	if r.Verdict == check.Pass || r.Verdict == check.Error {
		return ""
	}
	var worst *compare.Check
	for i := range r.Checks {
		c := &r.Checks[i]
		if c.Verdict == compare.Pass {
			continue
		}
		if worst == nil || c.Verdict == compare.Fail && worst.Verdict != compare.Fail ||
			c.Verdict == worst.Verdict && float64(c.Metrics.MaxExcess) > float64(worst.Metrics.MaxExcess) {
			worst = c
		}
	}
	var parts []string
	if r.Stage != nil {
		kern, seen := "", false
		var alsoFail []string
		for _, st := range r.Stages {
			if st.Prefix == *r.Stage {
				kern, seen = " ("+text(st.Kernel)+")", true
			} else if seen && st.Verdict == check.Fail {
				alsoFail = append(alsoFail, code(st.Prefix))
			}
		}
		sent := fmt.Sprintf("stage %s%s fails on its own captured inputs, so the error starts there", code(*r.Stage), kern)
		if len(alsoFail) == 0 {
			sent += "; the later stages pass on the inputs they were given, and their propagated error is this one carried forward."
		} else {
			sent += fmt.Sprintf("; later stage %s fails on its own inputs too (a second bug, or one the first hides).", strings.Join(alsoFail, ", "))
		}
		parts = append(parts, sent)
	}
	if worst != nil {
		m := worst.Metrics
		what := "exceed their tolerance"
		if worst.Mode == "bitwise" {
			what = "differ from the expected bits"
		}
		sent := fmt.Sprintf("%d of %d elements of %s %s", m.OverTol, m.N, code(worst.Tensor), what)
		if worst.Mode != "bitwise" && !math.IsInf(float64(m.MaxExcess), 0) {
			sent += fmt.Sprintf(" (worst %s times its tolerance", num(float64(m.MaxExcess)))
			if m.FloorRMSE > 0 {
				sent += fmt.Sprintf("; RMSE %s times the noise floor of a correct kernel", num(float64(m.RMSE)/float64(m.FloorRMSE)))
			}
			sent += ")"
		}
		if m.NaNMismatch+m.InfMismatch > 0 {
			sent += fmt.Sprintf(", with %d NaN and %d Inf where the reference has none (or the reverse)", m.NaNMismatch, m.InfMismatch)
		}
		if s := worst.Signature; s != nil && s.Pattern != signature.None {
			sent += fmt.Sprintf("; the errors' pattern is %s", code(s.Pattern))
			if s.Coord != "" {
				sent += fmt.Sprintf(" (by %s)", code(s.Coord))
			}
		}
		parts = append(parts, sent+".")
	}
	return strings.Join(parts, " ")
}
