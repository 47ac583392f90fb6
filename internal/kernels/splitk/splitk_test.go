package splitk

import (
	"context"
	"math"
	"strings"
	"testing"

	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// partials builds N = 3 rows of S = 2 splits of L = 4: row 0 both splits
// used, row 1 split 1 empty, row 2 both empty (its partials hold what an
// engine left there). Every value is exact in bf16 and fp16.
func partials(dt tensor.DType) (po, pl *tensor.Tensor) {
	o := []float64{
		0.5, -1, 2, 0.25, 1.5, 0.75, -0.5, 3,
		-2, 1, 0.125, 4, 0, 0, 0, 0,
		1.25, -0.75, 0.5, 2, 0, 0, 0, 0,
	}
	l := []float64{3, 2.5, 4, math.Inf(-1), math.Inf(-1), math.Inf(-1)}
	return tensor.FromFloat64s(dt, []int{3, 2, 4}, o), tensor.FromFloat64s(dt, []int{3, 2}, l)
}

func reference(t *testing.T, po, pl *tensor.Tensor, params Params, outs OutDTypes) map[string]Output {
	t.Helper()
	k := combine{}
	p, err := Validate(k, Inputs{Tensors: map[string]*tensor.Tensor{"partial_out": po, "partial_lse": pl}, Params: params})
	if err != nil {
		t.Fatal(err)
	}
	got, err := k.Reference(context.Background(), p, Precision{}, outs)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]Output{}
	for _, o := range got {
		m[o.Name] = o
	}
	return m
}

func values(v Values) []float64 {
	out := make([]float64, v.Len())
	for i := range out {
		out[i] = v.At(i)
	}
	return out
}

func same(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float64bits(a[i]) != math.Float64bits(b[i]) {
			return false
		}
	}
	return true
}

// Partials in the model dtype (vLLM's merge_attn_states and FlashInfer's
// merge_states take bf16 and fp16 states) are read exactly: the reference
// of bf16 or fp16 partials is, bit for bit, that of the same values in
// fp32, and each result is rounded to its own dtype.
func TestNarrowPartialsReadExactly(t *testing.T) {
	po32, pl32 := partials(tensor.F32)
	for _, tc := range []struct {
		partial, out, lse tensor.DType
	}{
		{tensor.BF16, tensor.BF16, tensor.F32},
		{tensor.F16, tensor.F16, tensor.F32},
		{tensor.BF16, tensor.BF16, tensor.BF16}, // an lse in the model dtype
		{tensor.F16, tensor.F32, tensor.F16},
	} {
		t.Run(string(tc.partial)+"/"+string(tc.out)+"/"+string(tc.lse), func(t *testing.T) {
			po, pl := partials(tc.partial)
			outs := OutDTypes{"out": tc.out, "lse": tc.lse}
			got := reference(t, po, pl, Params{}, outs)
			want := reference(t, po32, pl32, Params{}, outs)
			for _, n := range []string{"out", "lse"} {
				if got[n].DType != outs[n] {
					t.Errorf("%s: dtype %s, want %s", n, got[n].DType, outs[n])
				}
				if !same(values(got[n].Expected), values(want[n].Expected)) || !same(values(got[n].Exact), values(want[n].Exact)) {
					t.Errorf("%s from %s partials differs from fp32's: %v vs %v", n, tc.partial, values(got[n].Expected), values(want[n].Expected))
				}
			}
			lse := values(got["lse"].Expected)
			if r := lse[0]; r != roundTo(tc.lse, r) {
				t.Errorf("lse %v is not a %s value", r, tc.lse)
			}
		})
	}
}

func roundTo(d tensor.DType, v float64) float64 {
	return tensor.FromFloat64s(d, []int{1}, []float64{v}).Float64At(0)
}

// empty_row and lse_empty say what the merge under test writes for a row
// with no state (row 2), and nothing else changes.
func TestEmptyRowConventions(t *testing.T) {
	po, pl := partials(tensor.BF16)
	nan := math.NaN()
	base := reference(t, po, pl, Params{}, OutDTypes{"out": tensor.BF16})
	for _, tc := range []struct {
		name    string
		params  Params
		out     []float64 // row 2's out, exact and expected
		lse     float64   // row 2's lse
		refuses string
	}{
		{name: "default", params: Params{}, out: []float64{0, 0, 0, 0}, lse: math.Inf(-1)},
		{name: "zero", params: Params{"empty_row": "zero", "lse_empty": "+inf"}, out: []float64{0, 0, 0, 0}, lse: math.Inf(1)},
		{name: "sglang nan", params: Params{"empty_row": "nan"}, out: []float64{nan, nan, nan, nan}, lse: nan},
		{name: "vllm cuda first split", params: Params{"empty_row": "first_split"}, out: []float64{1.25, -0.75, 0.5, 2}, lse: math.Inf(-1)},
		{name: "flashinfer triton sentinel", params: Params{"lse_empty": "-50000"}, out: []float64{0, 0, 0, 0}, lse: -50000},
		{name: "bad empty_row", params: Params{"empty_row": "copy"}, refuses: "empty_row"},
		{name: "bad lse_empty", params: Params{"lse_empty": "nan"}, refuses: "lse_empty"},
		{name: "unparsable lse_empty", params: Params{"lse_empty": "minus infinity"}, refuses: "lse_empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.refuses != "" {
				_, err := Validate(combine{}, Inputs{Tensors: map[string]*tensor.Tensor{"partial_out": po, "partial_lse": pl}, Params: tc.params})
				if err == nil || !strings.Contains(err.Error(), tc.refuses) {
					t.Fatalf("error %v, want one naming %s", err, tc.refuses)
				}
				return
			}
			got := reference(t, po, pl, tc.params, OutDTypes{"out": tensor.BF16})
			for _, v := range []Values{got["out"].Exact, got["out"].Expected} {
				all := values(v)
				if !same(all[8:], tc.out) {
					t.Errorf("row 2 out %v, want %v", all[8:], tc.out)
				}
			}
			if all := values(got["out"].Expected); !same(all[:8], values(base["out"].Expected)[:8]) {
				t.Errorf("rows 0-1 changed: %v", all[:8])
			}
			for _, v := range []Values{got["lse"].Exact, got["lse"].Expected} {
				if l := values(v)[2]; math.Float64bits(l) != math.Float64bits(tc.lse) && !(math.IsNaN(l) && math.IsNaN(tc.lse)) {
					t.Errorf("row 2 lse %v, want %v", l, tc.lse)
				}
			}
		})
	}
}
