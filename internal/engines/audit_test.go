package engines

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestAuditRowsListed: CAPTURE.md's "The audit's rows" table names every
// row of the engine audit (../shared/audit/ENGINES-2026-12.md: F1-F17 for
// FlashMLA, V1-V17 for vLLM, S1-S5 for SGLang, I1-I8 for FlashInfer) once,
// each with a status from the table's legend, so that no row is left
// unanswered when the table is edited.
func TestAuditRowsListed(t *testing.T) {
	b, err := os.ReadFile("CAPTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "## The audit's rows, one by one")
	if !ok {
		t.Fatal(`CAPTURE.md has no section "The audit's rows, one by one"`)
	}
	want := map[string]bool{}
	for _, g := range []struct {
		prefix string
		n      int
	}{{"F", 17}, {"V", 17}, {"S", 5}, {"I", 8}} {
		for i := 1; i <= g.n; i++ {
			want[fmt.Sprintf("%s%d", g.prefix, i)] = true
		}
	}
	statuses := map[string]bool{"matches": true, "fixed": true, "read": true, "refused": true, "n/a": true}
	seen := map[string]int{}
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 5 || !want[strings.TrimSpace(cells[1])] {
			continue
		}
		id, status, what := strings.TrimSpace(cells[1]), strings.TrimSpace(cells[2]), strings.TrimSpace(cells[3])
		seen[id]++
		if !statuses[status] {
			t.Errorf("row %s: status %q is not one of the legend's", id, status)
		}
		if what == "" {
			t.Errorf("row %s says nothing of what kcheck does", id)
		}
	}
	for id := range want {
		if seen[id] != 1 {
			t.Errorf("audit row %s is listed %d times; want once", id, seen[id])
		}
	}
}
