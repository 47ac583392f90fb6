// Package backend runs kernels by contract name on contract tensors: the Go
// reference at a declared precision, the exact chain (the noise floor's
// other end), one stage swapped for the reference or run alone on another
// backend, the CUDA kernels through the GPU worker, or a reference with a
// planted fault. Every backend's outputs are judged by the same checker, so
// a backend is only ever a producer.
package backend

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/suggest"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Backend produces a kernel's outputs from its inputs.
type Backend interface {
	Name() string
	// Run returns the outputs of kernel name on in. An error means the
	// backend could not run it (a crash, a hang, unusable input): a result,
	// not a panic.
	Run(ctx context.Context, name string, in kernel.Inputs) (map[string]*tensor.Tensor, error)
}

// InProcess is implemented by backends that run Go code in this process
// and keep no state between runs (the reference, the exact chain, a
// planted fault), so that kcheck run may run cases side by side, each
// charged against the memory bound as it runs. A backend that drives a
// device or other processes (cuda, worker:, exec:) runs one case at a
// time: they would share one GPU or time each other out.
type InProcess interface {
	InProcess() bool
}

// Concurrent reports whether be may run several cases at once (InProcess).
func Concurrent(be Backend) bool {
	ip, ok := be.(InProcess)
	return ok && ip.InProcess()
}

// MetaRunner is a backend whose outputs come with metadata a capture must
// keep (an emulated device's name and what it cannot check); meta may be nil.
type MetaRunner interface {
	RunWithMeta(ctx context.Context, name string, in kernel.Inputs) (outs map[string]*tensor.Tensor, meta map[string]string, err error)
}

// Reference is the Go reference at the declared precision of in.Params: a
// correct kernel of that precision, stored in the contract's default dtypes.
type Reference struct{}

// Name implements Backend.
func (Reference) Name() string { return "reference" }

// InProcess implements InProcess.
func (Reference) InProcess() bool { return true }

// Run implements Backend.
func (Reference) Run(ctx context.Context, name string, in kernel.Inputs) (map[string]*tensor.Tensor, error) {
	k, err := kernel.Lookup(name)
	if err != nil {
		return nil, err
	}
	prec, err := kernel.PrecisionFrom(in.Params)
	if err != nil {
		return nil, err
	}
	return kernel.Produce(ctx, k, in, prec, nil)
}

// Factory makes a backend from the text after "NAME:" in a --backend value.
type Factory func(arg string) (Backend, error)

var factories = map[string]Factory{
	"reference": func(arg string) (Backend, error) {
		if arg != "" {
			return nil, fmt.Errorf("backend reference takes no argument (got %q)", arg)
		}
		return Reference{}, nil
	},
}

// Register adds a backend kind ("cuda", "faulty"); packages that provide
// one register it from init, so this package imports none of them.
func Register(kind string, f Factory) {
	if _, dup := factories[kind]; dup {
		panic("backend: " + kind + " registered twice")
	}
	factories[kind] = f
}

// Parse turns a --backend value ("reference", "cuda", "faulty:page_off_by_one") into a backend.
func Parse(spec string) (Backend, error) {
	kind, arg, _ := strings.Cut(spec, ":")
	f, ok := factories[kind]
	if !ok {
		var kinds []string
		for k := range factories {
			kinds = append(kinds, k)
		}
		sort.Strings(kinds)
		return nil, fmt.Errorf("unknown backend %q%s (known: %s)", spec, suggest.DidYouMean(kind, kinds), strings.Join(kinds, ", "))
	}
	return f(arg)
}
