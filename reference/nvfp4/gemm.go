package nvfp4

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// GEMM computes out[M, N] = dequant(a) · dequant(b)ᵀ for a [M, K] (the
// activations) and b [N, K] (the weights, ModelOpt layout), as the engines'
// W4A4 linear layers do (spec 3.3). It returns the exact result (float64
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
func GEMM(a, b *Matrix, out tensor.DType) (exact, expected []float64, err error) {
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
	m, n, k := a.Rows, b.Rows, a.K
	av, bv := a.blockValues(), b.blockValues()

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
	alpha32 := float32(num32 / den32)

	exact = make([]float64, m*n)
	expected = make([]float64, m*n)
	rowsDone := make(chan int, m)
	for i := 0; i < m; i++ {
		rowsDone <- i
	}
	close(rowsDone)
	var wg sync.WaitGroup
	for w := 0; w < runtime.GOMAXPROCS(0); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rowsDone {
				ar := av[i*k : (i+1)*k]
				for j := 0; j < n; j++ {
					acc32, acc64 := blockDot(ar, bv[j*k:(j+1)*k])
					exact[i*n+j] = acc64 * num / den
					expected[i*n+j] = RoundTo(out, float64(float32(alpha32*acc32)))
				}
			}
		}()
	}
	wg.Wait()
	return exact, expected, nil
}

// blockDot returns Σ_blocks (Σ_block a·b), accumulated once in fp32 in
// block order and once in float64. Each block sum is exact in fp32 (see
// GEMM), so the unrolled float32 arithmetic inside a block rounds nothing.
func blockDot(a, b []float32) (acc32 float32, acc64 float64) {
	for len(a) >= BlockSize {
		x, y := a[:BlockSize:BlockSize], b[:BlockSize:BlockSize]
		s := x[0]*y[0] + x[1]*y[1] + x[2]*y[2] + x[3]*y[3] +
			x[4]*y[4] + x[5]*y[5] + x[6]*y[6] + x[7]*y[7] +
			x[8]*y[8] + x[9]*y[9] + x[10]*y[10] + x[11]*y[11] +
			x[12]*y[12] + x[13]*y[13] + x[14]*y[14] + x[15]*y[15]
		acc32 = float32(acc32 + s)
		acc64 += float64(s)
		a, b = a[BlockSize:], b[BlockSize:]
	}
	return acc32, acc64
}
