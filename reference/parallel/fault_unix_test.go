//go:build unix

package parallel

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"unsafe"
)

// The fault this package exists for: a worker reads a mapping of a file
// that has been truncated. Without panic-on-fault the process dies with
// "fatal error: fault"; here the fault comes back to Wait's caller as a
// panic whose value has the faulting address.
func TestFaultInWorkerReachesWait(t *testing.T) {
	path := filepath.Join(t.TempDir(), "capture.safetensors")
	page := os.Getpagesize()
	if err := os.WriteFile(path, make([]byte, 4*page), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	m, err := syscall.Mmap(int(f.Fd()), 0, 4*page, syscall.PROT_READ, syscall.MAP_SHARED)
	f.Close()
	if err != nil {
		t.Skipf("mmap: %v", err)
	}
	defer syscall.Munmap(m)
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	var sink byte
	p := catch(func() {
		var g Group
		g.Go(func() { sink = m[2*page] })
		g.Wait()
	})
	if p == nil {
		t.Fatalf("read %d from a truncated mapping without a fault", sink)
	}
	fault, ok := p.Value.(interface{ Addr() uintptr })
	if !ok {
		t.Fatalf("panic value %T (%v) has no fault address", p.Value, p.Value)
	}
	if lo := uintptr(unsafe.Pointer(&m[0])); fault.Addr() < lo || fault.Addr() >= lo+uintptr(len(m)) {
		t.Errorf("fault at %#x, outside the mapping [%#x, %#x)", fault.Addr(), lo, lo+uintptr(len(m)))
	}
}
