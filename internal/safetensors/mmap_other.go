//go:build !unix

package safetensors

import (
	"errors"
	"os"
)

// Without mmap, Open reads the file into memory.
func mmap(f *os.File, size int) ([]byte, error) { return nil, errors.New("mmap not supported") }

func munmap(b []byte) error { return nil }
