// Package gpu is the CLI side of the cuda backend. It never touches the GPU
// itself: gorgonia.org/cu exits the process from its package init on a
// machine without a GPU, and a kernel that corrupts memory or never returns
// must not take kcheck down with it. So every kernel invocation runs in a
// fresh worker process (cmd/kcheck-gpu, built with -tags cuda): the inputs
// go to it as an evidence file, the outputs come back as one, and whatever
// the worker does (crash with CUDA_ERROR_ILLEGAL_ADDRESS, hang, die on a
// signal, write garbage) becomes a per-kernel result and the run goes on.
//
// Worker.Run is the whole protocol; Backend adapts it to internal/backend
// (registered as "cuda").
package gpu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/safetensors"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// The worker's exit statuses (cmd/kcheck-gpu).
const (
	ExitOK          = 0
	ExitInternal    = 1 // also gorgonia.org/cu's exit when there is no GPU
	ExitUsage       = 2 // usage or unusable input
	ExitCUDA        = 3 // a CUDA error; its name is on stderr
	ExitUnsupported = 4 // the CUDA kernels do not implement this call
	ExitNoCUDABuild = 5 // the worker was built without the cuda tag
	// ExitMemcheck is the --error-exitcode given to compute-sanitizer.
	ExitMemcheck = 6
	// ExitLoad: the driver refused the kernel image (PTX JIT failure, PTX
	// newer than the driver, no code for this GPU); nothing ran.
	ExitLoad = 7
)

// Status is the outcome of one worker run.
type Status string

// The statuses.
const (
	StatusOK          Status = "ok"
	StatusCrash       Status = "crash"       // a CUDA error, or the worker died on a signal
	StatusHang        Status = "hang"        // killed at the timeout
	StatusGarbage     Status = "garbage"     // exited 0 but the output file is unreadable or incomplete
	StatusUnavailable Status = "unavailable" // no worker, no GPU, no CUDA build
	StatusUnsupported Status = "unsupported" // the CUDA kernels lack this kernel or shape
	StatusBadInput    Status = "bad_input"   // the worker refused the inputs
	StatusMemcheck    Status = "memcheck"    // compute-sanitizer found memory errors
	StatusCanceled    Status = "canceled"    // the caller's context was canceled
	// StatusLoadFailed: the kernel image could not be loaded on this GPU
	// (CUDA_ERROR_INVALID_PTX, UNSUPPORTED_PTX_VERSION, NO_BINARY_FOR_GPU):
	// a build or driver problem, not a kernel that crashed.
	StatusLoadFailed Status = "load_failed"
)

// RunInfo says how a worker run ended.
type RunInfo struct {
	Status   Status
	ExitCode int    // -1 when the process did not exit by itself
	Signal   string // the signal that ended it, if any
	// CUDAError is the CUDA_ERROR_... name the worker reported, if any.
	CUDAError string
	// Stderr is the tail of the worker's stderr (compute-sanitizer's
	// report included), Stdout the tail of its stdout.
	Stderr, Stdout string
	Elapsed        time.Duration
	// Meta is the output file's metadata (declared precision, device,
	// kernel_build, kcheck.cuda.ms...) when the run succeeded.
	Meta map[string]string
	// Command is the command line that ran (temporary paths included).
	Command []string
	// Note records anything else worth knowing (sanitizer not found...).
	Note string
}

// RunError is the error of a run that did not produce outputs; Info holds
// the details (errors.As it to tell a crash from a hang).
type RunError struct {
	// Worker names the worker in the message; empty means "cuda worker".
	Worker string
	Kernel string
	Info   RunInfo
	Reason string
}

func (e *RunError) Error() string {
	label := e.Worker
	if label == "" {
		label = "cuda worker"
	}
	s := fmt.Sprintf("%s, kernel %s: %s", label, e.Kernel, e.Info.Status)
	var details []string
	if e.Info.CUDAError != "" {
		details = append(details, e.Info.CUDAError)
	}
	if e.Info.Signal != "" {
		details = append(details, "signal "+e.Info.Signal)
	} else if e.Info.ExitCode > 0 {
		details = append(details, "exit "+strconv.Itoa(e.Info.ExitCode))
	}
	if len(details) > 0 {
		s += " (" + strings.Join(details, ", ") + ")"
	}
	if e.Reason != "" {
		s += ": " + e.Reason
	}
	return s
}

