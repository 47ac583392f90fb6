package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/kcheck-dev/kcheck/internal/evidence"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/backend"
	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/engines"
	"github.com/kcheck-dev/kcheck/internal/faults"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/printable"
	"github.com/kcheck-dev/kcheck/internal/progress"
	"github.com/kcheck-dev/kcheck/internal/report"
	"github.com/kcheck-dev/kcheck/internal/safetensors"
	"github.com/kcheck-dev/kcheck/internal/suggest"
)

func init() { extraCommands = append(extraCommands, newRunCmd, newCasesCmd) }

type runOptions struct {
	io        *IO
	names     []string
	match     string
	casesFile string
	backend   string
	sanitize  bool
	shard     string
	json      bool
	bisect    bool
	long      bool
	outDir    string
	force     bool
	timeout   time.Duration
	worstK    int
	quiet     bool
	report    string
	bounds    bounds // --max-memory (signals.go)
}

func newRunCmd(s *IO) *cobra.Command {
	o := &runOptions{io: s}
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run catalog cases on a backend and check the outputs",
		Long: `run builds each selected case's inputs (deterministically from its seed), runs
the kernel on the backend, and checks the outputs exactly as 'check' checks a
capture. --shard I/N runs a deterministic slice of the selection (cases sorted
by name, every N-th from the I-th), for a Slurm job array or a Kubernetes
indexed Job; 'kcheck merge' combines the JSON results.`,
		Example: `  kcheck run --case mla_decode/deepseek-v3/tp8/bf16/p64/ctx-P+1
  kcheck run --match 'nvfp4_*' --backend faulty:nibble_order
  kcheck run --backend cuda --shard 3/16 --json > shard-3.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return o.run(cmd.Context()) },
	}
	f := cmd.Flags()
	f.StringArrayVar(&o.names, "case", nil, "case name (repeatable)")
	f.StringVar(&o.match, "match", "", "run the cases whose name matches this glob (* matches any characters)")
	f.StringVar(&o.casesFile, "cases", "", "read cases from this file instead of the built-in catalog (at most 32 MiB, read within a minute)")
	f.StringVar(&o.backend, "backend", "reference", "reference, cuda, faulty:NAME (see 'kcheck faults'), worker:NAME (the Python package's engine workers) or exec:'CMD ...' (any program that speaks the worker protocol, reference/CONTRACTS.md)")
	f.BoolVar(&o.sanitize, "sanitize", false, "run the cuda worker under compute-sanitizer memcheck (same as --backend cuda:sanitize)")
	f.StringVar(&o.shard, "shard", "", "run slice I of N (I/N, 0-based)")
	f.BoolVar(&o.json, "json", false, "print one JSON object per case")
	f.BoolVar(&o.bisect, "bisect", false, "exit 125 (git bisect skip) for inconclusive results and unusable input")
	f.BoolVar(&o.long, "long", false, "include cases tagged long (contexts up to 128K)")
	f.StringVar(&o.outDir, "out", "", "write each case's capture (inputs and backend outputs) into this directory")
	f.BoolVar(&o.force, "force", false, "overwrite existing files in --out and --report")
	f.DurationVar(&o.timeout, "timeout", 2*time.Minute, "per-case time limit")
	f.IntVar(&o.worstK, "worst", 5, "how many worst elements to list per output")
	f.BoolVarP(&o.quiet, "quiet", "q", false, "print only the verdict line of each case (and show no progress bar)")
	addReportFlag(f, &o.report)
	addMemoryFlag(f, &o.bounds)
	return cmd
}

// loadCases reads the catalog or a user file (within cases.MaxFileSize and
// cases.ReadTimeout, and until ctx is done).
func loadCases(ctx context.Context, file string) ([]cases.Case, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	if file != "" {
		return cases.LoadContext(ctx, file)
	}
	return cases.Catalog()
}

// caseHint is what follows "no case named NAME": the case it probably
// meant, or else the cases of its kernel family (the name's first part, or
// the family nearest to it), since a user who mistypes the rest of a case
// name has usually got the family right; listed whole when there are few,
// otherwise the `kcheck cases --match` that lists them (with --long: the
// names known include the long cases).
func caseHint(name string, known []string) string {
	if s := suggest.DidYouMean(name, known); s != "" {
		return s
	}
	family, _, _ := strings.Cut(name, "/")
	var families []string
	members := map[string][]string{}
	for _, k := range known {
		f, _, _ := strings.Cut(k, "/")
		if members[f] == nil {
			families = append(families, f)
		}
		members[f] = append(members[f], k)
	}
	if members[family] == nil {
		family = suggest.Closest(family, families)
	}
	const listed = 12
	switch m := members[family]; {
	case len(m) == 0:
		return " ('kcheck cases' lists them)"
	case len(m) <= listed:
		return fmt.Sprintf("; the %d %s cases are %s", len(m), family, strings.Join(m, ", "))
	default:
		return fmt.Sprintf("; there are %d %s cases: kcheck cases --long --match '%s/*' lists them", len(m), family, family)
	}
}

// selectCases picks cases by exact name, glob, and the long tag.
func selectCases(all []cases.Case, names []string, match string, long bool) ([]cases.Case, error) {
	if len(names) > 0 {
		byName := map[string]cases.Case{}
		known := make([]string, 0, len(all))
		for _, c := range all {
			byName[c.Name] = c
			known = append(known, c.Name)
		}
		var out []cases.Case
		for _, n := range names {
			c, ok := byName[n]
			if !ok {
				return nil, fmt.Errorf("no case named %q%s", n, caseHint(n, known))
			}
			out = append(out, c)
		}
		return out, nil
	}
	var out []cases.Case
	for _, c := range all {
		if match != "" && !globMatch(match, c.Name) {
			continue
		}
		if c.HasTag("long") && !long {
			continue
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no case matches (match %q, long %v)", match, long)
	}
	return out, nil
}

// globMatch matches name against a pattern whose * stands for any run of
// characters, slashes included (case names are paths of their axes).
func globMatch(pattern, name string) bool {
	parts := strings.Split(pattern, "*")
	if len(parts) == 1 {
		return pattern == name
	}
	if !strings.HasPrefix(name, parts[0]) {
		return false
	}
	name = name[len(parts[0]):]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(name, p)
		if i < 0 {
			return false
		}
		name = name[i+len(p):]
	}
	return strings.HasSuffix(name, parts[len(parts)-1])
}

// parseShard reads "I/N".
func parseShard(s string) (i, n int, err error) {
	if s == "" {
		return 0, 1, nil
	}
	a, b, ok := strings.Cut(s, "/")
	i, err1 := strconv.Atoi(a)
	n, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || n < 1 || i < 0 || i >= n {
		return 0, 0, fmt.Errorf("--shard %q: want I/N with 0 <= I < N", s)
	}
	return i, n, nil
}

// shardOf returns every n-th case starting at i (cases are sorted by name,
// so every shard of every machine agrees).
func shardOf(cs []cases.Case, i, n int) []cases.Case {
	var out []cases.Case
	for j := i; j < len(cs); j += n {
		out = append(out, cs[j])
	}
	return out
}

func (o *runOptions) run(ctx context.Context) error {
	if ctx == nil {
		ctx = context.Background()
	}
	all, err := loadCases(ctx, o.casesFile)
	if err != nil {
		return exitWith(o.io, ExitUsage, o.bisect, err)
	}
	sel, err := selectCases(all, o.names, o.match, o.long)
	if err != nil {
		return exitWith(o.io, ExitUsage, o.bisect, err)
	}
	si, sn, err := parseShard(o.shard)
	if err != nil {
		return exitWith(o.io, ExitUsage, o.bisect, err)
	}
	if o.outDir != "" {
		// Over the whole selection, so that every shard refuses alike.
		if err := captureCollisions(sel); err != nil {
			return exitWith(o.io, ExitUsage, o.bisect, err)
		}
	}
	sel = shardOf(sel, si, sn)
	spec, err := sanitized(o.backend, o.sanitize)
	if err != nil {
		return exitWith(o.io, ExitUsage, o.bisect, err)
	}
	be, err := backend.Parse(spec)
	if err != nil {
		return exitWith(o.io, ExitUsage, o.bisect, err)
	}
	sink, err := newReportSink(o.report, o.force)
	if err != nil {
		return exitWith(o.io, ExitUsage, o.bisect, err)
	}
	code := ExitPass
	enc := json.NewEncoder(o.io.Out)
	opts := sink.options(check.Options{WorstK: o.worstK, Engine: engines.Layout})
	if opts.MaxMemory, err = o.bounds.limit(); err != nil {
		return exitWith(o.io, ExitUsage, o.bisect, err)
	}
	if o.outDir != "" {
		if err := os.MkdirAll(o.outDir, 0o755); err != nil {
			return exitWith(o.io, ExitUsage, o.bisect, fmt.Errorf("--out: %v", err))
		}
		removeStaleTemps(o.io, o.outDir)
	}
	bar := progress.New(len(sel), o.io.Err, o.quiet)
	done := &progressLog{total: len(sel)}
	verdicts := newTally()
	ctx = kernel.WithMemo(ctx, kernel.NewMemo(memoBudget(opts.MaxMemory)))
	next := runAhead(ctx, sel, caseJobs(be, o.outDir), func(c cases.Case) check.Result {
		return RunCase(ctx, c, be, opts, o.timeout, o.outDir, o.force)
	})
	for _, c := range sel {
		bar.Describe(printable.Escape(c.Name))
		res := next()
		if ctx.Err() != nil { // this case did not finish
			bar.Clear()
			return done.interrupted(o.io, reportNote(o.report))
		}
		done.add(c.Name, res.Verdict)
		verdicts.add(res.Verdict)
		var evidence []string
		if o.outDir != "" && res.Verdict != check.Error {
			evidence = append(evidence, captureFile(o.outDir, c.Name))
		}
		sink.add(ctx, res, runReproduce(o, c.Name), evidence...)
		bar.Clear() // results go to stdout; the bar must not be drawn into them
		if o.json {
			if err := enc.Encode(res); err != nil {
				return err
			}
		} else {
			report.Text(o.io.Out, res, report.TextOptions{Quiet: o.quiet})
		}
		code = worseExit(code, exitForVerdict(res.Verdict, o.bisect))
		bar.Add(1)
	}
	bar.Finish()
	verdicts.print(o.io, o.json)
	if err := sink.write(o.io); err != nil {
		fmt.Fprintln(o.io.Err, "kcheck: --report:", printable.Escape(err.Error()))
		code = worseExit(code, ExitUsage)
	}
	return exitCode(code)
}

// memoBudget is the most kcheck run keeps of the inputs its cases share
// (kernel.Memo): 256 MiB, and no more than an eighth of the memory bound,
// beside which it is held (maxMemory 0: no bound).
func memoBudget(maxMemory int64) int64 {
	b := int64(256 << 20)
	if maxMemory > 0 {
		b = min(b, maxMemory/8)
	}
	return b
}

// caseJobs is how many cases kcheck run runs at once on be: one a core,
// at most two (two keep both cores of a small machine busy through a
// case's serial parts, its input generation above all, and hold at most
// twice one case's memory, each charged against the bound), where be runs
// in this process (backend.Concurrent); one for a device or a worker
// process, and one where captures are kept (outDir): a case writes its
// capture as it runs, and one run ahead of a case the user interrupts
// would leave evidence the run never reported.
func caseJobs(be backend.Backend, outDir string) int {
	if !backend.Concurrent(be) || outDir != "" {
		return 1
	}
	return min(runtime.GOMAXPROCS(0), 2)
}

// runAhead runs run on the cases, up to jobs at once in their order, and
// returns the function that gives their results in that order, waiting for
// each: the output is the serial run's, whatever finishes first. Once ctx
// is done no case starts; a case running finishes early under ctx.
func runAhead(ctx context.Context, sel []cases.Case, jobs int, run func(cases.Case) check.Result) func() check.Result {
	results := make([]chan check.Result, len(sel))
	for i := range results {
		results[i] = make(chan check.Result, 1)
	}
	slots := make(chan struct{}, max(jobs, 1))
	go func() {
		for i, c := range sel {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				// the reader stops at ctx too; these answer a read anyway
				for _, r := range results[i:] {
					r <- check.Result{Verdict: check.Error}
				}
				return
			}
			go func() {
				defer func() { <-slots }()
				results[i] <- run(c)
			}()
		}
	}()
	i := 0
	return func() check.Result {
		r := <-results[i]
		i++
		return r
	}
}

// removeStaleTemps removes, and names on stderr, the temporary files that
// killed writers left in dir (safetensors.RemoveStaleTemps).
func removeStaleTemps(s *IO, dir string) {
	removed, _ := safetensors.RemoveStaleTemps(dir)
	if len(removed) > 0 {
		names := make([]string, len(removed))
		for i, p := range removed {
			names[i] = printable.Escape(filepath.Base(p))
		}
		fmt.Fprintf(s.Err, "kcheck: removed %d temporary file(s) that a killed kcheck left in %s: %s\n", len(removed), printable.Escape(dir), strings.Join(names, ", "))
	}
}

// RunCase builds a case, runs it on be and checks the outputs; the
// capture is written to outDir when it is set.
//
// The case is refused before anything is built when its estimated memory
// exceeds opts.MaxMemory, and its estimate is charged against that bound
// while its inputs are built and the backend runs (check.Charged), as the
// check's own is while the reference check after the backend runs, with
// the same timeout as the backend.
func RunCase(ctx context.Context, c cases.Case, be backend.Backend, opts check.Options, timeout time.Duration, outDir string, force bool) check.Result {
	errResult := func(err error) check.Result {
		msg := err.Error()
		return check.Result{File: c.Name, Kernel: c.Kernel, Verdict: check.Error, Error: &msg, Checks: []compare.Check{}}
	}
	if err := check.CheckCaseMemory(c.Sizes(), opts.MaxMemory); err != nil {
		return errResult(err)
	}
	if fb, ok := be.(faults.Backend); ok {
		// a planted fault that cannot fire here would pass, and the pass
		// would be taken for a proof: refuse the case instead
		be = faults.Proving{Backend: fb}
	}
	type captured struct {
		c   evidence.Capture
		err error
	}
	gctx, cancel := fileContext(ctx, timeout)
	r, err := check.Charged(gctx, check.EstimateCase(c.Sizes()).Bytes, opts.MaxMemory, func() captured {
		capt, err := Capture(gctx, c, be, 0)
		return captured{capt, err}
	})
	if err != nil {
		err = fmt.Errorf("not started: %v", err)
	}
	cancel()
	if err == nil {
		err = r.err
	}
	if err != nil {
		return errResult(err)
	}
	capture := r.c
	if outDir != "" {
		file := captureFile(outDir, c.Name)
		writeMu.Lock() // an interrupt waits for this write (signals.go)
		if err = ctx.Err(); err == nil {
			err = safetensors.Write(file, capture.Metadata, capture.Tensors, safetensors.WriteOptions{Force: force})
		}
		writeMu.Unlock()
		if err != nil {
			return errResult(err)
		}
		capture.Name = file
	}
	cctx, cancel := fileContext(ctx, timeout)
	defer cancel()
	res := check.Run(cctx, capture, opts)
	res.File = c.Name
	return res
}

// Capture builds c's inputs, runs be on them, and returns inputs and outputs
// together as an evidence capture.
func Capture(ctx context.Context, c cases.Case, be backend.Backend, timeout time.Duration) (evidence.Capture, error) {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	started := time.Now()
	capt, err := backend.RunCase(ctx, be, c)
	if err != nil && ctx.Err() != nil { // whatever the inputs or the backend made of it
		err = stoppedError(ctx, started)
	}
	return capt, err
}

func newCasesCmd(s *IO) *cobra.Command {
	var file, match string
	var asJSON, long bool
	cmd := &cobra.Command{
		Use:   "cases",
		Short: "List the case catalog",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			all, err := loadCases(cmd.Context(), file)
			if err != nil {
				return exitWith(s, ExitUsage, false, err)
			}
			sel, err := selectCases(all, nil, match, true)
			if err != nil {
				return exitWith(s, ExitUsage, false, err)
			}
			if asJSON {
				return json.NewEncoder(s.Out).Encode(sel)
			}
			for _, c := range sel {
				if c.HasTag("long") && !long {
					continue
				}
				tags := ""
				if len(c.Tags) > 0 {
					tags = "  [" + strings.Join(c.Tags, ",") + "]"
				}
				fmt.Fprintf(s.Out, "%s%s\n", printable.Escape(c.Name), printable.Escape(tags))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&file, "cases", "", "list this case file instead of the built-in catalog")
	cmd.Flags().StringVar(&match, "match", "", "only names matching this glob")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the cases as a JSON array")
	cmd.Flags().BoolVar(&long, "long", false, "include cases tagged long")
	return cmd
}

// sanitized adds the cuda backend's sanitize option for --sanitize; only
// the cuda worker has a memory checker to run under.
func sanitized(spec string, sanitize bool) (string, error) {
	if !sanitize {
		return spec, nil
	}
	switch {
	case spec == "cuda":
		return "cuda:sanitize", nil
	case strings.HasPrefix(spec, "cuda:"):
		return spec + ",sanitize", nil
	}
	return "", fmt.Errorf("--sanitize needs --backend cuda (got %q)", spec)
}
