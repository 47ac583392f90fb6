package compare

import (
	"math"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// BenchmarkComparePassing is the passing path the signature and the
// profile must not slow: a 1M-element bf16 output equal to its expected
// values, under the default policy, with no profile asked for.
func BenchmarkComparePassing(b *testing.B) {
	const rows, cols = 1024, 1024
	n := rows * cols
	exact, expected := make(kernel.Dense, n), make(kernel.Dense, n)
	act := tensor.New(tensor.BF16, rows, cols)
	for i := range exact {
		exact[i] = float64(i%997)/997 - 0.5
		act.SetFloat64(i, exact[i])
		expected[i] = act.Float64At(i)
	}
	o := kernel.Output{Name: "out", Shape: []int{rows, cols}, DType: tensor.BF16, Exact: exact, Expected: expected,
		Mode: kernel.Numeric, Reduction: 1, Coords: kernel.Coords{Axes: []kernel.CoordKind{kernel.KindRow, kernel.KindLatent}}}
	b.SetBytes(int64(n) * 2)
	b.ResetTimer()
	for range b.N {
		c, err := Compare(o, act, nil, Options{})
		if err != nil || c.Verdict != Pass {
			b.Fatalf("verdict %s, %v", c.Verdict, err)
		}
	}
}

// BenchmarkThreeWayBounds is the default policy's two passes over the
// exact and expected values (a quarter of a passing bf16 gather's CPU
// before they ran in parallel, issue 17): 8192 rows of 576, the latent
// and rope entry of an MLA cache, with a floor in expected's last bits.
func BenchmarkThreeWayBounds(b *testing.B) {
	o, n := flooredOutput()
	b.SetBytes(int64(n) * 16)
	b.ResetTimer()
	for range b.N {
		if bd := (ThreeWay{}).Bounds(b.Context(), o, tensor.BF16); bd.Aggregate.RMSE <= 0 {
			b.Fatalf("rmse bound %v", bd.Aggregate.RMSE)
		}
	}
}

// flooredOutput is the benchmarks' bf16 output of 8192 rows of 576 (the
// latent and rope entry of an MLA cache) whose expected values differ from
// the exact ones in their last bits, and its number of elements.
func flooredOutput() (kernel.Output, int) {
	const rows, cols = 8192, 576
	n := rows * cols
	exact, expected := make(kernel.Dense, n), make(kernel.Dense, n)
	for i := range exact {
		exact[i] = float64(i%997)/997 - 0.5
		expected[i] = exact[i] * (1 + float64(i%13-6)*0x1p-10)
	}
	return kernel.Output{Name: "out", Shape: []int{rows, cols}, DType: tensor.BF16, Exact: exact, Expected: expected,
		Mode: kernel.Numeric, Reduction: 1}, n
}

// settledBF16 is BF16 codes that vouch for themselves as one settled run
// (kernel.Settler) and fork for free: a passing bf16 cache gather as
// Bounds sees it, without the cache.
type settledBF16 struct{ b []byte }

func (s settledBF16) Len() int { return len(s.b) / 2 }
func (s settledBF16) At(i int) float64 {
	return float64(math.Float32frombits(uint32(s.b[2*i])<<16 | uint32(s.b[2*i+1])<<24))
}
func (s settledBF16) Fork() kernel.Values { return s }
func (s settledBF16) Settled(lo, n int) (tensor.DType, []byte, int) {
	return tensor.BF16, s.b[2*lo : 2*(lo+n)], n
}

// BenchmarkThreeWayBoundsSettled is Bounds' byte passes over a passing
// bf16 gather's output (8192 tokens of 576, every run settled): the
// passes that were most of such a check's CPU once its judgement took
// the bytes in bulk (issue 17).
func BenchmarkThreeWayBoundsSettled(b *testing.B) {
	const rows, cols = 8192, 576
	n := rows * cols
	t := tensor.New(tensor.BF16, rows, cols)
	for i := range n {
		t.SetFloat64(i, float64(i%997)/997-0.5)
	}
	v := settledBF16{t.Data}
	o := kernel.Output{Name: "out", Shape: []int{rows, cols}, DType: tensor.BF16, Exact: v, Expected: v,
		Mode: kernel.Numeric, Reduction: 1}
	b.SetBytes(int64(n) * 2)
	b.ResetTimer()
	for range b.N {
		if bd := (ThreeWay{}).Bounds(b.Context(), o, tensor.BF16); bd.Aggregate.RMSE <= 0 {
			b.Fatalf("rmse bound %v", bd.Aggregate.RMSE)
		}
	}
}

// BenchmarkThreeWayTolRun is the default policy's tolerances of a run of
// numbers, one core: what a check whose exact and expected values differ
// everywhere (an fp8_ds_mla gather's per-tile scales, a failing NVFP4
// dequantization) computes for every element it judges, 8192 rows of
// 576 a row at a time as the judgement asks.
func BenchmarkThreeWayTolRun(b *testing.B) {
	o, n := flooredOutput()
	exact, expected := o.Exact.(kernel.Dense), o.Expected.(kernel.Dense)
	bd := (ThreeWay{}).Bounds(b.Context(), o, tensor.BF16)
	dst := make([]float64, parallelChunk)
	b.SetBytes(int64(n) * 16)
	b.ResetTimer()
	for range b.N {
		for lo := 0; lo < n; lo += parallelChunk {
			bd.TolRun(lo, exact[lo:lo+parallelChunk], expected[lo:lo+parallelChunk], dst)
		}
	}
}
