package mla

import (
	"testing"

	"github.com/kcheck-dev/kcheck/reference/internal/simd"
)

// atEveryLevel runs f once at each instruction-set level this build and
// CPU run (the plain Go, then each assembly), with level set to it: a
// machine with AVX-512 tests the AVX2 kernels too.
func atEveryLevel(t *testing.T, f func(t *testing.T)) {
	defer func(l simd.Level) { level = l }(level)
	for _, l := range levels {
		level = l
		t.Run(l.String(), f)
	}
}

// benchAtEveryLevel is atEveryLevel for a benchmark: each level's
// sub-benchmark side by side in one run.
func benchAtEveryLevel(b *testing.B, f func(b *testing.B)) {
	defer func(l simd.Level) { level = l }(level)
	for _, l := range levels {
		level = l
		b.Run(l.String(), f)
	}
}
