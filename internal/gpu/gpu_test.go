package gpu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kcheck-dev/kcheck/internal/backend"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/safetensors"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// The fake worker is this test binary re-executed with $FAKE_GPU_WORKER
// naming a behaviour. It speaks the worker's protocol (run --kernel K --in
// IN --out OUT) and plays one of the ways a real GPU worker ends: a correct
// output, a CUDA error, death by signal, a hang (with a child process, so
// the whole group must be killed), a garbage or incomplete output file, no
// GPU at all.
const fakeEnv = "FAKE_GPU_WORKER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(fakeEnv); mode != "" {
		os.Exit(fakeWorker(mode, os.Args[1:]))
	}
	os.Exit(m.Run())
}

func fakeWorker(mode string, argv []string) int {
	if mode == "sleep" { // the hanging worker's child
		time.Sleep(time.Hour)
		return 0
	}
	var in, out string
	for i := 0; i+1 < len(argv); i++ {
		switch argv[i] {
		case "--in":
			in = argv[i+1]
		case "--out":
			out = argv[i+1]
		}
	}
	if len(argv) == 0 || argv[0] != "run" || in == "" || out == "" {
		fmt.Fprintln(os.Stderr, "fake worker: bad command line", argv)
		return ExitUsage
	}
	switch mode {
	case "crash":
		fmt.Fprintln(os.Stderr, "kcheck-gpu: CUDA error CUDA_ERROR_ILLEGAL_ADDRESS: kernel execution (cuEventSynchronize): CUDA_ERROR_ILLEGAL_ADDRESS (700)")
		return ExitCUDA
	case "signal":
		fmt.Fprintln(os.Stderr, "about to die")
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		time.Sleep(time.Hour)
	case "hang":
		child, err := os.StartProcess(os.Args[0], []string{os.Args[0]}, &os.ProcAttr{
			Env: append(os.Environ(), fakeEnv+"=sleep"), Files: []*os.File{nil, nil, os.Stderr}})
		if err == nil {
			_ = os.WriteFile(out+".child", []byte(strconv.Itoa(child.Pid)), 0o644)
		}
		time.Sleep(time.Hour)
	case "garbage":
		_ = os.WriteFile(out, []byte("\x07\x00\x00\x00\x00\x00\x00\x00{\"bad"), 0o644)
		return ExitOK
	case "nooutput":
		return ExitOK
	case "nogpu":
		// What gorgonia.org/cu's init prints before os.Exit(1).
		fmt.Println(`Error in initialization, please refer to "https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__INITIALIZE.html" for details on: NoDevice`)
		return ExitInternal
	case "loadfail":
		// What cmd/kcheck-gpu prints for a *cuda.LoadError.
		fmt.Fprintln(os.Stderr, "kcheck-gpu: kernel image not loadable (CUDA_ERROR_UNSUPPORTED_PTX_VERSION): loading ptx/mla_decode.ptx: cuModuleLoadDataEx: CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222)")
		return ExitLoad
	case "unsupported":
		fmt.Fprintln(os.Stderr, "kcheck-gpu: unsupported: tensor q has D = 64")
		return ExitUnsupported
	case "badinput":
		fmt.Fprintln(os.Stderr, "kcheck-gpu: input: block_table[0,1] = 99 is outside the cache (NB = 4)")
		return ExitUsage
	case "ok", "missing":
		f, err := safetensors.Open(in)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return ExitInternal
		}
		defer f.Close()
		po := f.Tensors["partial_out"]
		n, l := po.Shape[0], po.Shape[2]
		outs := map[string]*tensor.Tensor{}
		for k, v := range f.Tensors {
			outs[k] = v
		}
		// out[i] = i/4 (exact in bf16 for small i), lse = 1.5 everywhere.
		o := make([]float64, n*l)
		for i := range o {
			o[i] = float64(i) / 4
		}
		outs["out"] = tensor.FromFloat64s(tensor.BF16, []int{n, l}, o)
		if mode == "ok" {
			lse := make([]float64, n)
			for i := range lse {
				lse[i] = 1.5
			}
			outs["lse"] = tensor.FromFloat64s(tensor.F32, []int{n}, lse)
		}
		meta := map[string]string{"device": "fake GPU", "acc_dtype": "f32", "kcheck.kernel": f.Metadata["kcheck.kernel"],
			"seen.lse_base": f.Metadata["lse_base"]}
		if err := safetensors.Write(out, meta, outs, safetensors.WriteOptions{}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return ExitInternal
		}
		return ExitOK
	}
	fmt.Fprintln(os.Stderr, "fake worker: unknown mode", mode)
	return ExitInternal
}

