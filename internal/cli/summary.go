package cli

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/compare"
)

// tally counts the verdicts of a command over many files or cases, for the
// closing line a pytest user looks for: "12 passed, 3 failed, 1 error in
// 4.2s". It goes to stdout under the human-readable results; with --json
// it goes to stderr, so stdout stays one JSON object a line.
type tally struct {
	started time.Time
	counts  map[compare.Verdict]int
}

func newTally() *tally { return &tally{started: time.Now(), counts: map[compare.Verdict]int{}} }

func (t *tally) add(verdict compare.Verdict) { t.counts[verdict]++ }

// line is the closing line, verdicts in pytest's order (and inconclusive
// beside failed), zeros left out.
func (t *tally) line() string {
	var parts []string
	for _, v := range []struct {
		verdict   compare.Verdict
		one, many string
	}{
		{check.Pass, "passed", "passed"}, {check.Fail, "failed", "failed"},
		{check.Inconclusive, "inconclusive", "inconclusive"}, {check.Error, "error", "errors"},
	} {
		switch n := t.counts[v.verdict]; {
		case n == 1:
			parts = append(parts, "1 "+v.one)
		case n > 1:
			parts = append(parts, fmt.Sprintf("%d %s", n, v.many))
		}
	}
	if len(parts) == 0 {
		parts = []string{"nothing checked"}
	}
	return fmt.Sprintf("%s in %.1fs", strings.Join(parts, ", "), time.Since(t.started).Seconds())
}

// print writes the closing line where it belongs: stdout for people, stderr
// under --json.
func (t *tally) print(s *IO, json bool) {
	w := io.Writer(s.Out)
	if json {
		w = s.Err
	}
	fmt.Fprintln(w, t.line())
}