// Worker runs kernels in worker processes, one process a kernel.
type Worker struct {
	// Path is the worker binary; empty: Find, else FindWorker.
	Path string
	// Find, when set, locates the worker binary in place of FindWorker
	// (the cuda-emu backend's emulated worker).
	Find func() (string, error)
	// Command, when set, replaces Path: the worker is any program that
	// speaks the protocol, started as Command followed by "run --kernel
	// NAME --in IN --out OUT" (internal/worker's exec: and worker:
	// backends). Label then names it in errors.
	Command []string
	Label   string
	// Timeout bounds one run (0: only the caller's context); the worker's
	// whole process group is killed when it expires.
	Timeout time.Duration
	// Sanitize runs the worker under `compute-sanitizer --tool memcheck`
	// when SanitizerPath or PATH has it (with 10x the timeout: memcheck is
	// slow); without it the run is unsanitized and RunInfo.Note says so.
	Sanitize      bool
	SanitizerPath string
	// PTXDir is passed as --ptx-dir when set; Repeat as --repeat when > 1.
	PTXDir string
	Repeat int
	// CopyBytes, when > 0, asks the worker to time a device-to-device copy
	// of that many bytes in the same process (--copy-bytes), the yardstick
	// `kcheck bench` reports bandwidth against.
	CopyBytes int64
	// Env is added to the worker's environment.
	Env []string
	// TempDir holds the per-run exchange files (default os.TempDir()).
	TempDir string
}

// FindWorker locates kcheck-gpu: $KCHECK_GPU_WORKER, then next to the
// running executable, then on PATH.
func FindWorker() (string, error) {
	if p := os.Getenv("KCHECK_GPU_WORKER"); p != "" {
		return p, nil
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "kcheck-gpu")
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	p, err := exec.LookPath("kcheck-gpu")
	if err != nil {
		return "", errors.New("no GPU worker: set KCHECK_GPU_WORKER, or put kcheck-gpu (make gpu-bundle) next to kcheck or on PATH")
	}
	return p, nil
}

