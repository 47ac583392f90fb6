//go:build unix

package check

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A capture directory holding what is not a regular file (issue 11 item
// 8): a named pipe (reading it waits for a writer for ever), a symlink to
// a device (/dev/zero never ends), a socket. The walk takes the regular
// files, symlinked ones included, and skips the rest with a note each.
func TestExpandSkipsWhatIsNotARegularFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "a.safetensors")
	data, err := os.ReadFile(golden + "nvfp4_gemm.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(good, data, 0o644); err != nil {
		t.Fatal(err)
	}
	linked := filepath.Join(dir, "b.safetensors")
	if err := os.Symlink(good, linked); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "c.safetensors")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	dev := filepath.Join(dir, "d.npy")
	if err := os.Symlink("/dev/zero", dev); err != nil {
		t.Fatal(err)
	}
	dangling := filepath.Join(dir, "e.npz")
	if err := os.Symlink(filepath.Join(dir, "nowhere"), dangling); err != nil {
		t.Fatal(err)
	}
	files, notes, err := Expand([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{good, linked}; !reflect.DeepEqual(files, want) {
		t.Errorf("files %v, want %v", files, want)
	}
	wantNotes := []string{
		fifo + ": a named pipe, not a regular file: skipped",
		dev + ": a device, not a regular file: skipped",
		dangling + ": skipped:",
	}
	if len(notes) != len(wantNotes) {
		t.Fatalf("notes %q, want %d", notes, len(wantNotes))
	}
	for i, w := range wantNotes {
		if !strings.HasPrefix(notes[i], w) {
			t.Errorf("note %q, want it to start %q", notes[i], w)
		}
	}
	// Named on the command line, a pipe is read (`kcheck check <(cmd)`).
	if files, _, err := Expand([]string{fifo}); err != nil || len(files) != 1 {
		t.Errorf("an explicit pipe: %v, %v", files, err)
	}
}

// A named pipe named on the command line, with no writer: the check's
// deadline covers opening it, and the verdict says what happened.
func TestFileFIFOWithoutWriter(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "p.safetensors")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	res := File(ctx, fifo, nil, Options{})
	if res.Verdict != Error || res.Error == nil || !strings.Contains(*res.Error, "timed out after") ||
		!strings.Contains(*res.Error, "named pipe") || !strings.Contains(*res.Error, "--timeout") {
		t.Fatalf("verdict %s, error %v", res.Verdict, deref(res.Error))
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %v after a 200 ms deadline", d)
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}
