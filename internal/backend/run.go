package backend

import (
	"context"
	"fmt"
	"strings"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/evidence"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// The one runner: build a case's inputs, run a backend on them, assemble
// the capture the checker judges.

// RunCase builds c's inputs (stopped when ctx is done), runs its kernel on
// be and returns the capture: the case's metadata (its parameters, name
// and seed), the backend's name and whatever the backend says of its run.
func RunCase(ctx context.Context, be Backend, c cases.Case) (evidence.Capture, error) {
	in, err := c.InputsContext(ctx)
	if err != nil {
		return evidence.Capture{}, err
	}
	meta, err := c.Metadata()
	if err != nil {
		return evidence.Capture{}, err
	}
	meta["kcheck.backend"] = be.Name()
	return Capture(ctx, be, c.Name, c.Kernel, in, meta)
}

// Capture runs kernel kname on be over in and assembles the capture named
// name: in's tensors and the outputs, meta and then the metadata the
// backend returns with its outputs (a MetaRunner's). A backend's error is
// wrapped, naming the backend.
func Capture(ctx context.Context, be Backend, name, kname string, in kernel.Inputs, meta map[string]string) (evidence.Capture, error) {
	outs, bmeta, err := RunWithMeta(ctx, be, kname, in)
	if err != nil {
		return evidence.Capture{}, fmt.Errorf("backend %s: %w", be.Name(), err)
	}
	if bmeta[kernel.LayoutKey] != "" {
		// OUT is the engine's own call (its inputs and outputs in its
		// names), judged alone: only kcheck's provenance keys of the case
		// go with it, not the contract's parameters it was made from.
		own := map[string]string{}
		for k, v := range meta {
			if strings.HasPrefix(k, "kcheck.") {
				own[k] = v
			}
		}
		return evidence.Assemble(name, nil, outs, own, bmeta), nil
	}
	return evidence.Assemble(name, in.Tensors, outs, meta, bmeta), nil
}

// RunWithMeta runs be, with the metadata of its run when it reports any.
func RunWithMeta(ctx context.Context, be Backend, kname string, in kernel.Inputs) (map[string]*tensor.Tensor, map[string]string, error) {
	if mr, ok := be.(MetaRunner); ok {
		return mr.RunWithMeta(ctx, kname, in)
	}
	outs, err := be.Run(ctx, kname, in)
	return outs, nil, err
}
