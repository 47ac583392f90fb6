package cli

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kcheck-dev/kcheck/internal/safetensors"
)

// cancelOnWrite is stdout that cancels the command's context at its first
// write: an interrupt that arrives right after the first result, every
// time, without timing.
type cancelOnWrite struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	cancel context.CancelFunc
}

func (w *cancelOnWrite) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cancel()
	return w.buf.Write(p)
}

// An interrupt after the first of three files: kcheck stops, says what
// finished, exits 130 and writes no (partial) report.
func TestInterruptCheck(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &cancelOnWrite{cancel: cancel}
	var errw bytes.Buffer
	dir := t.TempDir()
	files := []string{fx + "golden/nvfp4_gemm.safetensors", fx + "golden/splitk_combine.safetensors", fx + "golden/nvfp4_quantize.safetensors"}
	code := MainContext(ctx, append([]string{"check", "--json", "--report", dir}, files...), strings.NewReader(""), out, &errw)
	if code != ExitInterrupted {
		t.Fatalf("exit %d, want %d\nstderr: %s", code, ExitInterrupted, errw.String())
	}
	want := "interrupted after 1 of 3; finished: " + files[0] + " (pass)"
	if !strings.Contains(errw.String(), want) || !strings.Contains(errw.String(), "not written") {
		t.Errorf("stderr %q, want %q and the report not written", errw.String(), want)
	}
	if n := strings.Count(out.buf.String(), "\n"); n != 1 { // one JSON line a file
		t.Errorf("%d results printed, want 1", n)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("the report directory holds %d entries after an interrupt", len(ents))
	}
}

// A real SIGINT to a real `kcheck run --out` process (this test binary,
// TestMain) while its second case runs: it exits 130, prints what
// finished, and leaves exactly the first case's capture, whole, and no
// temporary file.
func TestInterruptRunLeavesNoPartialFile(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	cases := writeFile(t, filepath.Join(dir, "cases.json"), []byte(interruptCases))
	code, stdout, stderr := runInterrupted(t, selfExec(), []string{"run", "--json", "--cases", cases, "--out", out})
	if code != ExitInterrupted {
		t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, ExitInterrupted, stdout, stderr)
	}
	if want := "interrupted after 1 of 3; finished: a-fast (pass)"; !strings.Contains(stderr, want) {
		t.Errorf("stderr %q, want %q", stderr, want)
	}
	ents, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if len(names) != 1 || names[0] != "a-fast.safetensors" {
		t.Fatalf("--out holds %v, want only a-fast.safetensors", names)
	}
	f, err := safetensors.Open(filepath.Join(out, names[0]))
	if err != nil {
		t.Fatalf("the finished capture does not read back: %v", err)
	}
	f.Close()
}

// The first SIGTERM (what timeout(1) sends) or SIGINT ends a command that
// is busy with something it cannot finish soon (issue 11 item 8): here the
// simulation of diagnose --simulate, which watched no context and ran to
// its end, about a minute, after the signal.
func TestFirstSignalEndsDiagnoseSimulate(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			cmd := selfExec()
			cmd.Args = append(cmd.Args, "diagnose", "--simulate", "--prompts", "3", "--steps", "40")
			var errw bytes.Buffer
			cmd.Stderr = &errw
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Second)
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			sent := time.Now()
			timer := time.AfterFunc(30*time.Second, func() { cmd.Process.Kill() })
			defer timer.Stop()
			cmd.Wait()
			if code := ExitCode(cmd.ProcessState.ExitCode()); code != ExitInterrupted {
				t.Fatalf("exit %d %v after the signal, want %d\nstderr: %s", code, time.Since(sent), ExitInterrupted, errw.String())
			}
			if d := time.Since(sent); d > 10*time.Second {
				t.Errorf("exited %v after the signal", d)
			}
			if !strings.Contains(errw.String(), "interrupted") {
				t.Errorf("stderr %q does not say it was interrupted", errw.String())
			}
		})
	}
}

const stuckChildEnv = "KCHECK_CLI_STUCK"

// stuckChild is a command that never looks at its context, as any code
// that blocks where nothing can wake it would: the first signal must end
// the process all the same (notifyInterrupt's grace).
func stuckChild() {
	_, stop := notifyInterrupt(context.Background(), os.Stderr)
	defer stop()
	os.Stdout.WriteString("ready\n")
	time.Sleep(time.Hour)
	os.Exit(0)
}

func TestFirstSignalEndsAStuckCommand(t *testing.T) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), stuckChildEnv+"=1")
	var errw bytes.Buffer
	cmd.Stderr = &errw
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	timer := time.AfterFunc(interruptGrace+30*time.Second, func() { cmd.Process.Kill() })
	defer timer.Stop()
	cmd.Wait()
	d := time.Since(sent)
	if code := ExitCode(cmd.ProcessState.ExitCode()); code != ExitInterrupted {
		t.Fatalf("exit %d %v after SIGTERM, want %d\nstderr: %s", code, d, ExitInterrupted, errw.String())
	}
	if d < interruptGrace || d > interruptGrace+10*time.Second {
		t.Errorf("exited %v after SIGTERM, want about %v", d, interruptGrace)
	}
	if !strings.Contains(errw.String(), "exiting without waiting longer") {
		t.Errorf("stderr %q", errw.String())
	}
}
