package kernel

import (
	"bytes"
	"context"
	"encoding/binary"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// codeValues is Values over the codes of a tensor that vouches for its
// runs alternately (runs of the lengths in runs, cycled): settled in the
// tensor's dtype, not settled, and settled in another dtype (which
// Materialize must not copy).
type codeValues struct {
	t    *tensor.Tensor
	runs []int
}

func (v codeValues) Len() int         { return v.t.Len() }
func (v codeValues) At(i int) float64 { return v.t.Float64At(i) }
func (v codeValues) Settled(lo, n int) (tensor.DType, []byte, int) {
	// the run lo falls in, counting runs from 0: whole cycles first
	cycle := 0
	for _, r := range v.runs {
		cycle += r
	}
	k, start := lo/cycle*len(v.runs), lo/cycle*cycle
	for start+v.runs[k%len(v.runs)] <= lo {
		start += v.runs[k%len(v.runs)]
		k++
	}
	m := min(n, start+v.runs[k%len(v.runs)]-lo)
	sz := v.t.DType.Size()
	switch k % 3 {
	case 0:
		return v.t.DType, v.t.Data[lo*sz : (lo+m)*sz], m
	case 2: // another dtype's bytes: read as values
		if v.t.DType == tensor.U8 {
			return tensor.F16, make([]byte, 2*m), m
		}
		return tensor.U8, make([]byte, m), m
	}
	return "", nil, m
}

// TestMaterializeCopiesSettledRuns: Materialize of Values that vouch for
// runs of their bytes gives, byte for byte, what storing every value with
// SetFloat64 gives (the path for Values that vouch for nothing): over
// every BF16 and F16 code (NaNs with payloads, signaling NaNs, infinities,
// subnormals, -0) and every F8_E4M3 code, in runs of awkward lengths,
// settled, not settled and settled in another dtype.
func TestMaterializeCopiesSettledRuns(t *testing.T) {
	for _, d := range []tensor.DType{tensor.BF16, tensor.F16, tensor.F8E4M3, tensor.U8} {
		codes := 1 << (8 * d.Size())
		src := tensor.New(d, 3*codes)
		for i := 0; i < src.Len(); i++ {
			c := (i * 40503) % codes // every code, three times, in a scattered order
			if d.Size() == 2 {
				binary.LittleEndian.PutUint16(src.Data[2*i:], uint16(c))
			} else {
				src.Data[i] = byte(c)
			}
		}
		want := tensor.New(d, src.Len())
		for i := 0; i < src.Len(); i++ {
			want.SetFloat64(i, src.Float64At(i))
		}
		for _, runs := range [][]int{{1}, {7, 1, 300}, {StopStride + 3, 5, 2}, {src.Len()}} {
			got, err := MaterializeContext(context.Background(), d, []int{src.Len()}, codeValues{src, runs})
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Data, want.Data) {
				for i := 0; i < src.Len(); i++ {
					if g, w := got.Data[i*d.Size():(i+1)*d.Size()], want.Data[i*d.Size():(i+1)*d.Size()]; !bytes.Equal(g, w) {
						t.Fatalf("%s, runs %v: element %d is %x; SetFloat64 of its value stores %x", d, runs, i, g, w)
					}
				}
			}
		}
		plain, _ := MaterializeContext(context.Background(), d, []int{src.Len()}, TensorValues{T: src})
		if !bytes.Equal(plain.Data, want.Data) {
			t.Errorf("%s: Materialize of values that vouch for nothing differs from SetFloat64's", d)
		}
	}
}
