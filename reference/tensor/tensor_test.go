package tensor

import (
	"math"
	"testing"
)

// TestFloat32s: an F32 tensor's float32 values, read in place when aligned
// and decoded when not, equal Float64At's; other dtypes give nil.
func TestFloat32s(t *testing.T) {
	vals := []float64{0, -1.5, 3.25e-40, math.Inf(1), 65504, -0x1p-149}
	buf := make([]byte, 4*len(vals)+1)
	for _, off := range []int{0, 1} { // aligned (make's arrays are), then not
		tt := &Tensor{DType: F32, Shape: []int{len(vals)}, Data: buf[off : off+4*len(vals)]}
		for i, v := range vals {
			tt.SetFloat64(i, v)
		}
		got := tt.Float32s()
		if len(got) != len(vals) {
			t.Fatalf("offset %d: %d values, want %d", off, len(got), len(vals))
		}
		for i := range got {
			if float64(got[i]) != tt.Float64At(i) {
				t.Fatalf("offset %d: value %d is %v, Float64At gives %v", off, i, got[i], tt.Float64At(i))
			}
		}
	}
	if New(BF16, 2).Float32s() != nil {
		t.Fatal("a BF16 tensor gave float32 values")
	}
}
