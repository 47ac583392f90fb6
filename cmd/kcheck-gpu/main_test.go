//go:build cuda

package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kcheck-dev/kcheck/internal/gpu"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// On a GPU: the real worker (this test binary re-executed as kcheck-gpu)
// runs deliberately broken kernels, and the CLI side records each as that
// kernel's failure, then runs the next kernel on a fresh worker.

const selfEnv = "KCHECK_GPU_WORKER_SELF"

func TestMain(m *testing.M) {
	if os.Getenv(selfEnv) == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func ptxDir(t *testing.T) string {
	if d := os.Getenv("KCHECK_PTX_DIR"); d != "" {
		return d
	}
	for _, d := range []string{"../../cuda/ptx", "ptx"} {
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			abs, _ := filepath.Abs(d)
			return abs
		}
	}
	exe, _ := os.Executable()
	return filepath.Join(filepath.Dir(exe), "ptx")
}

func selfWorker(t *testing.T, fault string, timeout time.Duration) *gpu.Worker {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	env := []string{selfEnv + "=1"}
	if fault != "" {
		env = append(env, "KCHECK_GPU_FAULT="+fault)
	}
	return &gpu.Worker{Path: exe, Timeout: timeout, PTXDir: ptxDir(t), Env: env, TempDir: t.TempDir()}
}

// combine is a small valid splitk_combine call (N = 3, S = 2, L = 8).
func combine() kernel.Inputs {
	po := make([]float64, 3*2*8)
	for i := range po {
		po[i] = float64(i%7) - 3
	}
	return kernel.Inputs{Tensors: map[string]*tensor.Tensor{
		"partial_out": tensor.FromFloat64s(tensor.F32, []int{3, 2, 8}, po),
		"partial_lse": tensor.FromFloat64s(tensor.F32, []int{3, 2}, []float64{0, 1, -2, 0.5, 3, 3}),
	}, Params: kernel.Params{}}
}

func TestFaultsAreRecorded(t *testing.T) {
	cases := []struct {
		fault   string
		timeout time.Duration
		status  gpu.Status
	}{
		{"oob", time.Minute, gpu.StatusCrash},
		{"trap", time.Minute, gpu.StatusCrash},
		{"hang", 10 * time.Second, gpu.StatusHang},
	}
	for _, c := range cases {
		t.Run(c.fault, func(t *testing.T) {
			_, info, err := selfWorker(t, c.fault, c.timeout).Run(context.Background(), "splitk_combine", combine())
			if err == nil || info.Status != c.status {
				t.Fatalf("status %s (err %v, stderr %q), want %s", info.Status, err, info.Stderr, c.status)
			}
			if c.status == gpu.StatusCrash && !strings.HasPrefix(info.CUDAError, "CUDA_ERROR_") {
				t.Errorf("crash without a CUDA error name: stderr %q", info.Stderr)
			}
			t.Logf("%s: %v", c.fault, err)
			// The next kernel runs on a fresh worker and is fine.
			outs, info, err := selfWorker(t, "", time.Minute).Run(context.Background(), "splitk_combine", combine())
			if err != nil || info.Status != gpu.StatusOK || outs["out"] == nil || outs["lse"] == nil {
				t.Fatalf("the run after the %s fault: %s %v (stderr %q)", c.fault, info.Status, err, info.Stderr)
			}
		})
	}
}

// TestWorkerCapture: a normal run writes a capture whose metadata declares
// the kernel's precision and provenance.
func TestWorkerCapture(t *testing.T) {
	_, info, err := selfWorker(t, "", time.Minute).Run(context.Background(), "splitk_combine", combine())
	if err != nil {
		t.Fatalf("%v (stderr %q)", err, info.Stderr)
	}
	for _, k := range []string{"acc_dtype", "device", "driver", "kernel_build", "kcheck.cuda.ms", "kcheck.kernel"} {
		if info.Meta[k] == "" {
			t.Errorf("output metadata lacks %s: %v", k, info.Meta)
		}
	}
	if !strings.HasPrefix(info.Meta["kernel_build"], "sha256:") {
		t.Errorf("kernel_build = %q, want sha256:...", info.Meta["kernel_build"])
	}
}
