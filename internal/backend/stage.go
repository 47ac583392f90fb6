package backend

import (
	"context"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Swapped runs the kernels of one stage on the reference and every other
// kernel on Base: "swap the stage for its reference".
type Swapped struct {
	Base  Backend
	Stage string
}

// Name implements Backend.
func (s Swapped) Name() string { return s.Base.Name() + " with " + s.Stage + " on the reference" }

// InProcess implements InProcess: as Base does (the reference always does).
func (s Swapped) InProcess() bool { return Concurrent(s.Base) }

// Run implements Backend.
func (s Swapped) Run(ctx context.Context, name string, in kernel.Inputs) (map[string]*tensor.Tensor, error) {
	k, err := kernel.Lookup(name)
	if err != nil {
		return nil, err
	}
	if k.Spec().Stage == s.Stage {
		return Reference{}.Run(ctx, name, in)
	}
	return s.Base.Run(ctx, name, in)
}

// Only runs one stage on Base and every other on the reference: used when
// no single swap removes the drift (more than one stage is at fault).
type Only struct {
	Base  Backend
	Stage string
}

// Name implements Backend.
func (o Only) Name() string { return o.Base.Name() + " in " + o.Stage + " only" }

// InProcess implements InProcess: as Base does.
func (o Only) InProcess() bool { return Concurrent(o.Base) }

// Run implements Backend.
func (o Only) Run(ctx context.Context, name string, in kernel.Inputs) (map[string]*tensor.Tensor, error) {
	k, err := kernel.Lookup(name)
	if err != nil {
		return nil, err
	}
	if k.Spec().Stage != o.Stage {
		return Reference{}.Run(ctx, name, in)
	}
	return o.Base.Run(ctx, name, in)
}