// combineInputs is a small splitk_combine call (N = 2 rows, S = 3, L = 4).
func combineInputs() kernel.Inputs {
	po := make([]float64, 2*3*4)
	for i := range po {
		po[i] = float64(i%5) - 2
	}
	return kernel.Inputs{
		Tensors: map[string]*tensor.Tensor{
			"partial_out": tensor.FromFloat64s(tensor.F32, []int{2, 3, 4}, po),
			"partial_lse": tensor.FromFloat64s(tensor.F32, []int{2, 3}, []float64{0, 1, 2, 3, 4, 5}),
		},
		Params: kernel.Params{"lse_base": "2"},
	}
}

func fakeWorkerFor(t *testing.T, mode string) *Worker {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return &Worker{Path: exe, Timeout: 10 * time.Second, Env: []string{fakeEnv + "=" + mode}, TempDir: t.TempDir()}
}

func TestWorkerOK(t *testing.T) {
	w := fakeWorkerFor(t, "ok")
	in := combineInputs()
	outs, info, err := w.Run(context.Background(), "splitk_combine", in)
	if err != nil {
		t.Fatalf("Run: %v (stderr %q)", err, info.Stderr)
	}
	if info.Status != StatusOK || info.ExitCode != 0 {
		t.Fatalf("status %s exit %d, want ok 0", info.Status, info.ExitCode)
	}
	// Only the outputs come back; the unchanged inputs do not.
	if len(outs) != 2 || outs["out"] == nil || outs["lse"] == nil {
		t.Fatalf("outputs %v, want exactly out and lse", keys(outs))
	}
	// The temporary files are gone, so the tensors must own their bytes.
	if got := outs["out"].Float64At(5); got != 1.25 {
		t.Errorf("out[5] = %v, want 5/4 = 1.25", got)
	}
	if got := outs["lse"].Float64At(1); got != 1.5 {
		t.Errorf("lse[1] = %v, want 1.5", got)
	}
	if info.Meta["device"] != "fake GPU" || info.Meta["seen.lse_base"] != "2" {
		t.Errorf("meta %v: want the worker's device and the parameter it was given (lse_base 2)", info.Meta)
	}
	// Re-running a capture whose outputs are already in the inputs: the
	// outputs still come back, even when equal to what was there.
	in.Tensors["lse"] = outs["lse"]
	again, _, err := w.Run(context.Background(), "splitk_combine", in)
	if err != nil || again["lse"] == nil || again["partial_out"] != nil {
		t.Errorf("re-run with lse among the inputs: outputs %v, err %v; want out and lse only", keys(again), err)
	}
	if ents, _ := os.ReadDir(w.TempDir); len(ents) != 0 {
		t.Errorf("exchange files left behind: %v", ents)
	}
}

