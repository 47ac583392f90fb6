package tensor

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"
)

// TestFromFloat64sIsSetFloat64: every dtype's tensor from FromFloat64s
// holds the bytes SetFloat64 stores element by element, for special
// values, ties of every format, subnormals and random values.
func TestFromFloat64sIsSetFloat64(t *testing.T) {
	vals := []float64{0, math.Copysign(0, -1), 1, -1, math.Inf(1), math.Inf(-1), math.NaN(),
		1 + 0x1p-8, 1 + 0x1p-8 + 0x1p-40, 1 + 3*0x1p-8, 0x1p-133, 0x1p-140, 448, 465, 3e38, 65520, 1e-300}
	r := rand.New(rand.NewPCG(1, 1))
	for range 4000 {
		vals = append(vals, r.NormFloat64()*math.Exp2(float64(r.IntN(80)-40)), math.Float64frombits(r.Uint64()))
	}
	for _, d := range []DType{F64, F32, F16, BF16, F8E4M3, F8E5M2, F8E8M0, I64, I32, U8} {
		got := FromFloat64s(d, []int{len(vals)}, vals)
		want := New(d, len(vals))
		for i, v := range vals {
			want.SetFloat64(i, v)
		}
		if !bytes.Equal(got.Data, want.Data) {
			for i := range vals {
				if got.Float64At(i) != want.Float64At(i) && !(math.IsNaN(got.Float64At(i)) && math.IsNaN(want.Float64At(i))) {
					t.Fatalf("%s: element %d (%v) is %v, SetFloat64 stores %v", d, i, vals[i], got.Float64At(i), want.Float64At(i))
				}
			}
			t.Fatalf("%s: the bytes differ from SetFloat64's", d)
		}
	}
}
