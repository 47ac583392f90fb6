//go:build unix

package npy

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// TestReadFileFIFO: a .npy arriving through a named pipe (no size, no
// seeking), e.g. `kcheck check <(python dump.py)`, is read as a stream.
func TestReadFileFIFO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pipe.npy")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	go func() {
		w, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return
		}
		w.Write(npyFile("{'descr': '<u2', 'fortran_order': False, 'shape': (2,), }", []byte{0x80, 0x3F, 0x00, 0x40}))
		w.Close()
	}()
	ts, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	checkTensor(t, "pipe", ts["pipe"], tensor.U16, []int{2}, []float64{0x3F80, 0x4000})
}
