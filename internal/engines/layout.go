package engines

import (
	"fmt"
	"math"

	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// The conversions below only move bytes: a reshape, a permutation of axes, a
// concatenation or a stack. None of them computes a value, so a capture read
// through them holds exactly the bits the engine wrote, and every error the
// checker reports is the kernel's, not ours.

func checked(name string, t *tensor.Tensor) error {
	if err := t.Check(); err != nil {
		return fmt.Errorf("tensor %s: %v", name, err)
	}
	return nil
}

// reshape views t with another shape of the same element count.
func reshape(name string, t *tensor.Tensor, shape ...int) (*tensor.Tensor, error) {
	if err := checked(name, t); err != nil {
		return nil, err
	}
	if tensor.NumElements(shape) != t.Len() {
		return nil, fmt.Errorf("tensor %s has shape %v, which cannot be read as %v (element counts differ)", name, t.Shape, shape)
	}
	return &tensor.Tensor{DType: t.DType, Shape: append([]int(nil), shape...), Data: t.Data}, nil
}

// permute returns t with its axes reordered: axis i of the result is axis
// perm[i] of t (numpy's transpose(perm)).
func permute(name string, t *tensor.Tensor, perm ...int) (*tensor.Tensor, error) {
	if err := checked(name, t); err != nil {
		return nil, err
	}
	if len(perm) != len(t.Shape) {
		return nil, fmt.Errorf("tensor %s has rank %d; the layout conversion expects rank %d", name, len(t.Shape), len(perm))
	}
	shape := make([]int, len(perm))
	for i, p := range perm {
		shape[i] = t.Shape[p]
	}
	out := tensor.New(t.DType, shape...)
	es := t.DType.Size()
	src := tensor.Strides(t.Shape)
	n := out.Len()
	idx := make([]int, len(shape))
	for o := 0; o < n; o++ {
		off := 0
		for i, v := range idx {
			off += v * src[perm[i]]
		}
		copy(out.Data[o*es:(o+1)*es], t.Data[off*es:(off+1)*es])
		for d := len(idx) - 1; d >= 0; d-- { // next index, row-major
			idx[d]++
			if idx[d] < shape[d] {
				break
			}
			idx[d] = 0
		}
	}
	return out, nil
}

// concatLast joins a and b along their last axis (q_nope | q_pe, ckv | kpe).
func concatLast(aName string, a *tensor.Tensor, bName string, b *tensor.Tensor) (*tensor.Tensor, error) {
	if err := checked(aName, a); err != nil {
		return nil, err
	}
	if err := checked(bName, b); err != nil {
		return nil, err
	}
	if a.DType != b.DType {
		return nil, fmt.Errorf("tensors %s (%s) and %s (%s) must have the same dtype to be joined", aName, a.DType, bName, b.DType)
	}
	ra, rb := len(a.Shape), len(b.Shape)
	if ra == 0 || ra != rb {
		return nil, fmt.Errorf("tensors %s %v and %s %v must have the same rank to be joined", aName, a.Shape, bName, b.Shape)
	}
	for d := 0; d < ra-1; d++ {
		if a.Shape[d] != b.Shape[d] {
			return nil, fmt.Errorf("tensors %s %v and %s %v differ in dimension %d", aName, a.Shape, bName, b.Shape, d)
		}
	}
	la, lb := a.Shape[ra-1], b.Shape[rb-1]
	shape := append(append([]int(nil), a.Shape[:ra-1]...), la+lb)
	out := tensor.New(a.DType, shape...)
	es := a.DType.Size()
	rows := tensor.NumElements(a.Shape[:ra-1])
	for r := 0; r < rows; r++ {
		dst := out.Data[r*(la+lb)*es:]
		copy(dst, a.Data[r*la*es:(r+1)*la*es])
		copy(dst[la*es:], b.Data[r*lb*es:(r+1)*lb*es])
	}
	return out, nil
}

// stack joins same-shaped tensors along a new axis (numpy's stack).
func stack(axis int, names []string, ts []*tensor.Tensor) (*tensor.Tensor, error) {
	for i, t := range ts {
		if err := checked(names[i], t); err != nil {
			return nil, err
		}
		if t.DType != ts[0].DType || !sameInts(t.Shape, ts[0].Shape) {
			return nil, fmt.Errorf("tensors %s (%s %v) and %s (%s %v) must have the same dtype and shape to be stacked",
				names[0], ts[0].DType, ts[0].Shape, names[i], t.DType, t.Shape)
		}
	}
	base := ts[0].Shape
	shape := append(append(append([]int(nil), base[:axis]...), len(ts)), base[axis:]...)
	out := tensor.New(ts[0].DType, shape...)
	inner := tensor.NumElements(base[axis:]) * ts[0].DType.Size()
	outer := tensor.NumElements(base[:axis])
	p := 0
	for o := 0; o < outer; o++ {
		for _, t := range ts {
			copy(out.Data[p:p+inner], t.Data[o*inner:(o+1)*inner])
			p += inner
		}
	}
	return out, nil
}

func sameInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// ints reads an integer tensor (any integer dtype) as a slice.
func ints(name string, t *tensor.Tensor) ([]int64, error) {
	if err := checked(name, t); err != nil {
		return nil, err
	}
	if !t.DType.IsInt() {
		return nil, fmt.Errorf("tensor %s has dtype %s; it must hold integers", name, t.DType)
	}
	v := make([]int64, t.Len())
	for i := range v {
		v[i] = t.Int64At(i)
	}
	return v, nil
}

// csrToBlockTable turns FlashInfer's page lists (kv_indptr [B+1], kv_indices
// [nnz]) into the contract's block_table [B, max pages], padded with page
// 0 (a valid block: padding entries past a request's pages are never read).
func csrToBlockTable(indptr, indices []int64) (*tensor.Tensor, error) {
	if len(indptr) < 2 {
		return nil, fmt.Errorf("tensor kv_indptr has %d entries; it needs B+1 >= 2", len(indptr))
	}
	b := len(indptr) - 1
	maxPages := 0
	for i := 0; i < b; i++ {
		lo, hi := indptr[i], indptr[i+1]
		if lo < 0 || hi < lo || hi > int64(len(indices)) {
			return nil, fmt.Errorf("kv_indptr[%d..%d] = %d..%d is not a range of kv_indices (%d entries)", i, i+1, lo, hi, len(indices))
		}
		maxPages = max(maxPages, int(hi-lo))
	}
	maxPages = max(maxPages, 1)
	vals := make([]int64, b*maxPages)
	for i := 0; i < b; i++ {
		for j, p := range indices[indptr[i]:indptr[i+1]] {
			if p < 0 || p > math.MaxInt32 {
				return nil, fmt.Errorf("kv_indices[%d] = %d is not a page index", int(indptr[i])+j, p)
			}
			vals[i*maxPages+j] = p
		}
	}
	return tensor.FromInt64s(tensor.I32, []int{b, maxPages}, vals), nil
}

// lensFromCumulative turns cumulative lengths [B+1] (vLLM cu_seq_lens) into
// per-request lengths [B].
func lensFromCumulative(name string, cu []int64) (*tensor.Tensor, error) {
	if len(cu) < 2 {
		return nil, fmt.Errorf("tensor %s has %d entries; it needs B+1 >= 2", name, len(cu))
	}
	lens := make([]int64, len(cu)-1)
	for i := range lens {
		lens[i] = cu[i+1] - cu[i]
		if lens[i] < 0 {
			return nil, fmt.Errorf("%s[%d] = %d is below %s[%d] = %d: cumulative lengths must not decrease", name, i+1, cu[i+1], name, i, cu[i])
		}
	}
	return tensor.FromInt64s(tensor.I32, []int{len(lens)}, lens), nil
}

// bytesOf reinterprets a 32-bit integer tensor as its little-endian bytes
// of dtype d, the last axis growing fourfold: vLLM allocates the swizzled
// NVFP4 scales as int32 [M_pad, K_pad/4] and views them as float8_e4m3fn
// [M_pad, K_pad].
func bytesOf(name string, t *tensor.Tensor, d tensor.DType) (*tensor.Tensor, error) {
	if err := checked(name, t); err != nil {
		return nil, err
	}
	if t.DType.Size() != 4 || !t.DType.IsInt() {
		return nil, fmt.Errorf("tensor %s has dtype %s; only a 32-bit integer view is read as bytes", name, t.DType)
	}
	shape := append([]int(nil), t.Shape...)
	if len(shape) == 0 {
		shape = []int{1}
	}
	shape[len(shape)-1] *= 4
	return &tensor.Tensor{DType: d, Shape: shape, Data: t.Data}, nil
}
