//go:build !(goexperiment.simd && amd64)

package nvfp4

// Without the simd experiment the GEMM is the plain-Go tiled loop.
func (g *gemmJob) run(b *Matrix) { g.runGeneric(b) }
