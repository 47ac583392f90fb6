package kernel

import "github.com/kcheck-dev/kcheck/reference/tensor"

// The capabilities: what the tools ask a kernel for beyond its reference.
// Each is a small interface a family implements beside its Kernel; the
// registry test (internal/kernels/all) fails any kernel that lacks one, so
// that no kernel ships without, say, its memory bound.

// Coster estimates a kernel's reference working set and work from the
// shapes of its tensors and its parameters, before any data is read: the
// memory bound refuses a check whose estimate exceeds it, rather than let
// the kernel of the machine kill the process.
type Coster interface {
	// Cost adds the kernel's terms to c. It must not allocate per
	// element: the shapes may claim a terabyte.
	Cost(s Shapes, p Params, c *Cost)
}

// Contexter says whether a catalog case's seq_lens set the context
// lengths a kernel reads, so that the case can be run at a shorter
// context: what `kcheck bisect --context` searches over.
type Contexter interface {
	// CaseContexts is false for a kernel with no context (NVFP4, the
	// rows of splitk_combine) and for one whose context a case's
	// seq_lens do not choose (mla_decode_sparse attends the slots its
	// indices name).
	CaseContexts() bool
}

// Roofliner gives the least traffic and work a kernel must do on inputs
// in that produced outs: the bytes it must move at least (its inputs read
// once, its outputs written once; for attention the KV entries of every
// request) and its floating-point operations (0 when memory-bound), for
// `kcheck bench`'s rates.
type Roofliner interface {
	Roofline(in Inputs, outs map[string]*tensor.Tensor) (bytes int64, flops float64)
}

// StreamedBytes is the roofline bytes of a kernel that reads each input
// once and writes each output once.
func StreamedBytes(in Inputs, outs map[string]*tensor.Tensor) int64 {
	var n int64
	for _, t := range in.Tensors {
		n += int64(len(t.Data))
	}
	for _, t := range outs {
		n += int64(len(t.Data))
	}
	return n
}
