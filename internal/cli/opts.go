package cli

import (
	"fmt"

	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/engines"
)

// policyByName returns the tolerance policy --policy names.
func policyByName(name string) (compare.Policy, error) {
	switch name {
	case "", "three-way":
		return compare.DefaultPolicy(), nil
	case "unit-roundoff":
		return compare.UnitRoundoff{}, nil
	}
	return nil, fmt.Errorf("--policy %q: want three-way or unit-roundoff", name)
}

// checkOpts builds the checker's options from the command line: the
// tolerance policy, how many worst elements to list, and an engine's
// conventions (--from: metadata defaults, tensor names and layouts).
func checkOpts(policy, from string, worstK int) (check.Options, error) {
	pol, err := policyByName(policy)
	if err != nil {
		return check.Options{}, err
	}
	opts := check.Options{Policy: pol, WorstK: worstK, Hint: engines.Hint, Engine: engines.Layout}
	if from != "" {
		if opts.Conventions, opts.Adapt, err = engines.Layout(from); err != nil {
			return opts, err
		}
		opts.From = from
	}
	return opts, nil
}
