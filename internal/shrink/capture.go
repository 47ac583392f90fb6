package shrink

import (
	"context"
	"fmt"
	"github.com/kcheck-dev/kcheck/internal/evidence"

	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// A capture is shrunk along its independent axes: the outputs of a kept
// request, head or row depend only on that request's, head's or row's
// inputs, so the captured outputs, sliced, are still what the kernel under
// test produced for the sliced inputs.

// dim is one axis a capture can be sliced along.
type dim struct {
	name  string
	n     int
	apply func(keep []int) (evidence.Capture, error)
}

// derived copies c with new tensors replacing some.
func derived(c evidence.Capture, repl map[string]*tensor.Tensor) evidence.Capture {
	ts := make(map[string]*tensor.Tensor, len(c.Tensors))
	for k, v := range c.Tensors {
		ts[k] = v
	}
	for k, v := range repl {
		ts[k] = v
	}
	meta := make(map[string]string, len(c.Metadata))
	for k, v := range c.Metadata {
		meta[k] = v
	}
	return evidence.Capture{Name: c.Name, Metadata: meta, Tensors: ts}
}

// dims lists the axes a capture of its kernel can be sliced along (the
// kernel's Slicer).
func dims(c evidence.Capture) ([]dim, error) {
	kern := c.Metadata["kcheck.kernel"]
	if kern == "pipeline" {
		return nil, fmt.Errorf("a pipeline capture cannot be sliced stage by stage yet: shrink the culprit stage as a case (kcheck shrink --case) or capture that kernel alone")
	}
	k, err := kernel.Lookup(kern)
	if err != nil {
		return nil, fmt.Errorf("kernel %q: no slicing for this capture", kern)
	}
	axes, ok := k.(kernel.Slicer).Axes(c.Tensors, c.Metadata)
	if !ok {
		return nil, fmt.Errorf("kernel %q: no slicing for this capture", kern)
	}
	var ds []dim
	for _, a := range axes {
		ds = append(ds, dim{name: a.Name, n: a.N, apply: func(keep []int) (evidence.Capture, error) {
			repl, err := a.Slice(keep)
			if err != nil {
				return evidence.Capture{}, err
			}
			return derived(c, repl), nil
		}})
	}
	return ds, nil
}

// subsets lists the index sets ddmin tries for n items, largest reductions
// first: each half, then the complement of each chunk at finer and finer
// granularity.
func subsets(n int) [][]int {
	var out [][]int
	rng := func(lo, hi int) []int {
		var s []int
		for i := lo; i < hi; i++ {
			s = append(s, i)
		}
		return s
	}
	if n < 2 {
		return nil
	}
	seen := map[string]bool{}
	add := func(s []int) {
		if k := fmt.Sprint(s); !seen[k] {
			seen[k] = true
			out = append(out, s)
		}
	}
	add(rng(0, 1))
	add(rng(0, n/2))
	add(rng(n/2, n))
	for g := 2; g <= n; g *= 2 {
		chunk := (n + g - 1) / g
		for lo := 0; lo < n; lo += chunk {
			if hi := min(n, lo+chunk); hi-lo < n {
				add(append(rng(0, lo), rng(hi, n)...))
			}
		}
	}
	return out
}

// Capture shrinks a failing capture by slicing it along its kernel's
// independent axes (requests, heads, rows, tokens), checking each slice
// against its own captured outputs.
func Capture(ctx context.Context, c evidence.Capture, opts Options) (*Result, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	res0 := check.Run(ctx, c, opts.Check)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	want := FingerprintOf(res0)
	if want.Verdict != check.Fail {
		return nil, fmt.Errorf("%s does not fail (verdict %s): nothing to shrink", c.Name, res0.Verdict)
	}
	if _, err := dims(c); err != nil {
		return nil, err
	}
	r := &Result{Fingerprint: want, Before: Size(c), Capture: c, Check: res0}
	for progress := true; progress && r.Tries < opts.maxTries(); {
		progress = false
		ds, err := dims(r.Capture)
		if err != nil {
			return nil, err
		}
	search:
		for _, d := range ds {
			for _, keep := range subsets(d.n) {
				if r.Tries >= opts.maxTries() {
					break search
				}
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				r.Tries++
				cand, err := d.apply(keep)
				if err != nil || Size(cand) >= Size(r.Capture) {
					continue
				}
				res := check.Run(ctx, cand, opts.Check)
				if FingerprintOf(res) != want {
					continue
				}
				r.Capture, r.Check = cand, res
				r.Steps = append(r.Steps, fmt.Sprintf("%s %d -> %d", d.name, d.n, len(keep)))
				progress = true
				break search
			}
		}
	}
	r.After = Size(r.Capture)
	r.BeforeBytes, r.AfterBytes = r.Before, r.After
	r.Capture.Metadata["kcheck.shrunk_from"] = c.Name
	return r, nil
}
