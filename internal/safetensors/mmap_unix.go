//go:build unix

package safetensors

import (
	"os"
	"syscall"
)

// mmap maps the first size bytes of f read-only and shared: pages come from
// the page cache on demand, so reading a tensor touches only its pages.
func mmap(f *os.File, size int) ([]byte, error) {
	return syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ, syscall.MAP_SHARED)
}

func munmap(b []byte) error { return syscall.Munmap(b) }
