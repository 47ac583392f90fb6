package nvfp4

import (
	"context"
	"fmt"

	"github.com/kcheck-dev/kcheck/reference/parallel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// GEMM computes out[M, N] = dequant(a) · dequant(b)ᵀ for a [M, K] (the
// activations) and b [N, K] (the weights, ModelOpt layout), as the engines'
// W4A4 linear layers do (reference/CONTRACTS.md §3.3). It returns the exact result (float64
// accumulation) and the expected one: what a block-scaled tensor-core GEMM
// writes in dtype out.
//
// Both rest on one fact: within a 16-element block the scales are common,
// so a block's contribution is sa*sb*Σ e2m1·e2m1, and Σ e2m1·e2m1 is a
// multiple of 1/4 no larger than 16*36 = 576 (12 bits), sa*sb has at most 8
// significant bits, so the block partial sum is exact in fp32 (20 bits,
// between 2^-20 and 2^27). What differs between kernels is how the block
// partials are accumulated:
//
//   - exact: the partials summed in float64, times the global multipliers
//     (ga*gb, or divided by the quant-kind scales) at the end;
//   - expected: the partials added one block at a time, in K order, to an
//     fp32 accumulator, as the MMA accumulates into fp32 registers; then
//     the epilogue's out = alpha*acc in fp32 with alpha = ga*gb formed in
//     fp32 (vLLM: layer.alpha = input_scale * weight_scale_2, or 1/(a_gs*b_gs)
//     for quant-kind scales), rounded once more to out.
//
// A real MMA may add a few blocks internally before touching the
// accumulator (tcgen05 consumes K = 64 per instruction); that is another
// valid order, and the checker's tolerance comes from |expected - exact|
// and the gamma_K bound, not from bit equality with this order.
func GEMM(ctx context.Context, a, b *Matrix, out tensor.DType) (exact, expected []float64, err error) {
	if err := a.Check("a"); err != nil {
		return nil, nil, err
	}
	if err := b.Check("b"); err != nil {
		return nil, nil, err
	}
	if a.K != b.K {
		return nil, nil, fmt.Errorf("a has K = %d but b has K = %d", a.K, b.K)
	}
	if err := checkOutDType(out); err != nil {
		return nil, nil, err
	}
	g := newGemmJob(ctx, a, b, out)
	if err := g.run(b); err != nil {
		return nil, nil, err
	}
	return g.exact, g.expected, nil
}

// newGemmJob prepares the GEMM of checked operands: a's block values, the
// epilogue's multipliers and the output buffers; it stops when ctx is done.
func newGemmJob(ctx context.Context, a, b *Matrix, out tensor.DType) *gemmJob {
	num, den := 1.0, 1.0
	num32, den32 := float32(1), float32(1)
	for _, x := range []*Matrix{a, b} {
		if x.Kind == Quant {
			den *= x.Global
			den32 = float32(den32 * float32(x.Global))
		} else {
			num *= x.Global
			num32 = float32(num32 * float32(x.Global))
		}
	}
	m, n := a.Rows, b.Rows
	return &gemmJob{ctx: ctx, m: m, n: n, k: a.K, num: num, den: den, alpha32: float32(num32 / den32), out: out,
		av: a.blockValues(), exact: make([]float64, m*n), expected: make([]float64, m*n)}
}

// gemmJob is one GEMM shared out to the workers in output tiles. Every
// output is computed by exactly one worker, with the block partials added
// in K order, so the result does not depend on the number of workers.
type gemmJob struct {
	ctx             context.Context // checked between output tiles
	m, n, k         int
	num, den        float64
	alpha32         float32
	out             tensor.DType
	av              []float32 // a's block values, [m][k]
	exact, expected []float64
}

// store finishes output (i, j) from its two accumulators (the epilogue).
func (g *gemmJob) store(i, j int, acc32 float32, acc64 float64) {
	g.exact[i*g.n+j] = acc64 * g.num / g.den
	g.expected[i*g.n+j] = RoundTo(g.out, float64(float32(g.alpha32*acc32)))
}

// Output tiles of the plain-Go GEMM: gemmTI rows by gemmTJ columns, K in
// slices of gemmTK elements so that both operands' slices stay in cache.
const gemmTI, gemmTJ, gemmTK = 8, 32, 512

// runGeneric is the plain-Go GEMM, and the definition the assembly of
// gemm_amd64.s is tested against bit for bit: per output tile and K slice,
// each output takes its block partials with blockSum and adds them in K
// order to its two accumulators.
func (g *gemmJob) runGeneric(b *Matrix) error {
	bv := b.blockValues()
	m, n, k := g.m, g.n, g.k
	ti, tj := (m+gemmTI-1)/gemmTI, (n+gemmTJ-1)/gemmTJ
	return parallel.Each(g.ctx, ti*tj, func(u int) {
		i0, j0 := (u/tj)*gemmTI, (u%tj)*gemmTJ
		i1, j1 := min(i0+gemmTI, m), min(j0+gemmTJ, n)
		var acc32 [gemmTI * gemmTJ]float32
		var acc64 [gemmTI * gemmTJ]float64
		for k0 := 0; k0 < k; k0 += gemmTK {
			k1 := min(k0+gemmTK, k)
			for i := i0; i < i1; i++ {
				ar := g.av[i*k+k0 : i*k+k1]
				for j := j0; j < j1; j++ {
					t := (i-i0)*gemmTJ + j - j0
					a32, a64 := acc32[t], acc64[t]
					br := bv[j*k+k0 : j*k+k1]
					for c := 0; c+BlockSize <= len(ar); c += BlockSize {
						s := blockSum(ar[c:c+BlockSize], br[c:c+BlockSize])
						a32 = float32(a32 + s)
						a64 += float64(s)
					}
					acc32[t], acc64[t] = a32, a64
				}
			}
		}
		for i := i0; i < i1; i++ {
			for j := j0; j < j1; j++ {
				t := (i-i0)*gemmTJ + j - j0
				g.store(i, j, acc32[t], acc64[t])
			}
		}
	})
}

// blockSum is Σ x[e]·y[e] over one 16-element block. The sum is exact in
// fp32 in any order (see GEMM), so it is taken as four independent chains
// that the processor can overlap.
func blockSum(x, y []float32) float32 {
	x, y = x[:BlockSize:BlockSize], y[:BlockSize:BlockSize]
	s0 := x[0]*y[0] + x[4]*y[4] + x[8]*y[8] + x[12]*y[12]
	s1 := x[1]*y[1] + x[5]*y[5] + x[9]*y[9] + x[13]*y[13]
	s2 := x[2]*y[2] + x[6]*y[6] + x[10]*y[10] + x[14]*y[14]
	s3 := x[3]*y[3] + x[7]*y[7] + x[11]*y[11] + x[15]*y[15]
	return (s0 + s1) + (s2 + s3)
}
