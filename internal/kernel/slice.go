package kernel

import "github.com/kcheck-dev/kcheck/reference/tensor"

// Slicer is how `kcheck shrink` makes a failing case or capture of a
// kernel smaller: the sizes of a case it may reduce, and the independent
// axes a capture can be sliced along (the outputs of a kept request, head
// or row depend only on that request's, head's or row's inputs, so the
// captured outputs, sliced, are still what the kernel under test produced
// for the sliced inputs).
type Slicer interface {
	// Axes lists the axes a capture of the kernel (its tensors, inputs and
	// outputs, and its metadata) can be sliced along; ok is false when
	// its tensors are not shaped for any (the shrinker says so).
	Axes(ts map[string]*tensor.Tensor, meta map[string]string) (axes []Axis, ok bool)
	// CaseSizes says which sizes of a catalog case the kernel reads.
	CaseSizes() CaseSizes
}

// Axis is one axis a capture can be sliced along: N indices, of which
// Slice keeps some, returning the tensors that replace the capture's.
type Axis struct {
	Name  string
	N     int
	Slice func(keep []int) (map[string]*tensor.Tensor, error)
}

// CaseSizes are the sizes of a catalog case a kernel reads: the shrinker
// makes them explicit (the kernel's defaults) and reduces only those.
type CaseSizes struct {
	// SeqLens: the requests' contexts (read back from the generated
	// seq_lens when the case gives none), with PageSize the default page
	// size.
	SeqLens  bool
	PageSize int
	// Latent is the latent width to halve from when the case gives none
	// (0: the kernel has no latent a case may shrink).
	Latent int
	// M, N and K are the defaults of the GEMM-like sizes (0: not read).
	M, N, K int
}

// SelectAxis returns t with only the indices keep of axis ax.
func SelectAxis(t *tensor.Tensor, ax int, keep []int) *tensor.Tensor {
	outer, n, inner := 1, t.Shape[ax], 1
	for d, s := range t.Shape {
		switch {
		case d < ax:
			outer *= s
		case d > ax:
			inner *= s
		}
	}
	shape := append([]int(nil), t.Shape...)
	shape[ax] = len(keep)
	r := tensor.New(t.DType, shape...)
	es := t.DType.Size() * inner
	for o := 0; o < outer; o++ {
		for j, i := range keep {
			copy(r.Data[(o*len(keep)+j)*es:(o*len(keep)+j+1)*es], t.Data[(o*n+i)*es:(o*n+i+1)*es])
		}
	}
	return r
}

// SliceNamed slices every present tensor of ts named in axes along its
// axis.
func SliceNamed(ts map[string]*tensor.Tensor, keep []int, axes map[string]int) map[string]*tensor.Tensor {
	repl := map[string]*tensor.Tensor{}
	for name, ax := range axes {
		if t, ok := ts[name]; ok && len(t.Shape) > ax {
			repl[name] = SelectAxis(t, ax, keep)
		}
	}
	return repl
}
