//go:build !amd64 || purego

package nvfp4

// Without the assembly (another architecture, or the purego build tag) the
// GEMM is the plain-Go definition, runGeneric.

// kernelsName names the inner loop this build runs (for tests and benchmarks).
const kernelsName = "generic"

func (g *gemmJob) run(b *Matrix) error { return g.runGeneric(b) }
