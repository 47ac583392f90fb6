// Package cli is kcheck's command line: one cobra command per verb, each an
// options struct with injected writers so tests drive it without a process,
// data on stdout and diagnostics on stderr, and one table of exit codes
// (reference/CONTRACTS.md §7.3).
package cli

import (
	"context"
	"errors"
	"fmt"
	_ "github.com/kcheck-dev/kcheck/internal/kernels/all" // every kernel registers itself
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/printable"
	"github.com/kcheck-dev/kcheck/internal/version"
)

// ExitCode is the process status, as reference/CONTRACTS.md §7.3 fixes it.
type ExitCode int

const (
	ExitPass         ExitCode = 0
	ExitFail         ExitCode = 1
	ExitUsage        ExitCode = 2 // unusable input or usage
	ExitInconclusive ExitCode = 3
	// ExitSkip is git bisect's "skip", used with --bisect for
	// inconclusive results and unusable input.
	ExitSkip ExitCode = 125
)

// exitForVerdict maps a verdict to the exit status.
func exitForVerdict(v compare.Verdict, bisect bool) ExitCode {
	var c ExitCode
	switch v {
	case compare.Pass:
		c = ExitPass
	case compare.Fail:
		c = ExitFail
	case compare.Inconclusive:
		c = ExitInconclusive
	default:
		c = ExitUsage
	}
	if bisect && (c == ExitInconclusive || c == ExitUsage) {
		return ExitSkip
	}
	return c
}

// worseExit combines the status of several files: fail dominates
// inconclusive, which dominates pass; unusable input dominates all but fail.
func worseExit(a, b ExitCode) ExitCode {
	rank := map[ExitCode]int{ExitPass: 0, ExitInconclusive: 1, ExitSkip: 2, ExitUsage: 2, ExitFail: 3}
	if rank[b] > rank[a] {
		return b
	}
	return a
}

// IO carries the process's streams.
type IO struct {
	In       io.Reader
	Out, Err io.Writer
}

// exitError carries an exit code out of a cobra RunE.
type exitError struct{ code ExitCode }

func (e exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

// Main runs kcheck with args and returns the exit status. SIGINT and
// SIGTERM interrupt it (signals.go).
func Main(args []string, in io.Reader, out, errw io.Writer) ExitCode {
	ctx, stop := notifyInterrupt(context.Background(), errw)
	defer stop()
	return MainContext(ctx, args, in, out, errw)
}

// MainContext is Main under ctx: canceling ctx interrupts the command as
// SIGINT does (tests inject it here).
func MainContext(ctx context.Context, args []string, in io.Reader, out, errw io.Writer) ExitCode {
	s := &IO{In: in, Out: out, Err: errw}
	root := newRoot(s)
	root.SetArgs(args)
	root.SetOut(out)
	root.SetErr(errw)
	err := root.ExecuteContext(ctx)
	var ee exitError
	switch {
	case err == nil:
		return ExitPass
	case errors.As(err, &ee):
		return ee.code
	default:
		// A usage error cobra found (a bad flag value, an unknown flag)
		// never reached the command's own exit mapping.
		fmt.Fprintln(errw, "kcheck:", printable.Escape(err.Error()))
		if bisectRequested(root, args) {
			return ExitSkip
		}
		return ExitUsage
	}
}

// bisectRequested reports whether args ask the command they name for
// --bisect, whose unusable input exits 125 (git bisect's skip) rather than
// 2, which git bisect would take for a bad commit.
func bisectRequested(root *cobra.Command, args []string) bool {
	cmd, _, err := root.Find(args)
	if err != nil || cmd.Flags().Lookup("bisect") == nil {
		return false
	}
	on := false // the last --bisect counts, as in flag parsing
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "--bisect" {
			on = true
		} else if v, ok := strings.CutPrefix(a, "--bisect="); ok {
			b, err := strconv.ParseBool(v)
			on = err == nil && b
		}
	}
	return on
}

func newRoot(s *IO) *cobra.Command {
	root := &cobra.Command{
		Use:   "kcheck",
		Short: "Numerical verification of NVFP4, KV-cache, MLA attention and split-K kernels",
		Long: `kcheck compares inference kernels tensor by tensor against exact Go references
and names the culprit stage (quant, cache, attn, combine) with evidence anyone can re-run.

Exit status: 0 all pass, 1 any fail, 2 unusable input or usage, 3 inconclusive;
with --bisect, inconclusive and unusable input exit 125 (git bisect's skip).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		// --version: the module version and VCS revision (internal/version),
		// the ones a report's environment carries.
		Version: version.Current().String(),
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.AddCommand(newCheckCmd(s))
	for _, extra := range extraCommands {
		root.AddCommand(extra(s))
	}
	return root
}

// extraCommands lets each verb's file add itself, so adding a command
// touches no list here.
var extraCommands []func(*IO) *cobra.Command
