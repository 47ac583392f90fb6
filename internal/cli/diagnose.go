package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kcheck-dev/kcheck/internal/backend"
	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/diagnose"
	"github.com/kcheck-dev/kcheck/internal/faults"
	"github.com/kcheck-dev/kcheck/internal/printable"
	"github.com/kcheck-dev/kcheck/internal/report"
	"github.com/kcheck-dev/kcheck/internal/sim"
)

func init() { extraCommands = append(extraCommands, newDiagnoseCmd) }

type diagnoseOptions struct {
	io       *IO
	simulate bool
	backend  string
	json     bool
	bisect   bool
	quick    bool
	free     bool
	set      []string
	from     string
	policy   string
	worstK   int
	timeout  time.Duration
	sim      sim.Config
	files    []string
	report   string
	force    bool
	bounds   bounds // --max-memory (signals.go)
}

// simFlags are the simulation's settings by flag name; sim.Config.Set reads
// the same names, so a fault's Simulate settings are these flags.
func addSimFlags(f *pflag.FlagSet, c *sim.Config) {
	d := sim.DefaultConfig()
	*c = d
	f.StringVar(&c.Preset, "preset", d.Preset, "model preset (deepseek-v3, kimi-k2, glm-5)")
	f.IntVar(&c.TP, "tp", d.TP, "tensor parallelism: the heads one GPU holds are the preset's divided by it")
	f.IntVar(&c.Prompts, "prompts", d.Prompts, "consecutive prompts (each frees its pages for the next)")
	f.IntVar(&c.Steps, "steps", d.Steps, "decode steps per prompt")
	f.IntVar(&c.Batch, "batch", d.Batch, "requests decoded together (padded to a CUDA-graph size)")
	f.IntVar(&c.Prefill, "prefill", d.Prefill, "prompt length of request 0 (request b: +3b)")
	f.IntVar(&c.PageSize, "page-size", d.PageSize, "tokens per cache page")
	f.IntVar(&c.Splits, "splits", d.Splits, "split-K splits of the decode")
	f.IntVar(&c.SQ, "s-q", d.SQ, "query tokens per request and step (2+: multi-token prediction, causal)")
	f.StringVar(&c.KVCacheDType, "kv-cache-dtype", d.KVCacheDType, "bf16, fp8_e4m3 or fp8_ds_mla")
	f.StringVar(&c.ScaleLayout, "scale-layout", d.ScaleLayout, "NVFP4 block-scale layout: linear or swizzled_128x4")
	f.IntVar(&c.Hidden, "hidden", d.Hidden, "hidden width the NVFP4 projection reads (multiple of 16)")
	f.Float64Var(&c.ActCalib, "act-calib", d.ActCalib, "static activation calibration amax, as a multiple of the first prompt's")
	f.Uint64Var(&c.Seed, "seed", d.Seed, "seed of the weights, tokens and block tables")
}

