package kernel

import (
	"reflect"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/tensor"
)

func TestSelectAxis(t *testing.T) {
	// [2, 3] = [[0 1 2] [3 4 5]]: columns 2 and 0 -> [[2 0] [5 3]].
	x := tensor.FromFloat64s(tensor.F32, []int{2, 3}, []float64{0, 1, 2, 3, 4, 5})
	got := SelectAxis(x, 1, []int{2, 0}).Float64s()
	if !reflect.DeepEqual(got, []float64{2, 0, 5, 3}) {
		t.Errorf("SelectAxis = %v", got)
	}
	if s := SelectAxis(x, 0, []int{1}); !reflect.DeepEqual(s.Shape, []int{1, 3}) || !reflect.DeepEqual(s.Float64s(), []float64{3, 4, 5}) {
		t.Errorf("row 1 = %v %v", s.Shape, s.Float64s())
	}
}