func TestWorkerFailures(t *testing.T) {
	cases := []struct {
		mode      string
		status    Status
		exit      int
		cudaError string
		reason    string // in the error message
	}{
		{"crash", StatusCrash, ExitCUDA, "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_ILLEGAL_ADDRESS"},
		{"signal", StatusCrash, -1, "", "signal killed"},
		{"garbage", StatusGarbage, 0, "", "unreadable"},
		{"nooutput", StatusGarbage, 0, "", "unreadable"},
		{"missing", StatusGarbage, 0, "", "no tensor lse"},
		{"nogpu", StatusUnavailable, ExitInternal, "", "no usable GPU"},
		// A JIT failure is its own status, not a crash, though the CUDA
		// error name is still read from stderr.
		{"loadfail", StatusLoadFailed, ExitLoad, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "kernel image not loadable"},
		{"unsupported", StatusUnsupported, ExitUnsupported, "", "D = 64"},
		{"badinput", StatusBadInput, ExitUsage, "", "block_table[0,1] = 99"},
	}
	for _, c := range cases {
		t.Run(c.mode, func(t *testing.T) {
			outs, info, err := fakeWorkerFor(t, c.mode).Run(context.Background(), "splitk_combine", combineInputs())
			var re *RunError
			if !errors.As(err, &re) {
				t.Fatalf("err = %v, want a *RunError", err)
			}
			if outs != nil {
				t.Errorf("outputs %v from a failed run", keys(outs))
			}
			if info.Status != c.status || re.Info.Status != c.status {
				t.Errorf("status %s, want %s (err %v)", info.Status, c.status, err)
			}
			if info.ExitCode != c.exit {
				t.Errorf("exit code %d, want %d", info.ExitCode, c.exit)
			}
			if info.CUDAError != c.cudaError {
				t.Errorf("CUDA error %q, want %q", info.CUDAError, c.cudaError)
			}
			if !strings.Contains(err.Error(), c.reason) {
				t.Errorf("error %q does not mention %q", err, c.reason)
			}
		})
	}
}

// TestWorkerHang: a worker that never answers is killed at the timeout
// (TestWorkerHangKillsChildren checks its children die with it), and the
// next run, on a fresh worker, works.
func TestWorkerHang(t *testing.T) {
	w := fakeWorkerFor(t, "hang")
	w.Timeout = time.Second
	start := time.Now()
	_, info, err := w.Run(context.Background(), "splitk_combine", combineInputs())
	if info.Status != StatusHang || err == nil {
		t.Fatalf("status %s err %v, want hang", info.Status, err)
	}
	if el := time.Since(start); el > 8*time.Second {
		t.Errorf("took %v to give up on a 1s timeout", el)
	}
	// Killed by us, not exited by itself.
	if info.Signal != "killed" {
		t.Errorf("worker signal %q, want killed", info.Signal)
	}
	ok := fakeWorkerFor(t, "ok")
	if _, info, err := ok.Run(context.Background(), "splitk_combine", combineInputs()); err != nil || info.Status != StatusOK {
		t.Fatalf("the next run after a hang: %s %v", info.Status, err)
	}
}

