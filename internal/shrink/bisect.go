package shrink

import (
	"context"
	"fmt"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/backend"
	"github.com/kcheck-dev/kcheck/internal/bisect"
	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/kernel"
)

// BisectContext finds the shortest context at which a case fails on be, by
// binary search on a context length given to every request (1 to the
// case's longest). It assumes a bug that shows at some context shows at
// every longer one; where it does not (a fault that fires only on partial
// pages), the result is a failing length whose predecessor passes, not
// necessarily the shortest.
func BisectContext(ctx context.Context, c cases.Case, be backend.Backend, opts check.Options) (*bisect.Result, error) {
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
	res := &bisect.Result{Mode: "context", Backend: be.Name()}
	bad := func(n int) (bool, error) {
		cc := c
		cc.SeqLens = make([]int, len(seq))
		for i := range cc.SeqLens {
			cc.SeqLens[i] = n
		}
		capt, err := Run(ctx, cc, be)
		v := check.Error
		if err == nil {
			v = check.Run(ctx, capt, opts).Verdict
		}
		if ctx.Err() != nil { // the probe did not finish: no verdict of the case's
			return false, ctx.Err()
		}
		res.Probes = append(res.Probes, bisect.Probe{N: n, Verdict: v})
		return v == check.Fail || v == check.Error, nil
	}
	n, err := bisect.Search(1, longest, bad)
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
