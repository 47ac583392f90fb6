package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/kcheck-dev/kcheck/internal/backend"
	"github.com/kcheck-dev/kcheck/internal/bisect"
	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/printable"
	"github.com/kcheck-dev/kcheck/internal/shrink"
	"github.com/kcheck-dev/kcheck/internal/sim"
)

func init() { extraCommands = append(extraCommands, newBisectCmd) }

type bisectOptions struct {
	io        *IO
	simulate  bool
	caseName  string
	casesFile string
	backend   string
	json      bool
	set       []string
	timeout   time.Duration
	sim       sim.Config
	bounds    bounds // --max-memory (signals.go)
}

func newBisectCmd(s *IO) *cobra.Command {
	o := &bisectOptions{io: s}
	cmd := &cobra.Command{
		Use:   "bisect --simulate | --case NAME",
		Short: "Find the first decode step or context length where a backend leaves the noise floor",
		Long: `bisect finds, by binary search, where a backend's error first leaves the noise
floor:

  --simulate   on the number of decode steps of the simulated decoder (the
               settings of 'kcheck diagnose --simulate'): the first step, and
               its context length, whose error leaves the floor;
  --case NAME  on the context length of a catalog case (every request gets the
               same length, 1 up to the case's longest): the shortest context
               that fails. This assumes a bug that shows at some context shows
               at every longer one.

To bisect a kernel repository's history instead, see 'git bisect run' with
'kcheck run --bisect' in the README.

Exit status: 0 the backend stays on the floor, 1 a first bad point was found,
2 unusable input or usage.`,
		Example: `  kcheck bisect --simulate --backend faulty:stale_pages --prompts 3 --steps 12
  kcheck bisect --case kv_cache_gather/bf16/p16/ctx-3P --backend faulty:page_boundary_off_by_one`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			return o.run(ctx)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&o.simulate, "simulate", false, "bisect the simulated decoder's step count")
	f.StringVar(&o.caseName, "case", "", "bisect this catalog case's context length")
	f.StringVar(&o.casesFile, "cases", "", "read --case from this case file instead of the built-in catalog")
	f.StringVar(&o.backend, "backend", "reference", "reference, cuda, or faulty:NAME")
	f.BoolVar(&o.json, "json", false, "print the result as JSON")
	f.StringArrayVar(&o.set, "set", nil, "KEY=VALUE added to every simulated kernel's parameters")
	f.DurationVar(&o.timeout, "timeout", 30*time.Minute, "time limit")
	addSimFlags(f, &o.sim)
	addMemoryFlag(f, &o.bounds)
	return cmd
}

func (o *bisectOptions) run(ctx context.Context) error {
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	if o.simulate == (o.caseName != "") {
		return exitWith(o.io, ExitUsage, false, fmt.Errorf("give --simulate or --case NAME (one of them)"))
	}
	be, err := backend.Parse(o.backend)
	if err != nil {
		return exitWith(o.io, ExitUsage, false, err)
	}
	if o.sim.MaxMemory, err = o.bounds.limit(); err != nil {
		return exitWith(o.io, ExitUsage, false, err)
	}
	fault := plantedFault(be)
	var res *bisect.Result
	if fault != nil && o.simulate {
		if err := fault.Simulated(sim.Kernels...); err != nil {
			return exitWith(o.io, ExitUsage, false, err)
		}
	}
	if o.simulate {
		for _, kv := range o.set {
			if err := o.sim.Set("set", kv); err != nil {
				return exitWith(o.io, ExitUsage, false, err)
			}
		}
		decoder, err := sim.New(o.sim)
		if err != nil {
			return exitWith(o.io, ExitUsage, false, err)
		}
		if res, err = decoder.BisectSteps(ctx, be, nil, sim.DefaultThresholds()); err != nil {
			return o.searchFailed(err)
		}
	} else {
		all, err := loadCases(ctx, o.casesFile)
		if err != nil {
			return exitWith(o.io, ExitUsage, false, err)
		}
		sel, err := selectCases(all, []string{o.caseName}, "", true)
		if err != nil {
			return exitWith(o.io, ExitUsage, false, err)
		}
		if fault != nil {
			if err := fault.Applies(sel[0].Kernel); err != nil {
				return exitWith(o.io, ExitUsage, false, err)
			}
		}
		opts, err := checkOpts("three-way", "", 5)
		if err != nil {
			return exitWith(o.io, ExitUsage, false, err)
		}
		opts.MaxMemory = o.sim.MaxMemory
		if res, err = shrink.BisectContext(ctx, sel[0], be, opts); err != nil {
			return o.searchFailed(err)
		}
	}
	if o.json {
		if err := json.NewEncoder(o.io.Out).Encode(res); err != nil {
			return err
		}
	} else {
		w := o.io.Out
		fmt.Fprintf(w, "%-12s %s on %s: %s\n", map[compare.Verdict]string{compare.Pass: "ON FLOOR", compare.Fail: "FOUND"}[res.Verdict], printable.Escape(res.Mode), printable.Escape(res.Backend), printable.Escape(res.Reason))
		if res.FirstStep != nil {
			fmt.Fprintf(w, "  first step off the floor: %d\n", *res.FirstStep)
		}
		if res.FirstContextLen != nil {
			fmt.Fprintf(w, "  first context length: %d\n", *res.FirstContextLen)
		}
		for _, p := range res.Probes {
			fmt.Fprintf(w, "    probe %-8d %s\n", p.N, p.Verdict)
		}
	}
	return exitCode(exitForVerdict(res.Verdict, false))
}

// searchFailed is the exit of a search that stopped: an interrupt is 130,
// as every other command's (a script must not read it as unusable input),
// a search past --timeout says which limit it hit, anything else is
// unusable input.
func (o *bisectOptions) searchFailed(err error) error {
	switch {
	case errors.Is(err, context.Canceled):
		fmt.Fprintln(o.io.Err, "kcheck: interrupted:", printable.Escape(err.Error()))
		return exitError{ExitInterrupted}
	case errors.Is(err, context.DeadlineExceeded):
		return exitWith(o.io, ExitUsage, false, fmt.Errorf("%w (the time limit of the whole search; raise it with --timeout)", err))
	}
	return exitWith(o.io, ExitUsage, false, err)
}
