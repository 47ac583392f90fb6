package report

import (
	"bytes"
	"html"
	"regexp"
	"strings"
	"testing"

	"github.com/yuin/goldmark"
	"github.com/yuin/goldmark/extension"

	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/printable"
	"github.com/kcheck-dev/kcheck/internal/signature"
)

// hostile is a name that breaks every Markdown construct it can reach: code
// spans (backticks), table cells (pipe), the sh fence (a newline, then a
// fence), headings, HTML, links, emphasis, strikethrough, math, entities, an
// ordered list, and a terminal escape.
const hostile = "a`b``c|d\n```\n# H <b>x</b> [l](/e) *e* _u_ ~~s~~ $m$ &amp; \x1b[2K\r1. z"

// A report whose every name and message is hostile renders, through an
// independent CommonMark + GFM parser (goldmark), with each of them intact
// as literal text in one piece: no code span, cell, fence or heading broken,
// no HTML, link, emphasis or strikethrough made of them.
func TestMarkdownEscapesNames(t *testing.T) {
	n := func(label string) string { return label + hostile }
	stage, pattern := n("S"), n("P")
	errMsg := n("E")
	b := Bundle{
		Format:      Format,
		Title:       "",
		Environment: Environment{Kcheck: n("V"), Go: "go1.26", OS: n("O"), Arch: "amd64", CPUs: 2},
		Command:     n("C"),
		Items: []Item{{
			Result: check.Result{
				File: n("F"), Kernel: n("K"), Verdict: check.Fail, Stage: &stage,
				Notes:      []string{n("N"), "# " + n("N2"), "12. " + n("N3")},
				Provenance: map[string]string{"source": n("PV"), n("PK"): "x"},
				Stages:     []check.StageResult{{Prefix: stage, Kernel: n("SK"), Verdict: check.Fail}},
				Checks: []compare.Check{{
					Tensor: n("T"), DType: "BF16", Shape: []int{2}, Verdict: compare.Fail, Reason: n("R"),
					Tolerance: n("TO") + "\n\n</details><script>x</script>",
					Worst:     []compare.Element{{Coords: []compare.Coord{{Name: n("W"), Value: 1}}}},
					Signature: &signature.Signature{Pattern: pattern, Coord: n("SC"), Detail: n("SD"),
						Groups: []signature.Group{{Value: 1, Share: 1, Failing: 1}}},
				}},
			},
			Reproduce: "kcheck check " + ShellQuote(n("F")),
			Evidence:  []Evidence{{File: n("EV"), Bytes: 3, SHA256: n("H")}},
		}, {
			Result: check.Result{File: n("F2"), Kernel: "k", Verdict: check.Error, Error: &errMsg},
		}},
	}
	var md bytes.Buffer
	if err := Markdown(&md, b, MarkdownOptions{}); err != nil {
		t.Fatal(err)
	}
	src := md.String()
	for i, r := range src {
		if r != '\n' && printable.Escape(string(r)) != string(r) {
			t.Fatalf("report.md byte %d: %U raw, in %q", i, r, src[max(0, i-40):min(len(src), i+40)])
		}
	}
	var out bytes.Buffer
	gm := goldmark.New(goldmark.WithExtensions(extension.Table, extension.Strikethrough))
	if err := gm.Convert(md.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	// Each name, escaped for the terminal and then for HTML, in one piece.
	for _, label := range []string{"F", "F2", "K", "S", "P", "E", "V", "O", "C", "N", "N2", "N3", "PV", "PK",
		"SK", "T", "R", "TO", "W", "SC", "SD", "EV", "H"} {
		want := html.EscapeString(printable.Escape(n(label)))
		want = strings.ReplaceAll(want, "&#39;", "'")
		if !strings.Contains(got, want) {
			t.Errorf("name %s not rendered whole: want %q in the HTML", label, want)
		}
	}
	for _, bad := range []string{"<b>", "<a ", "<em>", "<del>", "<script", "<h1>", "<ol>", "<img", "<blockquote>"} {
		if strings.Contains(got, bad) {
			t.Errorf("a name made %s:\n%s", bad, got)
		}
	}
	// One sh block, holding the reproduction command on one line.
	blocks := regexp.MustCompile(`(?s)<pre><code class="language-sh">(.*?)</code></pre>`).FindAllStringSubmatch(got, -1)
	if len(blocks) != 1 || strings.Count(blocks[0][1], "\n") != 1 || !strings.HasPrefix(blocks[0][1], "kcheck check $'F") {
		t.Errorf("sh blocks: %q", blocks)
	}
	// Headings: the title, two items, the output, the environment and
	// evidence sections; nothing else.
	if h := regexp.MustCompile(`<h[1-6]>`).FindAllString(got, -1); len(h) != 6 {
		t.Errorf("%d headings, want 6: %v\n%s", len(h), h, got)
	}
	// Every table row has its header's number of cells.
	for _, table := range regexp.MustCompile(`(?s)<table>.*?</table>`).FindAllString(got, -1) {
		rows := regexp.MustCompile(`(?s)<tr>.*?</tr>`).FindAllString(table, -1)
		for _, row := range rows[1:] {
			if c, h := strings.Count(row, "<td"), strings.Count(rows[0], "<th"); c != h {
				t.Errorf("row of %d cells under a header of %d: %s", c, h, row)
			}
		}
	}
}

// Shell quoting of the reproduction commands: a name with a control
// character is written $'...' with \xHH escapes, so the command is one
// line a shell reads back to the same bytes.
func TestShellQuote(t *testing.T) {
	for in, want := range map[string]string{
		"fixtures/x.safetensors": "fixtures/x.safetensors",
		"a b'c":                  `'a b'\''c'`,
		"x\n```\ny":              "$'x\\x0a```\\x0ay'",
		"e\x1b[2K\r'\\":          `$'e\x1b[2K\x0d\'\\'`,
		"bidi\u202e":             `$'bidi\xe2\x80\xae'`,
		"":                       "''",
	} {
		if got := ShellQuote(in); got != want {
			t.Errorf("ShellQuote(%q) = %s, want %s", in, got, want)
		}
	}
}
