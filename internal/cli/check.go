package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/printable"
	"github.com/kcheck-dev/kcheck/internal/report"
)

type checkOptions struct {
	io     *IO
	json   bool
	bisect bool
	worstK int
	set    []string
	from   string
	policy string
	quiet  bool
	files  []string
	report string
	force  bool
	// resource bounds (signals.go)
	bounds  bounds
	timeout time.Duration
}

func newCheckCmd(s *IO) *cobra.Command {
	o := &checkOptions{io: s}
	cmd := &cobra.Command{
		Use:   "check FILE|DIR...",
		Short: "Check evidence files (.safetensors, .npy, .npz) against the references",
		Long: `check reads each evidence file, runs the reference kernel on its inputs, and
compares every captured output three-way: the exact float64 reference, the
reference at the kernel's declared precision (its noise floor), and the actual.
A pipeline capture (kcheck.kernel = pipeline) is checked stage by stage and the
first stage whose local error leaves its budget is named.`,
		Example: `  kcheck check fixtures/examples/nvfp4_dequant_ok.safetensors
  kcheck check --json fixtures/ | jq .verdict
  git bisect run kcheck check --bisect capture.safetensors`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.files = args
			return o.run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.BoolVar(&o.json, "json", false, "print one JSON object per file on stdout")
	f.BoolVar(&o.bisect, "bisect", false, "exit 125 (git bisect skip) for inconclusive results and unusable input")
	f.IntVar(&o.worstK, "worst", 5, "how many worst elements to list per output")
	f.StringArrayVar(&o.set, "set", nil, "add or override a metadata key (KEY=VALUE); needed for .npy/.npz files, which carry none (kcheck.kernel=NAME and the kernel's parameters; kcheck.dtype.ARRAY=BF16 says what an array of bf16 or fp8 bits holds where its contract does not)")
	f.StringVar(&o.from, "from", "", "apply an engine's conventions: vllm, sglang, flashinfer or flashmla")
	f.StringVar(&o.policy, "policy", "three-way", "tolerance policy: three-way or unit-roundoff")
	f.BoolVarP(&o.quiet, "quiet", "q", false, "print only the verdict line of each file")
	addReportFlag(f, &o.report)
	f.BoolVar(&o.force, "force", false, "overwrite existing files in --report")
	addMemoryFlag(f, &o.bounds)
	f.DurationVar(&o.timeout, "timeout", 10*time.Minute, "per-file time limit for the reference (0: none); a file over it gets verdict error")
	return cmd
}

func parseSet(set []string) (map[string]string, error) {
	m := map[string]string{}
	for _, kv := range set {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--set %q: want KEY=VALUE", kv)
		}
		m[k] = v
	}
	return m, nil
}

func (o *checkOptions) run(ctx context.Context) error {
	if ctx == nil {
		ctx = context.Background()
	}
	extra, err := parseSet(o.set)
	if err != nil {
		return exitWith(o.io, ExitUsage, o.bisect, err)
	}
	opts, err := checkOpts(o.policy, o.from, o.worstK)
	if err != nil {
		return exitWith(o.io, ExitUsage, o.bisect, err)
	}
	files, err := expand(o.io, o.files)
	if err != nil {
		return exitWith(o.io, ExitUsage, o.bisect, err)
	}
	sink, err := newReportSink(o.report, o.force)
	if err != nil {
		return exitWith(o.io, ExitUsage, o.bisect, err)
	}
	opts = sink.options(opts)
	if opts.MaxMemory, err = o.bounds.limit(); err != nil {
		return exitWith(o.io, ExitUsage, o.bisect, err)
	}
	code := ExitPass
	enc := json.NewEncoder(o.io.Out)
	progress := &progressLog{total: len(files)}
	verdicts := newTally()
	for _, path := range files {
		if ctx.Err() != nil {
			return progress.interrupted(o.io, reportNote(o.report))
		}
		fctx, cancel := fileContext(ctx, o.timeout)
		res := check.File(fctx, path, extra, opts)
		cancel()
		if ctx.Err() != nil { // this file did not finish
			return progress.interrupted(o.io, reportNote(o.report))
		}
		progress.add(path, res.Verdict)
		verdicts.add(res.Verdict)
		sink.add(ctx, res, checkReproduce(o, path), path)
		if o.json {
			if err := enc.Encode(res); err != nil {
				return err
			}
		} else {
			report.Text(o.io.Out, res, report.TextOptions{Quiet: o.quiet})
		}
		code = worseExit(code, exitForVerdict(res.Verdict, o.bisect))
	}
	verdicts.print(o.io, o.json)
	if err := sink.write(o.io); err != nil {
		fmt.Fprintln(o.io.Err, "kcheck: --report:", printable.Escape(err.Error()))
		code = worseExit(code, ExitUsage)
	}
	return exitCode(code)
}

// exitWith reports err on stderr and exits with code (mapped for --bisect).
func exitWith(s *IO, code ExitCode, bisect bool, err error) error {
	fmt.Fprintln(s.Err, "kcheck:", printable.Escape(err.Error()))
	if bisect && (code == ExitUsage || code == ExitInconclusive) {
		code = ExitSkip
	}
	return exitError{code}
}

// expand is check.Expand printing its notes (what a directory walk
// skipped) on stderr.
func expand(s *IO, args []string) ([]string, error) {
	files, notes, err := check.Expand(args)
	for _, n := range notes {
		fmt.Fprintln(s.Err, "kcheck: note:", printable.Escape(n))
	}
	return files, err
}