func newDiagnoseCmd(s *IO) *cobra.Command {
	o := &diagnoseOptions{io: s}
	cmd := &cobra.Command{
		Use:   "diagnose [FILE...] | --simulate",
		Short: "Name the culprit stage: of a pipeline capture, or of a backend in a simulated decoder",
		Long: `diagnose answers "is it the quantization, the cache, the attention or the split-K
reduction?".

On a capture it checks every stage twice, on its own captured inputs (local) and
against the reference chain run from the first stage (propagated), and names the
first stage whose local error leaves its budget, with its worst elements and
error signature.

With --simulate it runs a small MLA decoder (the preset's heads after TP, L = 512,
R = 64, NVFP4 projections, a paged cache whose pages are recycled between
prompts, split-K decode and combine) on the backend, side by side with the
reference at kernel precision and with the exact chain (the noise floor),
records the error of the attention output per step, and swaps each stage for
its reference to find the one whose swap removes the drift.

Exit status: 0 pass, 1 fail, 2 unusable input or usage, 3 inconclusive; with
--bisect, 2 and 3 exit 125.`,
		Example: `  kcheck diagnose fixtures/examples/pipeline_quant_nibble_order.safetensors
  kcheck diagnose --simulate --preset deepseek-v3 --tp 8 --backend faulty:stale_pages --prompts 3 --steps 12
  kcheck diagnose --simulate --backend cuda --kv-cache-dtype fp8_ds_mla --json | jq .stage`,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.files = args
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			return o.run(ctx, cmd.Flags())
		},
	}
	f := cmd.Flags()
	f.BoolVar(&o.simulate, "simulate", false, "run the simulated decoder instead of reading captures")
	f.StringVar(&o.backend, "backend", "reference", "the simulation's backend: reference, cuda or faulty:NAME")
	f.BoolVar(&o.json, "json", false, "print one JSON object per diagnosis")
	f.BoolVar(&o.bisect, "bisect", false, "exit 125 (git bisect skip) for inconclusive results and unusable input")
	f.BoolVar(&o.quick, "quick", false, "stop swapping at the first stage whose swap removes the drift")
	f.BoolVar(&o.free, "free-running", false, "let every chain choose its own tokens (default: teacher-forced with the reference's inputs)")
	f.StringArrayVar(&o.set, "set", nil, "KEY=VALUE: a metadata key of the capture, or a parameter of every simulated kernel")
	f.StringVar(&o.from, "from", "", "capture conventions of an engine: vllm, sglang, flashinfer or flashmla")
	f.StringVar(&o.policy, "policy", "three-way", "tolerance policy for captures: three-way or unit-roundoff")
	f.IntVar(&o.worstK, "worst", 5, "how many worst elements to list per output")
	f.DurationVar(&o.timeout, "timeout", 30*time.Minute, "time limit of the whole diagnosis")
	addSimFlags(f, &o.sim)
	addReportFlag(f, &o.report)
	f.BoolVar(&o.force, "force", false, "overwrite existing files in --report")
	addMemoryFlag(f, &o.bounds)
	return cmd
}

// simFlagNames are the flags that only make sense with --simulate.
var simFlagNames = []string{"preset", "tp", "prompts", "steps", "batch", "prefill", "page-size", "splits", "s-q",
	"kv-cache-dtype", "scale-layout", "hidden", "act-calib", "seed", "backend", "quick", "free-running"}

func (o *diagnoseOptions) run(ctx context.Context, flags *pflag.FlagSet) error {
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	sink, err := newReportSink(o.report, o.force)
	if err != nil {
		return exitWith(o.io, ExitUsage, o.bisect, err)
	}
	if o.sim.MaxMemory, err = o.bounds.limit(); err != nil {
		return exitWith(o.io, ExitUsage, o.bisect, err)
	}
	if !o.simulate {
		for _, n := range simFlagNames {
			if flags.Changed(n) {
				return exitWith(o.io, ExitUsage, o.bisect, fmt.Errorf("--%s needs --simulate", n))
			}
		}
		if len(o.files) == 0 {
			return exitWith(o.io, ExitUsage, o.bisect, fmt.Errorf("give capture files, or --simulate"))
		}
		code, err := o.captures(ctx, sink)
		if err != nil {
			return err
		}
		if err := sink.write(o.io); err != nil {
			return exitWith(o.io, ExitUsage, o.bisect, err)
		}
		return exitCode(code)
	}
	if len(o.files) > 0 {
		return exitWith(o.io, ExitUsage, o.bisect, fmt.Errorf("--simulate takes no files (got %v)", o.files))
	}
	for _, kv := range o.set {
		if err := o.sim.Set("set", kv); err != nil {
			return exitWith(o.io, ExitUsage, o.bisect, err)
		}
	}
	be, err := backend.Parse(o.backend)
	if err != nil {
		return exitWith(o.io, ExitUsage, o.bisect, err)
	}
	fault := plantedFault(be)
	if fault != nil {
		if err := fault.Simulated(sim.Kernels...); err != nil {
			return exitWith(o.io, ExitUsage, o.bisect, err)
		}
	}
	decoder, err := sim.New(o.sim)
	if err != nil {
		return exitWith(o.io, ExitUsage, o.bisect, err)
	}
	d, err := decoder.Diagnose(ctx, be, sim.DiagnoseOptions{Quick: o.quick, Free: o.free})
	switch {
	case err != nil && errors.Is(err, context.Canceled):
		fmt.Fprintln(o.io.Err, "kcheck: interrupted:", printable.Escape(err.Error()))
		return exitError{ExitInterrupted}
	case err != nil && errors.Is(err, context.DeadlineExceeded):
		return exitWith(o.io, ExitUsage, o.bisect, fmt.Errorf("%w (the time limit of the whole diagnosis; raise it with --timeout)", err))
	case err != nil:
		return exitWith(o.io, ExitUsage, o.bisect, err)
	}
	if fault != nil {
		// A planted bug that changed no step would pass, and the pass
		// would be taken for a proof.
		if err := fault.Showed(d.Changed()); err != nil {
			return exitWith(o.io, ExitUsage, o.bisect, err)
		}
	}
	rep := diagnose.FromSim(d)
	if err := o.emit(rep); err != nil {
		return err
	}
	if sink != nil {
		if sink.b.Diagnosis, err = report.DiagnosisFrom(rep); err != nil {
			return exitWith(o.io, ExitUsage, o.bisect, err)
		}
		if err := sink.write(o.io); err != nil {
			return exitWith(o.io, ExitUsage, o.bisect, err)
		}
	}
	return exitCode(exitForVerdict(rep.Verdict, o.bisect))
}

