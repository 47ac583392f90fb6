package diagnose

import (
	"context"
	"fmt"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"math"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/backend"
	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/shrink"
)

// Probe is one configuration a bisection ran.
type Probe struct {
	// N is the number of decode steps run (simulation) or the context
	// length every request was given (case).
	N       int             `json:"n"`
	Verdict compare.Verdict `json:"verdict"`
}

// BisectResult is where a backend's error first leaves the floor, found by
// binary search.
type BisectResult struct {
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

// search returns the smallest n in [lo, hi] with bad(n), assuming bad is
// monotone (false then true), or hi+1 when bad(hi) is false.
func search(lo, hi int, bad func(n int) (bool, error)) (int, error) {
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

// BisectSteps finds the first decode step whose error leaves the floor by
// binary search on the number of steps run: a run of n steps is the prefix
// of the full run, so "some step of the first n is off the floor" is
// monotone in n. base is the full run's baseline (nil: computed).
func (s *Sim) BisectSteps(ctx context.Context, be backend.Backend, base *Baseline, th Thresholds) (*BisectResult, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	if th.FloorFactor == 0 {
		th = DefaultThresholds()
	}
	if base == nil {
		var err error
		if base, err = s.Baseline(ctx, th); err != nil {
			return nil, err
		}
	}
	res := &BisectResult{Mode: "steps", Backend: be.Name()}
	total := len(base.Ref)
	forced := base.Ref
	if base.Free {
		forced = nil
	}
	bad := func(n int) (bool, error) {
		tr, err := s.run(ctx, be, forced, n)
		if err != nil && ctx.Err() != nil {
			return false, ctx.Err()
		}
		off := false
		for i := 0; i < n; i++ {
			// A broken chain (err != nil) counts its missing steps as off.
			e := relRMSAt(tr, base, i)
			off = off || e > base.Threshold[i]
		}
		v := check.Pass
		if off {
			v = check.Fail
		}
		res.Probes = append(res.Probes, Probe{N: n, Verdict: v})
		return off, nil
	}
	n, err := search(1, total, bad)
	if err != nil {
		return nil, err
	}
	if n > total {
		res.Verdict = check.Pass
		res.Reason = fmt.Sprintf("all %d steps stay within %g x the floor", total, th.FloorFactor)
		return res, nil
	}
	step, ctxLen := n-1, base.Ref[n-1].ContextLen
	res.Verdict, res.FirstStep, res.FirstContextLen = check.Fail, &step, &ctxLen
	res.Reason = fmt.Sprintf("the first %d steps stay on the floor, step %d (prompt %d, context %d) leaves it; %d probes",
		n-1, step, base.Ref[step].Prompt, ctxLen, len(res.Probes))
	return res, nil
}

func relRMSAt(tr Trace, b *Baseline, i int) float64 {
	if i >= len(tr) {
		return math.Inf(1) // never reached: the chain broke before it
	}
	return relRMS(tr[i].Out, b.Ref[i].Out)
}

// BisectContext finds the shortest context at which a case fails on be, by
// binary search on a context length given to every request (1 to the
// case's longest). It assumes a bug that shows at some context shows at
// every longer one; where it does not (a fault that fires only on partial
// pages), the result is a failing length whose predecessor passes, not
// necessarily the shortest.
func BisectContext(ctx context.Context, c cases.Case, be backend.Backend, opts check.Options) (*BisectResult, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	k, err := kernel.Lookup(c.Kernel)
	if err != nil {
		return nil, err
	}
	if !k.(kernel.Contexter).CaseContexts() {
		return nil, fmt.Errorf("case %s (%s) has no context length to bisect", c.Name, c.Kernel)
	}
	if err := check.CheckCaseMemory(c.Sizes(), opts.MaxMemory); err != nil {
		return nil, err
	}
	longest := 0
	seq := c.SeqLens
	if len(seq) == 0 {
		in, err := c.InputsContext(ctx)
		if err != nil {
			return nil, err
		}
		if sl, ok := in.Tensors["seq_lens"]; ok {
			for i := 0; i < sl.Len(); i++ {
				seq = append(seq, int(sl.Int64At(i)))
			}
		}
	}
	for _, n := range seq {
		longest = max(longest, n)
	}
	if longest < 1 {
		return nil, fmt.Errorf("case %s has no context to bisect", c.Name)
	}
	res := &BisectResult{Mode: "context", Backend: be.Name()}
	bad := func(n int) (bool, error) {
		cc := c
		cc.SeqLens = make([]int, len(seq))
		for i := range cc.SeqLens {
			cc.SeqLens[i] = n
		}
		capt, err := shrink.Run(ctx, cc, be)
		v := check.Error
		if err == nil {
			v = check.Run(capt, opts).Verdict
		} else if ctx.Err() != nil {
			return false, ctx.Err()
		}
		res.Probes = append(res.Probes, Probe{N: n, Verdict: v})
		return v == check.Fail || v == check.Error, nil
	}
	n, err := search(1, longest, bad)
	if err != nil {
		return nil, err
	}
	if n > longest {
		res.Verdict = check.Pass
		res.Reason = fmt.Sprintf("the case passes with every request at its longest context, %d", longest)
		return res, nil
	}
	res.Verdict, res.FirstContextLen = "fail", &n
	res.Reason = fmt.Sprintf("context %d fails, %d passes (%d probes)", n, n-1, len(res.Probes))
	if n == 1 {
		res.Reason = fmt.Sprintf("even a context of 1 fails (%d probes)", len(res.Probes))
	}
	return res, nil
}
