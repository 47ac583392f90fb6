package faults

import (
	"context"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Helpers the families' hooks share, whatever the kernel. Hooks never
// write into a tensor they were given (it may be a view of a memory-mapped
// capture): they replace it, with a Clone when they edit its data.

// Ints reads an integer tensor.
func Ints(t *tensor.Tensor) []int64 {
	v := make([]int64, t.Len())
	for i := range v {
		v[i] = t.Int64At(i)
	}
	return v
}

// CloneParams returns a copy of p a hook may edit.
func CloneParams(p kernel.Params) kernel.Params {
	c := kernel.Params{}
	for k, v := range p {
		c[k] = v
	}
	return c
}

// axisView locates index i of axis ax in a row-major tensor: the tensor is
// outer x n x inner elements with n = shape[ax].
func axisView(shape []int, ax int) (outer, n, inner int) {
	outer, inner = 1, 1
	for d, s := range shape {
		switch {
		case d < ax:
			outer *= s
		case d > ax:
			inner *= s
		}
	}
	return outer, shape[ax], inner
}

// TakeAxis returns index i of axis ax of t, keeping the axis (size 1).
func TakeAxis(t *tensor.Tensor, ax, i int) *tensor.Tensor {
	outer, n, inner := axisView(t.Shape, ax)
	shape := append([]int(nil), t.Shape...)
	shape[ax] = 1
	r := tensor.New(t.DType, shape...)
	es := t.DType.Size() * inner
	for o := 0; o < outer; o++ {
		copy(r.Data[o*es:(o+1)*es], t.Data[(o*n+i)*es:(o*n+i+1)*es])
	}
	return r
}

// PutAxis stores src (axis ax of size 1) at index i of axis ax of dst.
func PutAxis(dst *tensor.Tensor, ax, i int, src *tensor.Tensor) {
	outer, n, inner := axisView(dst.Shape, ax)
	es := dst.DType.Size() * inner
	for o := 0; o < outer; o++ {
		copy(dst.Data[(o*n+i)*es:(o*n+i+1)*es], src.Data[o*es:(o+1)*es])
	}
}

// SwapAxis exchanges indices a and b of axis ax in place.
func SwapAxis(t *tensor.Tensor, ax, a, b int) {
	ta, tb := TakeAxis(t, ax, a), TakeAxis(t, ax, b)
	PutAxis(t, ax, a, tb)
	PutAxis(t, ax, b, ta)
}

// Reproduce runs kernel name's reference on altered inputs run, at the
// precision the call's own parameters (of) declare, each output stored in
// the dtype the faulty output out holds: how a hook recomputes what a
// kernel with the bug would have written.
func Reproduce(ctx context.Context, name string, of kernel.Params, run kernel.Inputs, out map[string]*tensor.Tensor) (map[string]*tensor.Tensor, error) {
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
