package check

import (
	"testing"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// BenchmarkInputAnomalies is the input scan of the combine row of the
// whole-check table (issue 17: 70% of that check's CPU), 1024 rows × 64
// splits × 512 fp32 partial outputs and their lse, with no special value:
// every check of a healthy capture pays it.
func BenchmarkInputAnomalies(b *testing.B) {
	k, err := kernel.Lookup("splitk_combine")
	if err != nil {
		b.Fatal(err)
	}
	const rows, splits, width = 1024, 64, 512
	out, lse := tensor.New(tensor.F32, rows, splits, width), tensor.New(tensor.F32, rows, splits)
	for i := range out.Len() {
		out.SetFloat64(i, float64(i%977)/977-0.5)
	}
	for i := range lse.Len() {
		lse.SetFloat64(i, float64(i%13))
	}
	in := kernel.Inputs{Tensors: map[string]*tensor.Tensor{"partial_out": out, "partial_lse": lse}}
	b.SetBytes(int64(len(out.Data) + len(lse.Data)))
	b.ResetTimer()
	for range b.N {
		if notes := inputAnomalies(b.Context(), k, in); len(notes) != 0 {
			b.Fatalf("notes %q on inputs with no special value", notes)
		}
	}
}
