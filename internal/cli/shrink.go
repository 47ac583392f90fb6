package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kcheck-dev/kcheck/internal/backend"
	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/printable"
	"github.com/kcheck-dev/kcheck/internal/safetensors"
	"github.com/kcheck-dev/kcheck/internal/shrink"
)

func init() { extraCommands = append(extraCommands, newShrinkCmd) }

type shrinkOptions struct {
	io        *IO
	caseName  string
	casesFile string
	backend   string
	out       string
	force     bool
	json      bool
	maxTries  int
	set       []string
	from      string
	timeout   time.Duration
	files     []string
	bounds    bounds // --max-memory (signals.go)
}

func newShrinkCmd(s *IO) *cobra.Command {
	o := &shrinkOptions{io: s}
	cmd := &cobra.Command{
		Use:   "shrink FILE | --case NAME --backend B",
		Short: "Shrink a failing case or capture to a minimal evidence file that fails the same way",
		Long: `shrink makes failing evidence small enough to attach to a bug report, keeping
its signature (the first failing output, and the error pattern kcheck names in
it).

With --case it shrinks a catalog case run on --backend by greedy delta
debugging over the case's fields: fewer requests, shorter contexts, fewer heads,
splits, s_q and top-k, a narrower latent, smaller M, N and K, smaller pages.

With a capture FILE (the engine's own tensors, which cannot be re-run at another
size) it keeps a subset of the requests, heads, rows or tokens, with the cache
blocks they use, checked against the captured outputs themselves.

The result is written as a safetensors evidence file (-o; refused if it exists
unless --force), and the sizes before and after are printed.`,
		Example: `  kcheck shrink --case mla_decode/deepseek-v3/tp8/bf16/p64/ctx-P+1 --backend faulty:page_tail_attended -o tail.safetensors
  kcheck shrink capture.safetensors -o capture.min.safetensors`,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.files = args
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			return o.run(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.caseName, "case", "", "shrink this catalog case (run on --backend)")
	f.StringVar(&o.casesFile, "cases", "", "read --case from this case file instead of the built-in catalog")
	f.StringVar(&o.backend, "backend", "", "the backend the case fails on: cuda or faulty:NAME")
	f.StringVarP(&o.out, "out", "o", "", "evidence file to write (default: NAME.shrunk.safetensors in the current directory)")
	f.BoolVar(&o.force, "force", false, "overwrite the output file")
	f.BoolVar(&o.json, "json", false, "print the result as JSON")
	f.IntVar(&o.maxTries, "max-tries", 300, "bound on the candidate configurations checked")
	f.StringArrayVar(&o.set, "set", nil, "add or override a metadata key of the capture (KEY=VALUE)")
	f.StringVar(&o.from, "from", "", "capture conventions of an engine: vllm, sglang, flashinfer or flashmla")
	f.DurationVar(&o.timeout, "timeout", 30*time.Minute, "time limit")
	addMemoryFlag(f, &o.bounds)
	return cmd
}

func (o *shrinkOptions) run(ctx context.Context) error {
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	opts, err := checkOpts("three-way", o.from, 5)
	if err != nil {
		return exitWith(o.io, ExitUsage, false, err)
	}
	if opts.MaxMemory, err = o.bounds.limit(); err != nil {
		return exitWith(o.io, ExitUsage, false, err)
	}
	sopts := shrink.Options{Check: opts, MaxTries: o.maxTries}
	var res *shrink.Result
	var name string
	switch {
	case o.caseName != "" && len(o.files) > 0:
		return exitWith(o.io, ExitUsage, false, fmt.Errorf("give --case or a capture file, not both"))
	case o.caseName != "":
		if o.backend == "" {
			return exitWith(o.io, ExitUsage, false, fmt.Errorf("--case needs --backend (the backend the case fails on)"))
		}
		all, err := loadCases(ctx, o.casesFile)
		if err != nil {
			return exitWith(o.io, ExitUsage, false, err)
		}
		sel, err := selectCases(all, []string{o.caseName}, "", true)
		if err != nil {
			return exitWith(o.io, ExitUsage, false, err)
		}
		be, err := backend.Parse(o.backend)
		if err != nil {
			return exitWith(o.io, ExitUsage, false, err)
		}
		if f := plantedFault(be); f != nil {
			if err := f.Applies(sel[0].Kernel); err != nil {
				return exitWith(o.io, ExitUsage, false, err)
			}
		}
		if res, err = shrink.Case(ctx, sel[0], be, sopts); err != nil {
			return exitWith(o.io, ExitUsage, false, err)
		}
		name = strings.ReplaceAll(sel[0].Name, "/", "__")
	case len(o.files) == 1:
		if o.backend != "" {
			return exitWith(o.io, ExitUsage, false, fmt.Errorf("a capture is shrunk on its own outputs: --backend applies to --case"))
		}
		extra, err := parseSet(o.set)
		if err != nil {
			return exitWith(o.io, ExitUsage, false, err)
		}
		c, closeFn, err := check.LoadContext(ctx, o.files[0], extra, opts.MaxMemory)
		if err != nil {
			return exitWith(o.io, ExitUsage, false, err)
		}
		defer closeFn()
		// Shrinking reads the mapped capture outside the checks: guarded
		// as they are against the file shrinking meanwhile.
		if guardErr := check.Guard(c, func() { res, err = shrink.Capture(ctx, c, sopts) }); guardErr != nil {
			err = guardErr
		}
		if err != nil {
			return exitWith(o.io, ExitUsage, false, err)
		}
		name = strings.TrimSuffix(filepath.Base(o.files[0]), filepath.Ext(o.files[0]))
	default:
		return exitWith(o.io, ExitUsage, false, fmt.Errorf("give one capture file, or --case NAME --backend B"))
	}
	out := o.out
	if out == "" {
		out = name + ".shrunk.safetensors"
	}
	if _, err := os.Lstat(out); err == nil && !o.force {
		return exitWith(o.io, ExitUsage, false, fmt.Errorf("%s exists: refusing to overwrite it (use --force)", out))
	}
	removeStaleTemps(o.io, filepath.Dir(out))
	if err := safetensors.Write(out, res.Capture.Metadata, res.Capture.Tensors, safetensors.WriteOptions{Force: o.force}); err != nil {
		return exitWith(o.io, ExitUsage, false, err)
	}
	if o.json {
		return json.NewEncoder(o.io.Out).Encode(struct {
			File string `json:"file"`
			*shrink.Result
		}{out, res})
	}
	w := o.io.Out
	fmt.Fprintf(w, "wrote %s: %s -> %s (%.1f%% of the original), still %s\n", printable.Escape(out), human(res.Before), human(res.After),
		100*float64(res.After)/float64(max(res.Before, 1)), printable.Escape(fmt.Sprint(res.Fingerprint)))
	fmt.Fprintf(w, "  %d candidates checked, %d reductions kept\n", res.Tries, len(res.Steps))
	for _, s := range res.Steps {
		fmt.Fprintf(w, "    %s\n", printable.Escape(fmt.Sprint(s)))
	}
	if res.Case != nil {
		fmt.Fprintf(w, "  shrunk case: %s\n", printable.Escape(shrink.Describe(*res.Case)))
	}
	fmt.Fprintf(w, "  reproduce: kcheck check %s\n", printable.Escape(out))
	return nil
}

// human renders a byte count.
func human(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
