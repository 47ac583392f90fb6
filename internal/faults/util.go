package faults

import (
	"context"
	"fmt"
	"math"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Helpers the hooks share. Hooks never write into a tensor they were given
// (it may be a view of a memory-mapped capture): they replace it.

// f32Scalar is an F32 tensor of shape [].
func f32Scalar(v float64) *tensor.Tensor {
	return tensor.FromFloat64s(tensor.F32, []int{}, []float64{v})
}

// ints reads an integer tensor.
func ints(t *tensor.Tensor) []int64 {
	v := make([]int64, t.Len())
	for i := range v {
		v[i] = t.Int64At(i)
	}
	return v
}

// scalarOf reads the single value of a [] or [1] tensor, naming it on error.
func scalarOf(in map[string]*tensor.Tensor, name string) (float64, error) {
	t, ok := in[name]
	if !ok {
		return 0, fmt.Errorf("tensor %s is missing", name)
	}
	v, err := t.Scalar()
	if err != nil {
		return 0, fmt.Errorf("tensor %s: %v", name, err)
	}
	return v, nil
}

// withSlots replaces slot_mapping by slots. Where two tokens now aim at one
// slot, the later one wins and the earlier is dropped (a GPU race the last
// writer wins here; the reference writer refuses duplicates).
func withSlots(in map[string]*tensor.Tensor, slots []int64) {
	last := map[int64]int{}
	for i, s := range slots {
		if s >= 0 {
			last[s] = i
		}
	}
	out := make([]int64, len(slots))
	for i, s := range slots {
		out[i] = s
		if s >= 0 && last[s] != i {
			out[i] = -1
		}
	}
	in["slot_mapping"] = tensor.FromInt64s(tensor.I64, []int{len(out)}, out)
}

// cacheGeometry returns the block count, page size and entry width (values
// a row, or bytes for fp8_ds_mla) of a cache tensor [NB, P, entry].
func cacheGeometry(t *tensor.Tensor, p kernel.Params, name string) (nb, page, entry int, err error) {
	if len(t.Shape) != 3 {
		return 0, 0, 0, fmt.Errorf("tensor %s has shape %v; want [NB, P, entry]", name, t.Shape)
	}
	page, err = p.Int("page_size", t.Shape[1])
	if err != nil {
		return 0, 0, 0, err
	}
	if page <= 0 {
		return 0, 0, 0, fmt.Errorf("parameter page_size = %d: want a positive page size", page)
	}
	return t.Shape[0], page, t.Shape[2], nil
}

// latentDim is the L of a q tensor [.., D] as the decode kernels read it:
// the latent_dim parameter, else D - 64 when D > 64.
func latentDim(q *tensor.Tensor, p kernel.Params) (int, error) {
	d := q.Shape[len(q.Shape)-1]
	l := d
	if d > 64 {
		l = d - 64
	}
	return p.Int("latent_dim", l)
}

// rewrite re-rounds v into element i of t (a tensor the hook owns).
func rewrite(t *tensor.Tensor, i int, v float64) { t.SetFloat64(i, v) }

// nan is a quiet NaN.
var nan = math.NaN()

// reproduce runs kernel name's reference on altered inputs run, at the
// precision the call's own parameters (of) declare, each output stored in
// the dtype the faulty output out holds: how a hook recomputes what a
// kernel with the bug would have written.
func reproduce(ctx context.Context, name string, of kernel.Params, run kernel.Inputs, out map[string]*tensor.Tensor) (map[string]*tensor.Tensor, error) {
	k, err := kernel.Lookup(name)
	if err != nil {
		return nil, err
	}
	prec, err := kernel.PrecisionFrom(of)
	if err != nil {
		return nil, err
	}
	dtypes := map[string]tensor.DType{}
	for n, t := range out {
		dtypes[n] = t.DType
	}
	return kernel.Produce(ctx, k, run, prec, dtypes)
}