// TestWorkerHangKillsChildren starts a hanging worker whose child records
// its pid in a directory we keep, and checks that the child is gone.
func TestWorkerHangKillsChildren(t *testing.T) {
	keep := t.TempDir()
	w := fakeWorkerFor(t, "hang")
	w.Timeout = time.Second
	w.TempDir = keep
	// The exchange directory is removed after the run; the child's pid file
	// lives in it, so watch for it while the worker hangs.
	pidc := make(chan int, 1)
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			m, _ := filepath.Glob(filepath.Join(keep, "*", "out.safetensors.child"))
			if len(m) > 0 {
				if b, err := os.ReadFile(m[0]); err == nil && len(b) > 0 {
					if pid, err := strconv.Atoi(string(b)); err == nil {
						pidc <- pid
						return
					}
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	_, info, _ := w.Run(context.Background(), "splitk_combine", combineInputs())
	close(stop)
	if info.Status != StatusHang {
		t.Fatalf("status %s, want hang", info.Status)
	}
	select {
	case pid := <-pidc:
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) && alive(pid) {
			time.Sleep(20 * time.Millisecond)
		}
		if alive(pid) {
			t.Errorf("the hanging worker's child %d survived the group kill", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	default:
		t.Skip("the child's pid file was not seen in time; group kill not observed")
	}
}

// alive reports whether pid runs (a zombie awaiting its reaper counts as dead).
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	f := strings.Fields(string(b))
	return !(len(f) > 2 && (f[2] == "Z" || f[2] == "X"))
}

func TestWorkerCanceled(t *testing.T) {
	w := fakeWorkerFor(t, "hang")
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	_, info, err := w.Run(ctx, "splitk_combine", combineInputs())
	if info.Status != StatusCanceled || err == nil {
		t.Fatalf("status %s err %v, want canceled", info.Status, err)
	}
}

func TestWorkerUnavailable(t *testing.T) {
	w := &Worker{Path: filepath.Join(t.TempDir(), "no-such-worker"), Timeout: time.Second}
	_, info, err := w.Run(context.Background(), "splitk_combine", combineInputs())
	if info.Status != StatusUnavailable || err == nil {
		t.Fatalf("status %s err %v, want unavailable", info.Status, err)
	}
	if _, info, err := w.Run(context.Background(), "no_such_kernel", combineInputs()); info.Status != StatusBadInput || err == nil {
		t.Fatalf("unknown kernel: status %s err %v, want bad_input", info.Status, err)
	}
}

// TestSanitize wraps the worker in a stand-in compute-sanitizer (a shell
// script that checks the memcheck arguments, then runs or refuses).
func TestSanitize(t *testing.T) {
	dir := t.TempDir()
	mark := filepath.Join(dir, "args")
	script := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pass := script("sanitizer-pass", `echo "$1 $2 $3 $4" > `+mark+`
shift 4
exec "$@"
`)
	found := script("sanitizer-found", `echo "========= Invalid __global__ read of size 4 bytes" >&2
echo "========= ERROR SUMMARY: 1 error" >&2
exit 6
`)
	w := fakeWorkerFor(t, "ok")
	w.Sanitize, w.SanitizerPath = true, pass
	if _, info, err := w.Run(context.Background(), "splitk_combine", combineInputs()); err != nil || info.Status != StatusOK {
		t.Fatalf("sanitized ok run: %s %v (stderr %q)", info.Status, err, info.Stderr)
	}
	if b, _ := os.ReadFile(mark); strings.TrimSpace(string(b)) != "--tool memcheck --error-exitcode 6" {
		t.Errorf("sanitizer arguments %q, want --tool memcheck --error-exitcode 6", b)
	}
	w.SanitizerPath = found
	_, info, err := w.Run(context.Background(), "splitk_combine", combineInputs())
	if info.Status != StatusMemcheck || err == nil || !strings.Contains(err.Error(), "Invalid __global__ read") {
		t.Fatalf("memcheck errors: status %s err %v", info.Status, err)
	}
}

func TestParseBackend(t *testing.T) {
	b, err := backend.Parse("cuda:worker=/opt/kcheck-gpu,timeout=30s,sanitize,ptx-dir=/opt/ptx,repeat=5")
	if err != nil {
		t.Fatal(err)
	}
	cb, ok := b.(*Backend)
	if !ok {
		t.Fatalf("backend.Parse(cuda:...) gave %T", b)
	}
	w := cb.Worker
	if w.Path != "/opt/kcheck-gpu" || w.Timeout != 30*time.Second || !w.Sanitize || w.PTXDir != "/opt/ptx" || w.Repeat != 5 {
		t.Errorf("parsed %+v", *w)
	}
	if b.Name() != "cuda" {
		t.Errorf("Name() = %q", b.Name())
	}
	for _, bad := range []string{"cuda:timeout=-1s", "cuda:repeat=0", "cuda:bogus", "cuda:sanitize=yes"} {
		if _, err := backend.Parse(bad); err == nil {
			t.Errorf("backend.Parse(%q) accepted", bad)
		}
	}
	d, err := ParseBackend("")
	if err != nil || d.Worker.Timeout != DefaultTimeout {
		t.Errorf("default backend: %v, timeout %v", err, d.Worker.Timeout)
	}
}

func keys(m map[string]*tensor.Tensor) []string {
	var k []string
	for n := range m {
		k = append(k, n)
	}
	return k
}
