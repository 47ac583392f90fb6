package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/safetensors"
)

// cancelOnWrite is stdout that cancels the command's context at its first
// write: an interrupt that arrives right after the first result, every
// time, without timing.
type cancelOnWrite struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	cancel context.CancelFunc
}

func (w *cancelOnWrite) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cancel()
	return w.buf.Write(p)
}

// An interrupt after the first of three files: kcheck stops, says what
// finished, exits 130 and writes no (partial) report.
func TestInterruptCheck(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &cancelOnWrite{cancel: cancel}
	var errw bytes.Buffer
	dir := t.TempDir()
	files := []string{fx + "golden/nvfp4_gemm.safetensors", fx + "golden/splitk_combine.safetensors", fx + "golden/nvfp4_quantize.safetensors"}
	code := MainContext(ctx, append([]string{"check", "--json", "--report", dir}, files...), strings.NewReader(""), out, &errw)
	if code != ExitInterrupted {
		t.Fatalf("exit %d, want %d\nstderr: %s", code, ExitInterrupted, errw.String())
	}
	want := "interrupted after 1 of 3; finished: " + files[0] + " (pass)"
	if !strings.Contains(errw.String(), want) || !strings.Contains(errw.String(), "not written") {
		t.Errorf("stderr %q, want %q and the report not written", errw.String(), want)
	}
	if n := strings.Count(out.buf.String(), "\n"); n != 1 { // one JSON line a file
		t.Errorf("%d results printed, want 1", n)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("the report directory holds %d entries after an interrupt", len(ents))
	}
}

// A real SIGINT to a real `kcheck run --out` process (this test binary,
// TestMain) while its second case runs: it exits 130, prints what
// finished, and leaves exactly the first case's capture, whole, and no
// temporary file.
func TestInterruptRunLeavesNoPartialFile(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	cases := writeFile(t, filepath.Join(dir, "cases.json"), []byte(interruptCases))
	code, stdout, stderr := runInterrupted(t, selfExec(), []string{"run", "--json", "--cases", cases, "--out", out})
	if code != ExitInterrupted {
		t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, ExitInterrupted, stdout, stderr)
	}
	if want := "interrupted after 1 of 3; finished: a-fast (pass)"; !strings.Contains(stderr, want) {
		t.Errorf("stderr %q, want %q", stderr, want)
	}
	ents, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if len(names) != 1 || names[0] != "a-fast.safetensors" {
		t.Fatalf("--out holds %v, want only a-fast.safetensors", names)
	}
	f, err := safetensors.Open(filepath.Join(out, names[0]))
	if err != nil {
		t.Fatalf("the finished capture does not read back: %v", err)
	}
	f.Close()
}
