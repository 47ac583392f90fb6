package splitk

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/internal/simd"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

func randomPartials(rng *rand.Rand, n, s, l int) (o, lse []float64) {
	o, lse = make([]float64, n*s*l), make([]float64, n*s)
	for i := range o {
		o[i] = float64(float32(rng.NormFloat64()))
	}
	for i := range lse {
		lse[i] = float64(float32(4 * rng.NormFloat64()))
		if rng.IntN(7) == 0 {
			lse[i] = math.Inf(-1) // an empty split
		}
	}
	for k := 0; k < s; k++ { // row 1: every split empty
		lse[s+k] = math.Inf(-1)
	}
	return o, lse
}

func sameBits(t *testing.T, what string, got, want []float64) {
	t.Helper()
	for i := range want {
		if math.Float64bits(got[i]) != math.Float64bits(want[i]) {
			t.Fatalf("%s[%d] = %v, want %v (not bit-identical)", what, i, got[i], want[i])
		}
	}
}

// TestCombineEqualsRowFunctions: the fused, parallel Combine gives, bit for
// bit, what CombineRowExact and CombineRowExpected give row by row (the
// one-row reference loops), for both lse bases and output dtypes, with
// empty splits and an all-empty row, from float64 partials and from the
// same values as fp32 (as a capture holds them). L = 83 takes the
// assembly's 32-column strips (on amd64 with AVX-512) and the Go loop's
// 19-column tail.
func TestCombineEqualsRowFunctions(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 13))
	const n, s, l = 37, 9, 83
	o, lse := randomPartials(rng, n, s, l)
	o32 := make([]float32, len(o))
	for i, v := range o {
		o32[i] = float32(v) // exact: randomPartials draws fp32 values
	}
	for _, c := range []Convention{DefaultConvention(), {Base: Base2, Empty: math.Inf(1)}} {
		for _, od := range []tensor.DType{tensor.BF16, tensor.F32} {
			ex, xp, err := Combine(context.Background(), o, lse, n, s, l, c, od, tensor.F32)
			if err != nil {
				t.Fatal(err)
			}
			ex32, xp32, err := Combine(context.Background(), o32, lse, n, s, l, c, od, tensor.F32)
			if err != nil {
				t.Fatal(err)
			}
			sameBits(t, "exact out from fp32 partials", ex32.Out, ex.Out)
			sameBits(t, "expected out from fp32 partials", xp32.Out, xp.Out)
			sameBits(t, "lse from fp32 partials", append(ex32.LSE, xp32.LSE...), append(ex.LSE, xp.LSE...))
			wx, wp := make([]float64, l), make([]float64, l)
			for r := 0; r < n; r++ {
				lx, err := CombineRowExact(o[r*s*l:(r+1)*s*l], lse[r*s:(r+1)*s], l, c, wx)
				if err != nil {
					t.Fatal(err)
				}
				lp, err := CombineRowExpected(o[r*s*l:(r+1)*s*l], lse[r*s:(r+1)*s], l, c, od, tensor.F32, wp)
				if err != nil {
					t.Fatal(err)
				}
				sameBits(t, "exact out", ex.Out[r*l:(r+1)*l], wx)
				sameBits(t, "expected out", xp.Out[r*l:(r+1)*l], wp)
				sameBits(t, "lse", []float64{ex.LSE[r], xp.LSE[r]}, []float64{lx, lp})
			}
		}
	}
}

// TestCombineFirstBadLSE: with bad lse values in several rows the error
// names the first in row-major order, whatever the goroutines do.
func TestCombineFirstBadLSE(t *testing.T) {
	const n, s, l = 64, 4, 8
	o, lse := make([]float64, n*s*l), make([]float64, n*s)
	lse[40*s+2] = math.NaN()
	lse[9*s+3] = math.Inf(1)
	for i := 0; i < 5; i++ {
		_, _, err := Combine(context.Background(), o, lse, n, s, l, DefaultConvention(), tensor.F32, tensor.F32)
		if err == nil || err.Error() != "partial_lse[9,3] = +Inf: a partial lse must be finite, or -inf for an empty split" {
			t.Fatalf("error %v: want partial_lse[9,3]", err)
		}
	}
}

// TestCombineDeterministicAcrossGOMAXPROCS: 1, 2 and 8 threads, twice each,
// give the same bits.
func TestCombineDeterministicAcrossGOMAXPROCS(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const n, s, l = 300, 64, 32
	o, lse := randomPartials(rng, n, s, l)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	var ref *Result
	var refX *Result
	for _, p := range []int{1, 2, 8} {
		runtime.GOMAXPROCS(p)
		for run := 0; run < 2; run++ {
			ex, xp, err := Combine(context.Background(), o, lse, n, s, l, DefaultConvention(), tensor.BF16, tensor.F32)
			if err != nil {
				t.Fatal(err)
			}
			if ref == nil {
				ref, refX = &ex, &xp
				continue
			}
			sameBits(t, "exact out", ex.Out, ref.Out)
			sameBits(t, "exact lse", ex.LSE, ref.LSE)
			sameBits(t, "expected out", xp.Out, refX.Out)
			sameBits(t, "expected lse", xp.LSE, refX.LSE)
		}
	}
}

// BenchmarkCombine: kimi-k2's 16 requests x 64 heads, 64 splits, L = 512,
// at every level of the weighted sums this CPU runs.
func BenchmarkCombine(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	const n, s, l = 1024, 64, 512
	o, lse := randomPartials(rng, n, s, l)
	simd.AtEachLevel(b, &level, levels, func(b *testing.B) {
		for b.Loop() {
			if _, _, err := Combine(context.Background(), o, lse, n, s, l, DefaultConvention(), tensor.BF16, tensor.F32); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(n*s*l*8)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
	})
}

// Combine stops between its units of rows once its context is done.
func TestCombineStops(t *testing.T) {
	o, lse := randomPartials(rand.New(rand.NewPCG(1, 2)), 64, 4, 32)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := Combine(ctx, o, lse, 64, 4, 32, DefaultConvention(), tensor.BF16, tensor.F32); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}
