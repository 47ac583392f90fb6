package report

import (
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// FuzzLoad fuzzes what `kcheck report` does with a file: Load (report.json
// bundles, `check --json` lines, `diagnose --json` objects), then the
// Markdown and every plot of whatever Load accepts. The seeds are the
// crafted report.json files that made it panic or loop (testdata/crafted)
// and a whole report of a shipped fixture. Invariants: Load returns an error
// or a bundle that renders; no panic, no hang. CI runs it for a fixed
// number of inputs (make fuzz-short):
//
//	go test -run='^$' -fuzz='^FuzzLoad$' -fuzztime=10m ./internal/report
func FuzzLoad(f *testing.F) {
	seeds, err := filepath.Glob(filepath.Join("testdata", "crafted", "*.json"))
	if err != nil || len(seeds) == 0 {
		f.Fatalf("no seeds in testdata/crafted: %v", err)
	}
	seeds = append(seeds, filepath.Join("testdata", "report.json"))
	for _, s := range seeds {
		data, err := os.ReadFile(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "in.json")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		b, err := Load(path)
		if err != nil {
			return
		}
		start := time.Now()
		figs := renderPlots(b, MarkdownOptions{}, map[string][]byte{})
		if err := markdown(io.Discard, b, figs, MarkdownOptions{}); err != nil {
			t.Fatalf("Markdown of a loaded bundle: %v", err)
		}
		if d := time.Since(start); d > 30*time.Second {
			t.Fatalf("rendering took %v", d)
		}
	})
}
