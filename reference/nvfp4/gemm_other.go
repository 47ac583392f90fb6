//go:build !amd64 || purego

package nvfp4

import "github.com/kcheck-dev/kcheck/reference/internal/simd"

// Without the assembly (another architecture, or the purego build tag) the
// GEMM is the plain-Go definition, runGeneric.

var level, levels = simd.Generic, []simd.Level{simd.Generic}

// kernelsName names the inner loop this build runs (for tests and benchmarks).
func kernelsName() string { return level.String() }

func (g *gemmJob) run(b *Matrix) error { return g.runGeneric(b) }