// tail keeps the last n bytes written to it.
type tail struct {
	n   int
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if len(t.buf) > 2*t.n {
		t.buf = append([]byte(nil), t.buf[len(t.buf)-t.n:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	b := t.buf
	if len(b) > t.n {
		b = b[len(b)-t.n:]
	}
	return string(b)
}

var cudaErrRE = regexp.MustCompile(`CUDA_ERROR_[A-Z0-9_]+`)

// noGPUText is what gorgonia.org/cu prints (to stdout) before os.Exit(1)
// when cuInit fails: no GPU, or no driver.
const noGPUText = "Error in initialization"

// Run runs kernel name on in in a fresh worker. It returns the outputs the
// worker produced (tensors of the output file that are not identical
// inputs) and how the run ended; err is a *RunError whenever Status is not
// StatusOK, and then the outputs are nil.
func (w *Worker) Run(ctx context.Context, name string, in kernel.Inputs) (map[string]*tensor.Tensor, RunInfo, error) {
	info := RunInfo{ExitCode: -1}
	fail := func(st Status, reason string) (map[string]*tensor.Tensor, RunInfo, error) {
		info.Status = st
		return nil, info, &RunError{Worker: w.Label, Kernel: name, Info: info, Reason: reason}
	}
	contract, err := kernel.Lookup(name)
	if err != nil {
		return fail(StatusBadInput, err.Error())
	}
	prefix := w.Command
	if len(prefix) == 0 {
		path := w.Path
		if path == "" {
			find := w.Find
			if find == nil {
				find = FindWorker
			}
			if path, err = find(); err != nil {
				return fail(StatusUnavailable, err.Error())
			}
		}
		prefix = []string{path}
	}
	dir, err := os.MkdirTemp(w.TempDir, "kcheck-gpu-*")
	if err != nil {
		return fail(StatusUnavailable, "temporary directory: "+err.Error())
	}
	defer os.RemoveAll(dir)
	inPath, outPath := filepath.Join(dir, "in.safetensors"), filepath.Join(dir, "out.safetensors")
	meta := map[string]string{}
	for k, v := range in.Params {
		meta[k] = v
	}
	meta["kcheck.format"] = "1"
	meta["kcheck.kernel"] = name
	if err := safetensors.Write(inPath, meta, in.Tensors, safetensors.WriteOptions{}); err != nil {
		return fail(StatusBadInput, "writing the worker's input file: "+err.Error())
	}

	argv := append(append([]string(nil), prefix...), "run", "--kernel", name, "--in", inPath, "--out", outPath)
	if w.PTXDir != "" {
		argv = append(argv, "--ptx-dir", w.PTXDir)
	}
	if w.CopyBytes > 0 {
		argv = append(argv, "--copy-bytes", strconv.FormatInt(w.CopyBytes, 10))
	}
	if w.Repeat > 1 {
		argv = append(argv, "--repeat", strconv.Itoa(w.Repeat))
	}
	timeout := w.Timeout
	if w.Sanitize {
		san := w.SanitizerPath
		if san == "" {
			san, _ = exec.LookPath("compute-sanitizer")
		}
		if san == "" {
			info.Note = "compute-sanitizer not found on PATH: ran without memcheck"
		} else {
			argv = append([]string{san, "--tool", "memcheck", "--error-exitcode", strconv.Itoa(ExitMemcheck)}, argv...)
			timeout *= 10
		}
	}
	info.Command = argv

	runCtx := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), w.Env...)
	stdout, stderr := &tail{n: 16 << 10}, &tail{n: 64 << 10}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	setProcessGroup(cmd)
	// If something outside the group still holds the pipes, do not wait
	// for it forever after the worker is gone.
	cmd.WaitDelay = 2 * time.Second
	start := time.Now()
	if err := cmd.Start(); err != nil {
		info.Elapsed = time.Since(start)
		return fail(StatusUnavailable, "starting the worker: "+err.Error())
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var waitErr error
	var killed bool
	select {
	case waitErr = <-done:
	case <-runCtx.Done():
		killGroup(cmd)
		killed = true
		waitErr = <-done
	}
	info.Elapsed = time.Since(start)
	info.Stdout, info.Stderr = stdout.String(), stderr.String()
	info.CUDAError = cudaErrRE.FindString(info.Stderr)
	if st := cmd.ProcessState; st != nil {
		info.ExitCode = st.ExitCode()
		info.Signal = signalOf(st)
	}
	if killed {
		if ctx.Err() == context.Canceled {
			return fail(StatusCanceled, "the run was canceled")
		}
		return fail(StatusHang, fmt.Sprintf("no result after %v; the worker's process group was killed", info.Elapsed.Round(time.Millisecond)))
	}
	if waitErr != nil && info.ExitCode == 0 {
		info.ExitCode = -1 // e.g. the pipes outlived WaitDelay
	}
	last := lastLine(info.Stderr)
	switch {
	case info.Signal != "":
		return fail(StatusCrash, "the worker died on a signal: "+last)
	case info.ExitCode == ExitOK:
	case info.ExitCode == ExitCUDA:
		return fail(StatusCrash, last)
	case info.ExitCode == ExitUsage:
		return fail(StatusBadInput, last)
	case info.ExitCode == ExitUnsupported:
		return fail(StatusUnsupported, last)
	case info.ExitCode == ExitNoCUDABuild:
		return fail(StatusUnavailable, last)
	// Exit 6 and 7 are kcheck-gpu's own (compute-sanitizer, the driver's
	// JIT); for any other worker they are an unexpected status: a crash.
	case info.ExitCode == ExitLoad && len(w.Command) == 0:
		return fail(StatusLoadFailed, last)
	case info.ExitCode == ExitMemcheck && len(w.Command) == 0 && strings.Contains(info.Stderr, "AddressSanitizer"):
		// The cuda-emu backend's ASan modules exit with the same status.
		return fail(StatusMemcheck, "AddressSanitizer reported errors: "+firstContaining(info.Stderr, "ERROR: AddressSanitizer"))
	case info.ExitCode == ExitMemcheck && len(w.Command) == 0:
		return fail(StatusMemcheck, "compute-sanitizer memcheck reported errors: "+firstMatch(info.Stderr, "========= "))
	case info.ExitCode == ExitInternal && len(w.Command) == 0 && strings.Contains(info.Stdout, noGPUText):
		return fail(StatusUnavailable, "the worker found no usable GPU: "+lastLine(info.Stdout))
	default:
		return fail(StatusCrash, last)
	}

	outs, fileMeta, reason := readOutputs(outPath, contract, in)
	if reason != "" {
		return fail(StatusGarbage, reason)
	}
	info.Meta = fileMeta
	info.Status = StatusOK
	return outs, info, nil
}

// readOutputs reads the worker's output file and returns every tensor that
// is not an unchanged input, copied out of the file's mapping; reason says
// why the file is garbage.
func readOutputs(path string, contract kernel.Kernel, in kernel.Inputs) (map[string]*tensor.Tensor, map[string]string, string) {
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, nil, "the worker exited 0 but its output is unreadable: " + err.Error()
	}
	defer f.Close()
	if f.Metadata[kernel.LayoutKey] != "" {
		return engineCapture(f)
	}
	notWritten, err := kernel.NotWritten(contract, f.Metadata)
	if err != nil {
		return nil, nil, "the worker exited 0 but its output's " + err.Error()
	}
	written := 0
	for _, o := range contract.Spec().Outputs {
		_, ok := f.Tensors[o.Name]
		switch {
		case ok && notWritten[o.Name]:
			return nil, nil, fmt.Sprintf("the worker exited 0 but its output both holds %s and declares it not written (%s)", o.Name, kernel.NotWrittenKey)
		case ok:
			written++
		case !o.Optional && !notWritten[o.Name]:
			return nil, nil, fmt.Sprintf("the worker exited 0 but its output has no tensor %s", o.Name)
		}
	}
	if written == 0 {
		return nil, nil, "the worker exited 0 but its output holds none of the kernel's outputs"
	}
	isOutput := map[string]bool{}
	for _, o := range contract.Spec().Outputs {
		isOutput[o.Name] = true
	}
	outs := map[string]*tensor.Tensor{}
	for name, t := range f.Tensors {
		if err := t.Check(); err != nil {
			return nil, nil, fmt.Sprintf("output tensor %s: %v", name, err)
		}
		// A contract output always comes back (even when it equals a
		// same-named tensor of a re-run capture); anything else only when
		// the worker made or changed it (split_bounds).
		if old, ok := in.Tensors[name]; ok && !isOutput[name] && old.DType == t.DType && equalShape(old.Shape, t.Shape) && bytes.Equal(old.Data, t.Data) {
			continue
		}
		outs[name] = t.Clone()
	}
	meta := make(map[string]string, len(f.Metadata))
	for k, v := range f.Metadata {
		meta[k] = v
	}
	return outs, meta, ""
}

// engineCapture reads an OUT that declares kernel.LayoutKey: a capture of
// the engine's own call, whose every tensor is kept (its names are the
// engine's, read by the checker through that engine's table, so they are
// not held to the contract's here).
func engineCapture(f *safetensors.File) (map[string]*tensor.Tensor, map[string]string, string) {
	if len(f.Tensors) == 0 {
		return nil, nil, fmt.Sprintf("the worker exited 0 but its output, declared in %s's layout (%s), holds no tensor", f.Metadata[kernel.LayoutKey], kernel.LayoutKey)
	}
	outs := make(map[string]*tensor.Tensor, len(f.Tensors))
	for name, t := range f.Tensors {
		if err := t.Check(); err != nil {
			return nil, nil, fmt.Sprintf("output tensor %s: %v", name, err)
		}
		outs[name] = t.Clone()
	}
	meta := make(map[string]string, len(f.Metadata))
	for k, v := range f.Metadata {
		meta[k] = v
	}
	return outs, meta, ""
}

func equalShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if s == "" {
		return "no message on stderr"
	}
	return s
}

func firstMatch(s, prefix string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) && len(strings.TrimSpace(strings.TrimPrefix(l, prefix))) > 0 {
			return strings.TrimSpace(l)
		}
	}
	return lastLine(s)
}

func firstContaining(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return strings.TrimSpace(l)
		}
	}
	return lastLine(s)
}
