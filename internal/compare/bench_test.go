package compare

import (
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
	const rows, cols = 8192, 576
	n := rows * cols
	exact, expected := make(kernel.Dense, n), make(kernel.Dense, n)
	for i := range exact {
		exact[i] = float64(i%997)/997 - 0.5
		expected[i] = exact[i] * (1 + float64(i%13-6)*0x1p-10)
	}
	o := kernel.Output{Name: "out", Shape: []int{rows, cols}, DType: tensor.BF16, Exact: exact, Expected: expected,
		Mode: kernel.Numeric, Reduction: 1}
	b.SetBytes(int64(n) * 16)
	b.ResetTimer()
	for range b.N {
		if bd := (ThreeWay{}).Bounds(b.Context(), o, tensor.BF16); bd.Aggregate.RMSE <= 0 {
			b.Fatalf("rmse bound %v", bd.Aggregate.RMSE)
		}
	}
}
