// Package bisect is the binary search behind `kcheck bisect` and its
// answer: the first configuration (a decode step of the simulated decoder,
// a context length of a case) where a backend's error leaves the floor.
// The searches themselves live with what they run: the step search with
// the simulation (internal/sim), the context search with the case runs it
// shrinks (internal/shrink); both answer in this package's Result, which
// the command prints the same way for either.
package bisect

import "github.com/kcheck-dev/kcheck/internal/compare"

// Probe is one configuration a bisection ran.
type Probe struct {
	// N is the number of decode steps run (simulation) or the context
	// length every request was given (case).
	N       int             `json:"n"`
	Verdict compare.Verdict `json:"verdict"`
}

// Result is where a backend's error first leaves the floor, found by
// binary search.
type Result struct {
	Mode    string `json:"mode"` // "steps" or "context"
	Backend string `json:"backend"`
	// Verdict is fail when a first bad point was found, pass when even the
	// largest configuration stays on the floor.
	Verdict         compare.Verdict `json:"verdict"`
	FirstStep       *int            `json:"first_step"`
	FirstContextLen *int            `json:"first_context_len"`
	Probes          []Probe         `json:"probes"`
	Reason          string          `json:"reason"`
}

// Search returns the smallest n in [lo, hi] with bad(n), assuming bad is
// monotone (false then true), or hi+1 when bad(hi) is false.
func Search(lo, hi int, bad func(n int) (bool, error)) (int, error) {
	ok, err := bad(hi)
	if err != nil || !ok {
		return hi + 1, err
	}
	for lo < hi {
		mid := lo + (hi-lo)/2
		b, err := bad(mid)
		if err != nil {
			return 0, err
		}
		if b {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo, nil
}
