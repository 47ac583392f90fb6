package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/backend"
	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/cli"
	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/engines"
	"github.com/kcheck-dev/kcheck/internal/gpu"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/safetensors"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// The test binary is its own worker: with KCHECK_TEST_WORKER set it speaks
// the protocol (a correct worker, or one broken in the way the variable
// names) instead of running the tests, so every failure mode goes through
// a real process, a real exit status and real files.
func TestMain(m *testing.M) {
	if mode := os.Getenv("KCHECK_TEST_WORKER"); mode != "" {
		os.Exit(fakeWorker(mode, os.Args[1:]))
	}
	os.Exit(m.Run())
}

func fakeWorker(mode string, args []string) int {
	if len(args) == 0 || args[0] != "run" {
		fmt.Fprintln(os.Stderr, "usage: run --kernel NAME --in IN --out OUT")
		return 2
	}
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	name := fs.String("kernel", "", "")
	inPath := fs.String("in", "", "")
	outPath := fs.String("out", "", "")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	// The worker inherits kcheck's environment: prove it by needing it.
	if os.Getenv("KCHECK_TEST_INHERITED") != "yes" {
		fmt.Fprintln(os.Stderr, "KCHECK_TEST_INHERITED is not set: the environment was not inherited")
		return 2
	}
	switch mode {
	case "bad_input":
		fmt.Fprintln(os.Stderr, "tensor q: unusable")
		return 2
	case "kernel_error":
		fmt.Fprintln(os.Stderr, "RuntimeError: the kernel failed")
		return 3
	case "unsupported":
		fmt.Fprintln(os.Stderr, "unsupported: page_size 1 (the kernel needs 64)")
		return 4
	case "crash":
		// Die of a signal, as a segfaulting kernel does (SIGKILL: the Go
		// runtime would turn a SIGSEGV it is sent into exit 2).
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		time.Sleep(time.Minute)
	case "hang":
		time.Sleep(time.Hour)
	case "garbage":
		_ = os.WriteFile(*outPath, []byte("not a safetensors file"), 0o644)
		return 0
	case "exit7":
		fmt.Fprintln(os.Stderr, "Traceback: something broke")
		return 7
	}
	f, err := safetensors.Open(*inPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer f.Close()
	in := kernel.Inputs{Tensors: f.Tensors, Params: kernel.Params(f.Metadata)}
	outs, err := backend.Reference{}.Run(context.Background(), *name, in)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	all := map[string]*tensor.Tensor{}
	for k, v := range f.Tensors {
		all[k] = v
	}
	for k, v := range outs {
		switch mode {
		case "missing_output":
			continue
		case "lse_not_written", "lse_not_written_wrong", "declares_unknown":
			if k == "lse" {
				continue
			}
		}
		switch mode {
		case "wrong", "lse_not_written_wrong", "flashinfer_layout_wrong":
			// A real bug: the first output's first element negated.
			if k == "out" {
				v = v.Clone()
				v.Data[1] ^= 0x80 // sign bit of a little-endian 16-bit first element
			}
		}
		all[k] = v
	}
	meta := map[string]string{"source": "kcheck test worker"}
	if strings.HasPrefix(mode, "flashinfer_layout") {
		// OUT as FlashInfer's merge_states call: v [T, S, H, D], s [T, S,
		// H], v_merged [T, H, D], s_merged [T, H] (H = 1 here), in its own
		// names, none of the contract's; lse in base e, declared.
		po, pl := f.Tensors["partial_out"], f.Tensors["partial_lse"]
		n, sp := pl.Shape[0], pl.Shape[1]
		all = map[string]*tensor.Tensor{
			"v":        {DType: po.DType, Shape: []int{n, sp, 1, po.Shape[2]}, Data: po.Data},
			"s":        {DType: pl.DType, Shape: []int{n, sp, 1}, Data: pl.Data},
			"v_merged": {DType: all["out"].DType, Shape: []int{n, 1, po.Shape[2]}, Data: all["out"].Data},
			"s_merged": {DType: all["lse"].DType, Shape: []int{n, 1}, Data: all["lse"].Data},
		}
		meta = map[string]string{"kcheck.format": "1", "kcheck.kernel": *name, kernel.LayoutKey: "flashinfer", "lse_base": "e"}
		if mode == "flashinfer_layout_unknown" {
			meta[kernel.LayoutKey] = "tensorrt-9"
		}
	}
	switch mode {
	case "declares":
		meta["softmax_block"] = "32"
	case "lse_not_written", "lse_not_written_wrong", "lse_declared_but_written":
		meta[kernel.NotWrittenKey] = "lse"
	case "declares_unknown":
		meta[kernel.NotWrittenKey] = "lsee"
	case "missing_output":
		meta[kernel.NotWrittenKey] = "out,lse"
	}
	if err := safetensors.Write(*outPath, meta, all, safetensors.WriteOptions{}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// execSpec is the --backend value that runs this test binary as a worker in mode.
func execSpec(t *testing.T, mode string) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("exec:env KCHECK_TEST_WORKER=%s '%s'", mode, exe)
}

// The case every mode runs: small (a few hundred KB), and its out is BF16.
const smallCase = "splitk_combine/deepseek-v3/tp8/s4"

func catalogCase(t *testing.T, name string) cases.Case {
	t.Helper()
	all, err := cases.Catalog()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range all {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no case %s", name)
	return cases.Case{}
}

func TestExecStatuses(t *testing.T) {
	t.Setenv("KCHECK_TEST_INHERITED", "yes")
	t.Setenv("KCHECK_WORKER_TIMEOUT", "3s")
	c := catalogCase(t, smallCase)
	for _, tc := range []struct {
		mode    string
		verdict compare.Verdict
		status  gpu.Status // for the error verdicts
		says    string     // in the error message
	}{
		{"ok", check.Pass, gpu.StatusOK, ""},
		{"wrong", check.Fail, gpu.StatusOK, ""},
		{"bad_input", check.Error, gpu.StatusBadInput, "tensor q: unusable"},
		{"kernel_error", check.Error, gpu.StatusCrash, "RuntimeError: the kernel failed"},
		{"unsupported", check.Error, gpu.StatusUnsupported, "page_size 1"},
		{"crash", check.Error, gpu.StatusCrash, "signal"},
		{"hang", check.Error, gpu.StatusHang, "no result after"},
		{"garbage", check.Error, gpu.StatusGarbage, "unreadable"},
		{"missing_output", check.Error, gpu.StatusGarbage, "holds none of the kernel's outputs"},
		// An output the kernel does not write, declared so, is left out of
		// the judgement and named in the notes; the rest is still judged
		// (the wrong out still fails); a declaration that names no output
		// of the kernel, or one the file holds, is garbage.
		{"lse_not_written", check.Pass, gpu.StatusOK, ""},
		{"lse_not_written_wrong", check.Fail, gpu.StatusOK, ""},
		{"declares_unknown", check.Error, gpu.StatusGarbage, `"lsee" is not an output of splitk_combine`},
		{"lse_declared_but_written", check.Error, gpu.StatusGarbage, "both holds lse and declares it not written"},
		// An OUT in an engine's own names, declared so, is read through
		// that engine's table, as a capture of it is (--from): judged
		// alone, passing when right and failing when wrong; an engine
		// kcheck has no table for is named.
		{"flashinfer_layout", check.Pass, gpu.StatusOK, ""},
		{"flashinfer_layout_wrong", check.Fail, gpu.StatusOK, ""},
		{"flashinfer_layout_unknown", check.Error, gpu.StatusOK, "kcheck.worker.layout"},
		{"exit7", check.Error, gpu.StatusCrash, "exit 7"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			be, err := backend.Parse(execSpec(t, tc.mode))
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			res := cli.RunCase(context.Background(), c, be, check.Options{WorstK: 1, Engine: engines.Layout}, time.Minute, "", false)
			if res.Verdict != tc.verdict {
				t.Fatalf("verdict %s, want %s (error %v)", res.Verdict, tc.verdict, deref(res.Error))
			}
			if tc.mode == "hang" && time.Since(start) > 20*time.Second {
				t.Errorf("the hang took %v to end (timeout 3s)", time.Since(start))
			}
			if tc.verdict != check.Error {
				judged := map[string]bool{}
				for _, ch := range res.Checks {
					judged[ch.Tensor] = true
				}
				if strings.HasPrefix(tc.mode, "flashinfer_layout") {
					if !strings.Contains(strings.Join(res.Notes, "\n"), "read as --from flashinfer reads a capture") {
						t.Errorf("notes %q do not say the file was read as --from flashinfer", res.Notes)
					}
				}
				notWritten := strings.HasPrefix(tc.mode, "lse_not_written")
				if judged["lse"] == notWritten || !judged["out"] {
					t.Errorf("judged %v; want out, and lse only when it was written", judged)
				}
				if said := strings.Contains(strings.Join(res.Notes, "\n"), "lse: not judged"); said != notWritten {
					t.Errorf("notes %q: a note on the unwritten lse is %v, want %v", res.Notes, said, notWritten)
				}
				return
			}
			msg := deref(res.Error)
			if tc.status == gpu.StatusOK { // the run went well; the checker refused its OUT
				if !strings.Contains(msg, tc.says) {
					t.Errorf("error %q: want %q", msg, tc.says)
				}
				return
			}
			if !strings.Contains(msg, ": "+string(tc.status)) || !strings.Contains(msg, tc.says) {
				t.Errorf("error %q: want status %s and %q", msg, tc.status, tc.says)
			}
			// The status is also what the backend reports directly.
			in, _ := c.Inputs()
			_, err = be.Run(context.Background(), c.Kernel, in)
			var re *gpu.RunError
			if !errors.As(err, &re) || re.Info.Status != tc.status {
				t.Errorf("Run error %v: want a *gpu.RunError with status %s", err, tc.status)
			}
		})
	}
}

// A catalog run through a worker that crashes on one kernel goes on with
// the next case and records each result: a broken worker never ends the run.
func TestExecRunGoesOn(t *testing.T) {
	t.Setenv("KCHECK_TEST_INHERITED", "yes")
	t.Setenv("KCHECK_WORKER_TIMEOUT", "3s")
	for _, mode := range []string{"crash", "hang", "garbage"} {
		var out, errOut bytes.Buffer
		code := cli.Main([]string{"run", "--json", "--quiet", "--match", "splitk_combine/deepseek-v3/tp8/s*", "--backend", execSpec(t, mode)}, strings.NewReader(""), &out, &errOut)
		if code != cli.ExitUsage {
			t.Errorf("%s: exit %d, want %d (a worker failure is an unusable-input error)", mode, code, cli.ExitUsage)
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) != 5 {
			t.Fatalf("%s: %d results, want 5 (one per case): %s", mode, len(lines), out.String())
		}
		for _, l := range lines {
			var r struct {
				Verdict string
				Error   string
			}
			if err := json.Unmarshal([]byte(l), &r); err != nil {
				t.Fatal(err)
			}
			if r.Verdict != "error" || !strings.Contains(r.Error, mode) {
				t.Errorf("%s: result %s", mode, l)
			}
		}
	}
}

// What a worker writes into OUT's metadata (its declared precision, its
// provenance) is in the capture kcheck judges: without it a correct engine
// kernel is judged at another kernel's precision.
func TestExecMetadataReachesCapture(t *testing.T) {
	t.Setenv("KCHECK_TEST_INHERITED", "yes")
	be, err := backend.Parse(execSpec(t, "declares"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := cli.Capture(context.Background(), catalogCase(t, smallCase), be, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{"softmax_block": "32", "source": "kcheck test worker", "kcheck.kernel": "splitk_combine"} {
		if got := c.Metadata[k]; got != want {
			t.Errorf("capture metadata %s = %q, want %q (the worker's OUT metadata must reach the capture)", k, got, want)
		}
	}
}

func TestExecEnvironmentInherited(t *testing.T) {
	// Without the variable the fake worker refuses: the ok case passes
	// above only because the worker saw kcheck's environment.
	c := catalogCase(t, smallCase)
	be, err := backend.Parse(execSpec(t, "ok"))
	if err != nil {
		t.Fatal(err)
	}
	os.Unsetenv("KCHECK_TEST_INHERITED")
	res := cli.RunCase(context.Background(), c, be, check.Options{}, time.Minute, "", false)
	if res.Verdict != check.Error || !strings.Contains(deref(res.Error), "not inherited") {
		t.Errorf("verdict %s, error %q", res.Verdict, deref(res.Error))
	}
}

func TestParseErrors(t *testing.T) {
	t.Setenv("KCHECK_PYTHON", "/nonexistent/python")
	for _, tc := range []struct{ spec, says string }{
		{"exec:", "needs a command"},
		{"exec:'unterminated", "unterminated '"},
		{"worker:", "needs a worker name"},
		{"worker:vllm,lse_dtype", "want KEY=VALUE"},
		{"worker:vllm", "/nonexistent/python -m kcheck.worker list failed"},
	} {
		_, err := backend.Parse(tc.spec)
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: error %v, want %q", tc.spec, err, tc.says)
		}
	}
	t.Setenv("KCHECK_WORKER_TIMEOUT", "soon")
	if _, err := backend.Parse("exec:true"); err == nil || !strings.Contains(err.Error(), "KCHECK_WORKER_TIMEOUT") {
		t.Errorf("bad timeout: %v", err)
	}
}

func TestSplitWords(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"python3 w.py", []string{"python3", "w.py"}},
		{"  a  'b c'  ", []string{"a", "b c"}},
		{`a "b \" c" d\ e`, []string{"a", `b " c`, "d e"}},
		{`x'y'"z"`, []string{"xyz"}},
		{"''", []string{""}},
	} {
		got, err := SplitWords(tc.in)
		if err != nil || fmt.Sprint(got) != fmt.Sprint(tc.want) || len(got) != len(tc.want) {
			t.Errorf("SplitWords(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{`a "b`, `a\`, `'x`} {
		if _, err := SplitWords(bad); err == nil {
			t.Errorf("SplitWords(%q): no error", bad)
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
