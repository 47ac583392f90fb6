package sim

import (
	"context"
	"fmt"
	"math"

	"github.com/kcheck-dev/kcheck/internal/backend"
	"github.com/kcheck-dev/kcheck/internal/bisect"
	"github.com/kcheck-dev/kcheck/internal/check"
)

// BisectSteps finds the first decode step whose error leaves the floor by
// binary search on the number of steps run: a run of n steps is the prefix
// of the full run, so "some step of the first n is off the floor" is
// monotone in n. base is the full run's baseline (nil: computed).
func (s *Sim) BisectSteps(ctx context.Context, be backend.Backend, base *Baseline, th Thresholds) (*bisect.Result, error) {
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
	res := &bisect.Result{Mode: "steps", Backend: be.Name()}
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
		res.Probes = append(res.Probes, bisect.Probe{N: n, Verdict: v})
		return off, nil
	}
	n, err := bisect.Search(1, total, bad)
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
