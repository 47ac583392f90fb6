package safetensors

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kcheck-dev/kcheck/internal/filelock"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// RemoveStaleTemps removes the temporary files a killed writer left and
// nothing else: not a file being written (locked, or written within
// staleAge), not a file of another name.
func TestRemoveStaleTemps(t *testing.T) {
	dir := t.TempDir()
	old := time.Now().Add(-2 * staleAge)
	mk := func(name string, age time.Time) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("half a capture"), 0o644); err != nil {
			t.Fatal(err)
		}
		os.Chtimes(p, age, age)
		return p
	}
	killed := mk(".a__b.safetensors.kcheck-tmp-123", old)
	legacy := mk(".c.safetensors.tmp-456", old)
	fresh := mk(".d.safetensors.kcheck-tmp-789", time.Now())
	locked := mk(".e.safetensors.kcheck-tmp-1011", old)
	mine := mk(".notes.tmp-1", old)
	capture := mk("a__b.safetensors", old)
	f, err := os.OpenFile(locked, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if ok, err := filelock.TryLock(f); err == filelock.ErrUnsupported {
		t.Skip(err)
	} else if !ok || err != nil {
		t.Fatal(ok, err)
	}
	removed, err := RemoveStaleTemps(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(removed, " "), strings.Join([]string{killed, legacy}, " "); got != want {
		t.Errorf("removed %v, want %v", removed, []string{killed, legacy})
	}
	for _, p := range []string{fresh, locked, mine, capture} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s removed", filepath.Base(p))
		}
	}
}

// Write leaves no temporary file behind.
func TestWriteTemporaryFile(t *testing.T) {
	dir := t.TempDir()
	ts := map[string]*tensor.Tensor{"x": tensor.New(tensor.F32, 4)}
	if err := Write(filepath.Join(dir, "x.safetensors"), nil, ts, WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	names, _ := filepath.Glob(filepath.Join(dir, ".*"))
	if len(names) != 0 {
		t.Errorf("left behind: %v", names)
	}
}
