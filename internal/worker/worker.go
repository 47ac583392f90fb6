// Package worker opens the cuda worker's protocol to any program: the
// backends `exec:'CMD ...'` (a program the user points at) and
// `worker:NAME` (a worker of kcheck's Python package, python/kcheck/worker).
//
// Both run exactly as the cuda backend runs kcheck-gpu, through
// internal/gpu's Worker: one fresh process per kernel run, started as
//
//	CMD run --kernel NAME --in IN.safetensors --out OUT.safetensors
//
// in its own process group with kcheck's environment; exit 0 with OUT
// holding the inputs and the outputs, 2 unusable input, 3 a kernel error
// (its name on stderr), 4 an unsupported kernel or shape, 5 cannot run
// here (a missing engine, no GPU). A crash, a hang (the process group is
// killed at the timeout), a signal or an unreadable OUT becomes that run's
// result, with the same status words as the cuda worker (ok, crash, hang,
// garbage, unavailable, unsupported, bad_input, canceled), and the run of
// the catalog goes on. reference/CONTRACTS.md §9 (the worker protocol) is the
// user's documentation.
package worker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"time"

	"github.com/kcheck-dev/kcheck/internal/backend"
	"github.com/kcheck-dev/kcheck/internal/gpu"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Backend is an exec: or worker: backend: each Run is one fresh process.
type Backend struct {
	name   string
	Worker *gpu.Worker
}

// Name implements backend.Backend: the spec it was made from, so a
// capture's kcheck.backend says which program produced it.
func (b *Backend) Name() string { return b.name }

// Run implements backend.Backend. A failed run's error is a *gpu.RunError
// whose Info.Status says how it ended.
func (b *Backend) Run(ctx context.Context, name string, in kernel.Inputs) (map[string]*tensor.Tensor, error) {
	outs, _, err := b.Worker.Run(ctx, name, in)
	return outs, err
}

// RunInfo is Run plus how the process ended and the output file's
// metadata (a worker records its engine, version and call there).
func (b *Backend) RunInfo(ctx context.Context, name string, in kernel.Inputs) (map[string]*tensor.Tensor, gpu.RunInfo, error) {
	return b.Worker.Run(ctx, name, in)
}

// RunWithMeta implements backend.MetaRunner: the metadata the worker wrote
// into OUT goes into the run's capture, as the cuda backend's does. It
// holds the kernel's declared precision (acc_dtype, p_dtype,
// kv_dequant_dtype, softmax_block: what the Expected reference emulates,
// so a correct engine kernel with a 32-token softmax tile is not judged
// against FlashMLA's 64) and the provenance (source, engine, version).
func (b *Backend) RunWithMeta(ctx context.Context, name string, in kernel.Inputs) (map[string]*tensor.Tensor, map[string]string, error) {
	outs, info, err := b.Worker.Run(ctx, name, in)
	if err != nil {
		return outs, nil, err
	}
	return outs, info.Meta, nil
}

func init() {
	backend.Register("exec", func(arg string) (backend.Backend, error) { return ParseExec(arg) })
	backend.Register("worker", func(arg string) (backend.Backend, error) { return ParseWorker(arg) })
}

// timeout is $KCHECK_WORKER_TIMEOUT or the cuda worker's default.
func timeout() (time.Duration, error) {
	s := os.Getenv("KCHECK_WORKER_TIMEOUT")
	if s == "" {
		return gpu.DefaultTimeout, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("KCHECK_WORKER_TIMEOUT = %q: want a positive duration such as 30s", s)
	}
	return d, nil
}

// ParseExec reads the text after "exec:": a command line, split into words
// as a POSIX shell would (quotes and backslashes, no expansion).
func ParseExec(arg string) (*Backend, error) {
	words, err := SplitWords(arg)
	if err != nil {
		return nil, fmt.Errorf("backend exec:%s: %v", arg, err)
	}
	if len(words) == 0 {
		return nil, errors.New("backend exec: needs a command, as in --backend exec:'python3 my_worker.py'")
	}
	d, err := timeout()
	if err != nil {
		return nil, err
	}
	name := "exec:" + arg
	return &Backend{name: name, Worker: &gpu.Worker{Command: words, Label: "worker " + name, Timeout: d}}, nil
}

// Python is the interpreter that runs the package's workers:
// $KCHECK_PYTHON, else python3 on PATH (make python-setup makes
// python/.venv/bin/python; the Makefile's targets point KCHECK_PYTHON at it).
func Python() string {
	if p := os.Getenv("KCHECK_PYTHON"); p != "" {
		return p
	}
	return "python3"
}

// ParseWorker reads the text after "worker:": NAME, then optional
// KEY=VALUE options for the worker, comma-separated
// (worker:vllm,lse_dtype=f32). NAME must be one the package lists
// (`python -m kcheck.worker list`); the options reach the worker as
// --set KEY=VALUE before "run", so it can refuse ones it does not know.
func ParseWorker(arg string) (*Backend, error) {
	parts := strings.Split(arg, ",")
	name := parts[0]
	if name == "" {
		return nil, errors.New("backend worker: needs a worker name, as in --backend worker:vllm ('" + Python() + " -m kcheck.worker list' lists them)")
	}
	argv := []string{Python(), "-m", "kcheck.worker", name}
	for _, opt := range parts[1:] {
		k, v, ok := strings.Cut(opt, "=")
		if !ok || k == "" || v == "" {
			return nil, fmt.Errorf("backend worker:%s: option %q: want KEY=VALUE", arg, opt)
		}
		argv = append(argv, "--set", k+"="+v)
	}
	known, err := List(context.Background())
	if err != nil {
		return nil, err
	}
	if !contains(known, name) {
		return nil, fmt.Errorf("backend worker:%s: no worker named %q (%s -m kcheck.worker list: %s)", arg, name, Python(), strings.Join(known, ", "))
	}
	d, err := timeout()
	if err != nil {
		return nil, err
	}
	spec := "worker:" + arg
	return &Backend{name: spec, Worker: &gpu.Worker{Command: argv, Label: spec, Timeout: d}}, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// List runs `PYTHON -m kcheck.worker list` and returns the worker names it
// prints, one a line. Listing imports no engine, so it is quick.
func List(ctx context.Context) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	py := Python()
	cmd := exec.CommandContext(ctx, py, "-m", "kcheck.worker", "list")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if i := strings.LastIndexByte(msg, '\n'); i >= 0 {
			msg = msg[i+1:]
		}
		if msg == "" {
			msg = err.Error()
		}
		return nil, fmt.Errorf("backend worker: %s -m kcheck.worker list failed: %s (install the Python side with make python-setup, or set KCHECK_PYTHON to an interpreter that has the kcheck package)", py, msg)
	}
	var names []string
	for _, l := range strings.Split(stdout.String(), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	sort.Strings(names)
	return names, nil
}

// SplitWords splits a command line into words the way a POSIX shell does
// for quoting alone: single quotes keep everything, double quotes keep
// everything but backslash escapes of " \ $ `, a backslash outside quotes
// keeps the next character. Nothing is expanded.
func SplitWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case c == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, fmt.Errorf("unterminated ' at offset %d", i)
			}
			cur.WriteString(s[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case c == '"':
			inWord = true
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) && strings.IndexByte("\"\\$`", s[i+1]) >= 0 {
					i++
				}
				cur.WriteByte(s[i])
			}
			if i >= len(s) {
				return nil, errors.New("unterminated \"")
			}
		case c == '\\':
			if i+1 >= len(s) {
				return nil, errors.New("a trailing backslash escapes nothing")
			}
			i++
			cur.WriteByte(s[i])
			inWord = true
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}
