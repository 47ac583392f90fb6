package check

import (
	"fmt"
	"github.com/kcheck-dev/kcheck/internal/evidence"
	"sort"
	"strings"

	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Observation is one output comparison as it happened: the reference side,
// the actual tensor and the resulting check. Reports keep per-coordinate
// error profiles from it, which the JSON result does not carry.
type Observation struct {
	// Stage is the pipeline stage prefix ("" for a single kernel); Kind is
	// "local" or "propagated" for a pipeline stage, "" otherwise.
	Stage, Kind string
	Kernel      string
	Params      kernel.Params
	Ref         *kernel.Output
	Actual      *tensor.Tensor
	Check       compare.Check
	Policy      compare.Policy
}

func (o Options) observe(k kernel.Kernel, p kernel.Params, ref *kernel.Output, actual *tensor.Tensor, c compare.Check) {
	if o.Observe == nil {
		return
	}
	o.Observe(Observation{Stage: o.stage, Kind: o.kind, Kernel: k.Spec().Name, Params: p, Ref: ref, Actual: actual, Check: c, Policy: o.policy()})
}

// forStage labels the observations of one pipeline stage.
func (o Options) forStage(prefix, kind string) Options {
	o.stage, o.kind = prefix, kind
	return o
}

// prepare applies the options that rewrite a capture before it is read:
// tensor aliases, the engine adapter, then the metadata conventions (the
// file's own keys win). The caller's maps are not modified.
func prepare(c evidence.Capture, opts Options) (evidence.Capture, []string, error) {
	var notes []string
	if layout := c.Metadata[kernel.LayoutKey]; layout != "" {
		switch {
		case opts.Adapt != nil && opts.From != layout:
			return c, nil, fmt.Errorf("metadata %s = %q: the file holds %s's names and layouts, not those --from %s reads", kernel.LayoutKey, layout, layout, opts.From)
		case opts.Adapt == nil && opts.Engine == nil:
			return c, nil, fmt.Errorf("metadata %s = %q: this checker was given no engine layouts to read it with", kernel.LayoutKey, layout)
		case opts.Adapt == nil:
			conventions, adapt, err := opts.Engine(layout)
			if err != nil {
				return c, nil, fmt.Errorf("metadata %s: %v", kernel.LayoutKey, err)
			}
			opts.Conventions, opts.Adapt, opts.From = conventions, adapt, layout
			notes = append(notes, fmt.Sprintf("read as --from %s reads a capture: the file declares %s = %s", layout, kernel.LayoutKey, layout))
		}
	}
	if len(opts.Aliases) == 0 && opts.Adapt == nil {
		c.Metadata = withConventions(c.Metadata, opts.Conventions)
		return c, notes, nil
	}
	meta := make(map[string]string, len(c.Metadata))
	for k, v := range c.Metadata {
		meta[k] = v
	}
	ts := make(map[string]*tensor.Tensor, len(c.Tensors))
	for k, v := range c.Tensors {
		ts[k] = v
	}
	if len(opts.Aliases) > 0 {
		n, err := applyAliases(ts, opts.Aliases)
		if err != nil {
			return c, nil, err
		}
		notes = append(notes, n...)
	}
	if opts.Adapt != nil {
		n, err := opts.Adapt(meta, ts)
		if err != nil {
			return c, nil, err
		}
		notes = append(notes, n...)
	}
	c.Metadata = withConventions(meta, opts.Conventions)
	c.Tensors = ts
	return c, notes, nil
}

// applyAliases renames tensors: alias name -> contract name, also under a
// pipeline stage prefix ("attn.softmax_lse" -> "attn.lse").
func applyAliases(ts map[string]*tensor.Tensor, aliases map[string]string) ([]string, error) {
	names := make([]string, 0, len(ts))
	for n := range ts {
		names = append(names, n)
	}
	sort.Strings(names)
	var notes []string
	for _, n := range names {
		prefix, base := "", n
		if to, ok := aliases[n]; ok {
			if err := renameTensor(ts, n, to, &notes); err != nil {
				return nil, err
			}
			continue
		}
		if i := strings.LastIndex(n, "."); i >= 0 {
			prefix, base = n[:i+1], n[i+1:]
		}
		if to, ok := aliases[base]; ok && prefix != "" {
			if err := renameTensor(ts, n, prefix+to, &notes); err != nil {
				return nil, err
			}
		}
	}
	return notes, nil
}

func renameTensor(ts map[string]*tensor.Tensor, from, to string, notes *[]string) error {
	if from == to {
		return nil
	}
	if _, taken := ts[to]; taken {
		return fmt.Errorf("tensor %s is an alias of %s, and the file holds both: keep one", from, to)
	}
	ts[to] = ts[from]
	delete(ts, from)
	*notes = append(*notes, fmt.Sprintf("tensor %s read as %s", from, to))
	return nil
}
