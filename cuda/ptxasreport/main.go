// Command ptxasreport turns ptxas -v output into the build log's table of
// registers, spills and shared memory per kernel and architecture, and
// fails (exit 1) when a kernel spills or stops fitting its architecture:
// shared memory (static, from ptxas, plus the dynamic size the launcher
// requests, from the PTX) over the part's opt-in limit, or registers times
// the __launch_bounds__ block size over a block's register file.
//
//	go run ./cuda/ptxasreport -log build/kernels.log -ptx cuda/ptx -src cuda
//
// make kernels runs it in CI; gpu-check.sh runs the same binary over the
// GPU machine's own rebuild. Exit status: 0 every row fits, 1 a row fails,
// 2 unusable input (a log it cannot read is never reported as a pass).
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(argv []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ptxasreport", flag.ContinueOnError)
	fs.SetOutput(stderr)
	logPath := fs.String("log", "", "ptxas -v output of the build (required)")
	ptxDir := fs.String("ptx", "", "directory of the compute_80 PTX: block sizes and dynamic shared memory (required)")
	srcDir := fs.String("src", "", "directory of the .cu files: the MLA variants' KC_SMEM_FITS budgets (required)")
	if err := fs.Parse(argv); err != nil {
		return 2
	}
	if *logPath == "" || *ptxDir == "" || *srcDir == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "usage: ptxasreport -log FILE -ptx DIR -src DIR")
		return 2
	}
	f, err := os.Open(*logPath)
	if err != nil {
		fmt.Fprintln(stderr, "ptxasreport:", err)
		return 2
	}
	defer f.Close()
	us, err := ParsePtxas(f)
	if err != nil {
		fmt.Fprintf(stderr, "ptxasreport: %s: %v\n", *logPath, err)
		return 2
	}
	if len(us) == 0 {
		fmt.Fprintf(stderr, "ptxasreport: %s has no \"Compiling entry function\" line: was ptxas run with -v?\n", *logPath)
		return 2
	}
	ptx, err := ReadPTX(*ptxDir)
	if err != nil {
		fmt.Fprintln(stderr, "ptxasreport:", err)
		return 2
	}
	budgets, err := ReadBudgets(*srcDir)
	if err != nil {
		fmt.Fprintln(stderr, "ptxasreport:", err)
		return 2
	}
	rows := Judge(us, ptx, budgets)
	bad := WriteTable(stdout, rows)
	archs := map[string]bool{}
	kernels := map[string]bool{}
	for _, r := range rows {
		archs[r.Arch] = true
		kernels[r.Kernel] = true
	}
	names := make([]string, 0, len(archs))
	for a := range archs {
		names = append(names, a)
	}
	sort.Strings(names)
	fmt.Fprintf(stdout, "\n%d kernels on %s: ", len(kernels), strings.Join(names, ", "))
	if bad > 0 {
		fmt.Fprintf(stdout, "%d rows FAIL (a spill, or a kernel that does not fit its architecture)\n", bad)
		return 1
	}
	fmt.Fprintln(stdout, "no spills, every kernel fits where the launcher uses it")
	return 0
}
