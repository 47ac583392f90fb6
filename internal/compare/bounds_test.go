package compare

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// unforkable reads Dense values through a Values kernel.Fork cannot share
// out, as an on-demand reference without Fork is: Bounds then runs its
// units on one goroutine.
type unforkable struct{ d kernel.Dense }

func (u unforkable) Len() int         { return len(u.d) }
func (u unforkable) At(i int) float64 { return u.d[i] }

// boundsBits is everything Bounds gives, bit for bit: the aggregate
// bounds, the explanation and every element's tolerance.
type boundsBits struct {
	agg         [4]uint64
	explanation string
	tol         []uint64
}

func boundsOf(o kernel.Output, exact, expected kernel.Dense) boundsBits {
	b := ThreeWay{}.Bounds(context.Background(), o, tensor.BF16)
	a := b.Aggregate
	out := boundsBits{
		agg:         [4]uint64{math.Float64bits(a.RMSE), math.Float64bits(a.CosDiff), math.Float64bits(a.FloorRMSE), math.Float64bits(a.FloorCosDiff)},
		explanation: b.Explanation,
		tol:         make([]uint64, len(exact)),
	}
	for i := range exact {
		out.tol[i] = math.Float64bits(b.Tol(i, exact[i], expected[i]))
	}
	return out
}

// TestThreeWayBoundsDeterministic: Bounds' parallel passes add their
// units' sums in unit order, so its aggregates, its explanation and every
// tolerance are the same bits at GOMAXPROCS 1, 2 and 8, and on one
// goroutine over values that cannot be forked, for outputs of several
// units of rows, of one unit, and 1-D outputs of several units of
// elements, with NaN and Inf among the values.
func TestThreeWayBoundsDeterministic(t *testing.T) {
	for _, tc := range []struct {
		name  string
		shape []int
	}{
		{"rows, 5 units", []int{1100, 96}},
		{"wide rows, 3 units", []int{600, 3000}},
		{"one unit", []int{40, 64}},
		{"1-D, 5 units", []int{300001}},
		{"unit axes", []int{1, 700, 1, 48}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := tensor.NumElements(tc.shape)
			r := rand.New(rand.NewPCG(7, uint64(n)))
			exact, expected := make(kernel.Dense, n), make(kernel.Dense, n)
			for i := range exact {
				// values over several binades and a floor of their last
				// bits, so that a sum in another order gives other bits
				exact[i] = r.NormFloat64() * math.Exp2(float64(r.IntN(20)-10))
				expected[i] = exact[i] * (1 + r.NormFloat64()*0x1p-9)
			}
			exact[n/3], expected[n/2], exact[n-1] = math.NaN(), math.Inf(1), math.Inf(-1)
			o := kernel.Output{Name: "y", Shape: tc.shape, DType: tensor.BF16, Exact: exact, Expected: expected, Mode: kernel.Numeric, Reduction: 512}
			var want boundsBits
			for k, procs := range []int{1, 2, 8} {
				old := runtime.GOMAXPROCS(procs)
				got := boundsOf(o, exact, expected)
				runtime.GOMAXPROCS(old)
				if k == 0 {
					want = got
					continue
				}
				compareBounds(t, fmt.Sprintf("GOMAXPROCS %d", procs), got, want)
			}
			serial := o
			serial.Exact, serial.Expected = unforkable{exact}, unforkable{expected}
			compareBounds(t, "unforkable values", boundsOf(serial, exact, expected), want)
		})
	}
}

func compareBounds(t *testing.T, what string, got, want boundsBits) {
	t.Helper()
	if got.agg != want.agg {
		t.Errorf("%s: aggregate bits %x, at GOMAXPROCS 1 %x", what, got.agg, want.agg)
	}
	if got.explanation != want.explanation {
		t.Errorf("%s: explanation %q, at GOMAXPROCS 1 %q", what, got.explanation, want.explanation)
	}
	for i := range got.tol {
		if got.tol[i] != want.tol[i] {
			t.Errorf("%s: element %d's tolerance %v, at GOMAXPROCS 1 %v", what, i, math.Float64frombits(got.tol[i]), math.Float64frombits(want.tol[i]))
			return
		}
	}
}
