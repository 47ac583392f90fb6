package check

import (
	"math"
	"runtime"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// serialAnomalies is the scan as it was before it read bits in parallel
// chunks (every element through Float64At, in order): the oracle.
func serialAnomalies(t *tensor.Tensor, s kernel.TensorSpec, read func(int) bool) anomalies {
	a := anomalies{first: -1}
	for i := 0; i < t.Len(); i++ {
		v := t.Float64At(i)
		if !s.Anomalous(v) || !read(i) {
			continue
		}
		if math.IsNaN(v) {
			a.nan++
		} else {
			a.inf++
		}
		if a.first < 0 {
			a.first = i
		}
	}
	return a
}

// TestScanAnomaliesMatchesTheSerialScan: over several chunks, with
// special values at the chunks' edges, in the short last chunk, where the
// kernel does not read and where the contract gives them a meaning, the
// chunked bit scan counts and places the first anomaly as the serial
// decode did, at GOMAXPROCS 1, 2 and 8.
func TestScanAnomaliesMatchesTheSerialScan(t *testing.T) {
	n := 3*anomalyChunk + 1234
	everything := func(int) bool { return true }
	evenOnly := func(i int) bool { return i%2 == 0 }
	for _, tc := range []struct {
		name  string
		dtype tensor.DType
		spec  kernel.TensorSpec
		read  func(int) bool
		plant map[int]float64
		raw   map[int]byte // codes SetFloat64 does not write (it saturates an fp8 infinity)
		want  anomalies
	}{
		{"none", tensor.BF16, kernel.TensorSpec{}, everything, nil, nil, anomalies{first: -1}},
		{"at the chunks' edges", tensor.BF16, kernel.TensorSpec{}, everything,
			map[int]float64{anomalyChunk - 1: math.NaN(), anomalyChunk: math.Inf(1), 2 * anomalyChunk: math.Inf(-1), n - 1: math.NaN()}, nil,
			anomalies{nan: 2, inf: 2, first: anomalyChunk - 1}},
		{"the first in a later chunk", tensor.F32, kernel.TensorSpec{}, everything,
			map[int]float64{n - 1: math.NaN(), 2*anomalyChunk + 5: math.Inf(-1)}, nil,
			anomalies{nan: 1, inf: 1, first: 2*anomalyChunk + 5}},
		{"unread elements are not noted", tensor.F16, kernel.TensorSpec{}, evenOnly,
			map[int]float64{1: math.NaN(), 3: math.Inf(1), 10: math.NaN(), anomalyChunk + 1: math.NaN()}, nil,
			anomalies{nan: 1, first: 10}},
		{"a meaningful -inf", tensor.F32, kernel.TensorSpec{Meaningful: []float64{math.Inf(-1)}}, everything,
			map[int]float64{0: math.Inf(-1), 7: math.Inf(1), anomalyChunk + 3: math.Inf(-1)}, nil,
			anomalies{inf: 1, first: 7}},
		{"fp8 e4m3fn NaN", tensor.F8E4M3, kernel.TensorSpec{}, everything,
			map[int]float64{5: math.NaN(), anomalyChunk + 9: math.NaN()}, nil,
			anomalies{nan: 2, first: 5}},
		{"fp8 e5m2 infinities", tensor.F8E5M2, kernel.TensorSpec{}, everything,
			map[int]float64{2*anomalyChunk + 2: math.NaN()}, map[int]byte{anomalyChunk + 2: 0xFC},
			anomalies{nan: 1, inf: 1, first: anomalyChunk + 2}},
		{"e8m0 NaN", tensor.F8E8M0, kernel.TensorSpec{}, everything,
			map[int]float64{n - 2: math.NaN()}, nil,
			anomalies{nan: 1, first: n - 2}},
		{"f64", tensor.F64, kernel.TensorSpec{}, everything,
			map[int]float64{4: math.Inf(1), 2 * anomalyChunk: math.NaN()}, nil,
			anomalies{nan: 1, inf: 1, first: 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := tensor.New(tc.dtype, n)
			for i := range n {
				x.SetFloat64(i, float64(i%61)/8-3)
			}
			for i, v := range tc.plant {
				x.SetFloat64(i, v)
			}
			for i, b := range tc.raw {
				x.Data[i] = b
			}
			if got := serialAnomalies(x, tc.spec, tc.read); got != tc.want {
				t.Fatalf("the serial oracle finds %+v, want %+v: the test's own data is wrong", got, tc.want)
			}
			for _, procs := range []int{1, 2, 8} {
				old := runtime.GOMAXPROCS(procs)
				got := scanAnomalies(t.Context(), x, tc.spec, tc.read)
				runtime.GOMAXPROCS(old)
				if got != tc.want {
					t.Errorf("GOMAXPROCS %d: %+v, want %+v", procs, got, tc.want)
				}
			}
		})
	}
}
