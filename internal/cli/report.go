package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/printable"
	"github.com/kcheck-dev/kcheck/internal/report"
)

func init() { extraCommands = append(extraCommands, newReportCmd) }

func newReportCmd(s *IO) *cobra.Command {
	var out string
	var force, noPlots bool
	var maxDetails int
	var in inputBounds
	cmd := &cobra.Command{
		Use:   "report FILE.json...",
		Short: "Render saved results as a bug report (Markdown, JSON and plots)",
		Long: `report re-renders saved results: the JSON lines 'check --json' and 'run --json'
print, the object 'diagnose --json' prints, or a report.json written by
--report. With --out DIR it writes DIR/report.md (Markdown ready to paste into
a GitHub issue), DIR/report.json and DIR/plots/*.png; without it, the Markdown
goes to stdout.

Results saved by --json keep the worst elements and the signature but not the
error of every element, so their plots show the signature's groups only; a
report.json written by --report keeps full error profiles.`,
		Example: `  kcheck check --json capture.safetensors > results.json
  kcheck report --out report results.json
  kcheck check --report report-full capture.safetensors    # the same in one step, with full profiles`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, limit, cancel, err := in.reading(cmd.Context())
			if err != nil {
				return exitWith(s, ExitUsage, false, err)
			}
			b, err := report.LoadContext(ctx, limit, args...)
			cancel()
			if err != nil {
				return exitWith(s, ExitUsage, false, err)
			}
			mo := report.MarkdownOptions{MaxDetails: maxDetails}
			if out == "" {
				if err := report.Markdown(s.Out, b, mo); err != nil {
					return err
				}
				return nil
			}
			files, err := report.WriteDir(out, b, report.WriteOptions{Force: force, NoPlots: noPlots, Markdown: mo})
			if err != nil {
				return exitWith(s, ExitUsage, false, err)
			}
			fmt.Fprintf(s.Err, "kcheck: wrote %d files; the report is %s\n", len(files), printable.Escape(filepath.Join(out, report.MarkdownFile)))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&out, "out", "o", "", "write report.md, report.json and plots/ into this directory (else Markdown on stdout)")
	f.BoolVar(&force, "force", false, "overwrite files that exist in --out")
	f.BoolVar(&noPlots, "no-plots", false, "write no PNG plots")
	f.IntVar(&maxDetails, "max-details", 10, "give at most this many results a detailed section")
	in.addFlags(f)
	return cmd
}

// reportSink collects the items of a --report run: each result with its
// error profiles (from a recorder observing the checks), the command that
// reproduces it and the hashes of its evidence files.
type reportSink struct {
	dir   string
	force bool
	rec   *report.Recorder
	b     report.Bundle
	err   error // the first evidence file that could not be hashed
}

// maxDetails is how many items a --report details (MarkdownOptions' default).
const maxDetails = 10

// addReportFlag registers --report DIR on a command.
func addReportFlag(f *pflag.FlagSet, dir *string) {
	f.StringVar(dir, "report", "", "also write a bug report into this directory: report.md, report.json, plots/*.png")
}

// newReportSink returns nil when dir is empty (no --report), and an error
// before any work is done when the report would overwrite files.
func newReportSink(dir string, force bool) (*reportSink, error) {
	if dir == "" {
		return nil, nil
	}
	if err := report.Preflight(dir, force); err != nil {
		return nil, fmt.Errorf("--report: %v", err)
	}
	return &reportSink{dir: dir, force: force, rec: report.NewRecorder(), b: report.NewBundle(commandLine())}, nil
}

// options makes the checker report every comparison to the sink.
func (r *reportSink) options(opts check.Options) check.Options {
	if r == nil {
		return opts
	}
	return r.rec.Options(opts)
}

// add records one result; evidence names the files behind it, hashed
// under ctx (an interrupt stops the hashing).
func (r *reportSink) add(ctx context.Context, res check.Result, reproduce string, evidence ...string) {
	if r == nil {
		return
	}
	// Passing items are detailed only while no more than maxDetails
	// have been seen (a report of all passes details the first ones).
	keep := res.Verdict != check.Pass || len(r.b.Items) < maxDetails
	it := report.Item{Result: res, Reproduce: reproduce, Profiles: r.rec.Take()}.Trimmed(keep)
	if len(evidence) > 0 {
		ev, err := report.HashFilesContext(ctx, evidence...)
		if err != nil && r.err == nil {
			r.err = err
		}
		it.Evidence = ev
	}
	r.b.Items = append(r.b.Items, it)
}

// write renders the report; a failure is unusable output (exit 2).
func (r *reportSink) write(s *IO) error {
	if r == nil {
		return nil
	}
	if r.err != nil {
		return r.err
	}
	files, err := report.WriteDir(r.dir, r.b, report.WriteOptions{Force: r.force})
	if err != nil {
		return err
	}
	fmt.Fprintf(s.Err, "kcheck: report written to %s (%d files)\n", printable.Escape(filepath.Join(r.dir, report.MarkdownFile)), len(files))
	return nil
}

// commandLine is this process's command line, for the report.
func commandLine() string {
	parts := make([]string, len(os.Args))
	for i, a := range os.Args {
		parts[i] = report.ShellQuote(a)
	}
	if len(parts) > 0 {
		parts[0] = "kcheck"
	}
	return strings.Join(parts, " ")
}

// checkReproduce is the command that re-checks one file with the same
// options.
func checkReproduce(o *checkOptions, path string) string {
	parts := []string{"kcheck", "check"}
	if o.from != "" {
		parts = append(parts, "--from", report.ShellQuote(o.from))
	}
	if o.policy != "" && o.policy != "three-way" {
		parts = append(parts, "--policy", report.ShellQuote(o.policy))
	}
	for _, kv := range o.set {
		parts = append(parts, "--set", report.ShellQuote(kv))
	}
	return strings.Join(append(parts, report.ShellQuote(path)), " ")
}

// runReproduce is the command that re-runs one case.
func runReproduce(o *runOptions, name string) string {
	parts := []string{"kcheck", "run", "--case", report.ShellQuote(name), "--backend", report.ShellQuote(o.backend)}
	if o.casesFile != "" {
		parts = append(parts, "--cases", report.ShellQuote(o.casesFile))
	}
	return strings.Join(parts, " ")
}

// captureFile is where --out writes a case's capture.
func captureFile(outDir, caseName string) string {
	return filepath.Join(outDir, strings.ReplaceAll(caseName, "/", "__")+".safetensors")
}

// captureCollisions refuses a selection in which two cases would write one
// capture file ("x/y" and "x__y" both give x__y.safetensors; a case selected
// twice gives its own file twice): the second would overwrite the first.
// Names are compared without case, as a case-insensitive file system (macOS,
// Windows, where captures are often copied) would.
func captureCollisions(sel []cases.Case) error {
	seen := map[string]string{}
	for _, c := range sel {
		file := captureFile("", c.Name)
		key := strings.ToLower(file)
		if prev, ok := seen[key]; ok {
			if prev == c.Name {
				return fmt.Errorf("case %q is selected twice: its capture would be written twice (--out)", c.Name)
			}
			return fmt.Errorf("cases %q and %q would both be captured to %s (--out): rename one", prev, c.Name, file)
		}
		seen[key] = c.Name
	}
	return nil
}