// captures diagnoses each capture file; the report sink (nil without
// --report) collects the checks behind each attribution.
func (o *diagnoseOptions) captures(ctx context.Context, sink *reportSink) (ExitCode, error) {
	extra, err := parseSet(o.set)
	if err != nil {
		return 0, exitWith(o.io, ExitUsage, o.bisect, err)
	}
	opts, err := checkOpts(o.policy, o.from, o.worstK)
	if err != nil {
		return 0, exitWith(o.io, ExitUsage, o.bisect, err)
	}
	opts = sink.options(opts)
	files, err := expand(o.io, o.files)
	if err != nil {
		return 0, exitWith(o.io, ExitUsage, o.bisect, err)
	}
	if opts.MaxMemory, err = o.bounds.limit(); err != nil {
		return 0, exitWith(o.io, ExitUsage, o.bisect, err)
	}
	code := ExitPass
	progress := &progressLog{total: len(files)}
	for _, path := range files {
		if ctx.Err() != nil && errors.Is(ctx.Err(), context.Canceled) {
			return 0, progress.interrupted(o.io, reportNote(o.report))
		}
		// --timeout bounds the whole diagnosis, loading each file included
		// (a named pipe with no writer), and --max-memory what it reads.
		var rep *diagnose.Report
		var lens map[int]int
		c, closeFn, err := check.LoadContext(ctx, path, extra, opts.MaxMemory)
		if err == nil {
			// read guarded, as the check is, against the file shrinking meanwhile
			if err = check.Guard(c, func() { lens = diagnose.ContextLens(c) }); err != nil {
				closeFn()
			}
		}
		if err != nil {
			if errors.Is(err, check.ErrTimeout) {
				err = fmt.Errorf("%w (the time limit of the whole diagnosis; raise it with --timeout)", err)
			}
			msg := err.Error()
			rep = &diagnose.Report{Mode: "capture", File: path, Verdict: check.Error, Error: &msg, Reason: msg, Steps: []sim.StepResult{}}
		} else {
			res := check.Run(ctx, c, opts)
			closeFn()
			rep = diagnose.FromCheck(res, lens)
			sink.add(ctx, res, "kcheck diagnose "+report.ShellQuote(path), path)
		}
		if ctx.Err() != nil && errors.Is(ctx.Err(), context.Canceled) { // this file did not finish
			return 0, progress.interrupted(o.io, reportNote(o.report))
		}
		progress.add(path, rep.Verdict)
		if err := o.emit(rep); err != nil {
			return 0, err
		}
		code = worseExit(code, exitForVerdict(rep.Verdict, o.bisect))
	}
	return code, nil
}

func (o *diagnoseOptions) emit(rep *diagnose.Report) error {
	if o.json {
		return json.NewEncoder(o.io.Out).Encode(rep)
	}
	rep.WriteText(o.io.Out)
	return nil
}

// plantedFault returns the fault a faulty:NAME backend plants (nil for any
// other backend).
func plantedFault(be backend.Backend) *faults.Fault {
	if fb, ok := be.(faults.Backend); ok {
		return fb.Fault
	}
	return nil
}

// exitCode turns a status into RunE's return.
func exitCode(c ExitCode) error {
	if c == ExitPass {
		return nil
	}
	return exitError{c}
}
