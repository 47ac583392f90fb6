//go:build unix

package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func init() { platformBadInputs = append(platformBadInputs, unixBadInputs) }

// fifoIn makes a named pipe at dir/name that nobody writes to.
func fifoIn(t *testing.T, dir, name string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	return path
}

// goldenIn copies a golden capture into dir.
func goldenIn(t *testing.T, dir, golden string) string {
	t.Helper()
	b, err := os.ReadFile(fx + "golden/" + golden)
	if err != nil {
		t.Fatal(err)
	}
	return writeFile(t, filepath.Join(dir, golden), b)
}

// The inputs of issue 11 items 8 and 10 that need named pipes and /proc.
func unixBadInputs() []badInput {
	return []badInput{
		{name: "a capture directory holding a named pipe", setup: func(t *testing.T, dir string) []string {
			goldenIn(t, dir, "nvfp4_gemm.safetensors")
			fifoIn(t, dir, "waiting.safetensors")
			return []string{"check", "--json", dir}
		}, code: ExitPass, want: []string{"waiting.safetensors: a named pipe, not a regular file: skipped", `"verdict":"pass"`}},
		{name: "a named pipe with no writer given as a capture, --timeout 1s", setup: func(t *testing.T, dir string) []string {
			return []string{"check", "--json", "--timeout", "1s", fifoIn(t, dir, "waiting.safetensors")}
		}, code: ExitUsage, want: []string{"timed out after", "waiting to open it (a named pipe", "--timeout"}},
		{name: "SIGINT while a named pipe waits for its writer", setup: func(t *testing.T, dir string) []string {
			return []string{"check", "--json", goldenIn(t, dir, "nvfp4_gemm.safetensors"), fifoIn(t, dir, "waiting.safetensors")}
		}, code: ExitInterrupted, want: []string{"interrupted after 1 of 2"}, interrupt: true},
		{name: "a symlink to the pagemap file of proc (0 bytes by stat, terabytes by read) in a capture directory, --max-memory 16M", setup: func(t *testing.T, dir string) []string {
			if _, err := os.Stat("/proc/self/pagemap"); err != nil {
				t.Skip(err)
			}
			goldenIn(t, dir, "nvfp4_gemm.safetensors")
			if err := os.Symlink("/proc/self/pagemap", filepath.Join(dir, "pagemap.safetensors")); err != nil {
				t.Fatal(err)
			}
			return []string{"check", "--json", "--max-memory", "16M", dir}
		}, code: ExitUsage, want: []string{"pagemap.safetensors: a stream of more than 16.0 MiB, the memory bound: refused", `"verdict":"pass"`}},
		{name: "run --cases /dev/zero", setup: func(t *testing.T, dir string) []string {
			return []string{"run", "--json", "--cases", "/dev/zero"}
		}, code: ExitUsage, want: []string{"/dev/zero: a stream of more than 32.0 MiB, the limit of case files"}},
		{name: "cases --cases /dev/zero", setup: func(t *testing.T, dir string) []string {
			return []string{"cases", "--cases", "/dev/zero"}
		}, code: ExitUsage, want: []string{"/dev/zero: a stream of more than 32.0 MiB, the limit of case files"}},
		{name: "diagnose on /dev/zero, --max-memory 16M", setup: func(t *testing.T, dir string) []string {
			return []string{"diagnose", "--json", "--max-memory", "16M", "/dev/zero"}
		}, code: ExitUsage, want: []string{"/dev/zero: a stream of more than 16.0 MiB"}},
		{name: "diagnose on a named pipe with no writer, --timeout 1s", setup: func(t *testing.T, dir string) []string {
			return []string{"diagnose", "--json", "--timeout", "1s", fifoIn(t, dir, "waiting.safetensors")}
		}, code: ExitUsage, want: []string{"timed out after", "named pipe"}},
		{name: "shrink on /dev/zero, --max-memory 16M", setup: func(t *testing.T, dir string) []string {
			return []string{"shrink", "--max-memory", "16M", "/dev/zero", "-o", filepath.Join(dir, "min.safetensors")}
		}, code: ExitUsage, want: []string{"/dev/zero: a stream of more than 16.0 MiB"}},
		{name: "report on /dev/zero, --max-memory 16M", setup: func(t *testing.T, dir string) []string {
			return []string{"report", "--max-memory", "16M", "/dev/zero"}
		}, code: ExitUsage, want: []string{"/dev/zero: a stream of more than 16.0 MiB"}},
		{name: "check --report with /dev/zero as a capture, --max-memory 16M", setup: func(t *testing.T, dir string) []string {
			return []string{"check", "--json", "--max-memory", "16M", "--report", filepath.Join(dir, "report"), "/dev/zero"}
		}, code: ExitUsage, want: []string{"/dev/zero: a stream of more than 16.0 MiB", "report written"}},
		{name: "merge on a named pipe with no writer, --timeout 1s", setup: func(t *testing.T, dir string) []string {
			return []string{"merge", "--timeout", "1s", fifoIn(t, dir, "shard.json")}
		}, code: ExitUsage, want: []string{"timed out after", "named pipe"}},
		{name: "merge on an endless JSON string through a named pipe, --max-memory 16M", setup: func(t *testing.T, dir string) []string {
			return []string{"merge", "--max-memory", "16M", feedFIFO(t, fifoIn(t, dir, "shard.json"), []byte(`"`), true)}
		}, code: ExitUsage, want: []string{"shard.json: a stream of more than 16.0 MiB, the memory bound: refused"}},
		{name: "report on an endless JSON string through a named pipe, --max-memory 16M", setup: func(t *testing.T, dir string) []string {
			return []string{"report", "--max-memory", "16M", feedFIFO(t, fifoIn(t, dir, "results.json"), []byte(`"`), true)}
		}, code: ExitUsage, want: []string{"results.json: a stream of more than 16.0 MiB, the memory bound: refused"}},
		{name: "merge on a shard whose writer stalls after one result, --timeout 1s", setup: func(t *testing.T, dir string) []string {
			one := []byte(`{"file":"a.safetensors","kernel":"nvfp4_gemm","verdict":"pass","stage":null,"checks":[],"error":null}` + "\n")
			return []string{"merge", "--timeout", "1s", feedFIFO(t, fifoIn(t, dir, "shard.json"), one, false)}
		}, code: ExitUsage, want: []string{"shard.json: timed out after", "while reading it"}},
	}
}

// feedFIFO writes head into the named pipe at path once a reader opens
// it, then either endless 'a's (endless) or nothing more, holding the pipe
// open (a stalled writer), until the reader goes or the test ends.
func feedFIFO(t *testing.T, path string, head []byte, endless bool) string {
	t.Helper()
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	go func() {
		w, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return
		}
		defer w.Close()
		if _, err := w.Write(head); err != nil {
			return
		}
		if !endless {
			<-done
			return
		}
		chunk := bytes.Repeat([]byte{'a'}, 1<<16)
		for {
			select {
			case <-done:
				return
			default:
			}
			if _, err := w.Write(chunk); err != nil {
				return // the reader closed its end
			}
		}
	}()
	return path
}
