package gpu

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kcheck-dev/kcheck/cuda"
	"github.com/kcheck-dev/kcheck/internal/backend"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// DefaultTimeout bounds one kernel run when neither the backend spec nor
// $KCHECK_GPU_TIMEOUT sets one: module JIT on first load included.
const DefaultTimeout = 2 * time.Minute

// Backend is the "cuda" backend: each Run is one fresh worker.
type Backend struct {
	Worker *Worker
	// emulated: the worker is the cuda-emu one (ParseEmuBackend).
	emulated bool
}

// Emulated reports whether this is the cuda-emu backend.
func (b *Backend) Emulated() bool { return b.emulated }

func init() {
	backend.Register("cuda", func(arg string) (backend.Backend, error) { return ParseBackend(arg) })
}

// ParseBackend reads the text after "cuda:" in --backend: a comma list of
// worker=PATH, timeout=DURATION, sanitize, ptx-dir=DIR, repeat=N (all
// optional; $KCHECK_GPU_WORKER and $KCHECK_GPU_TIMEOUT are the defaults of
// worker and timeout).
func ParseBackend(arg string) (*Backend, error) {
	w := &Worker{Timeout: DefaultTimeout}
	if s := os.Getenv("KCHECK_GPU_TIMEOUT"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("KCHECK_GPU_TIMEOUT = %q: want a positive duration such as 30s", s)
		}
		w.Timeout = d
	}
	for _, opt := range strings.Split(arg, ",") {
		if opt == "" {
			continue
		}
		key, val, hasVal := strings.Cut(opt, "=")
		switch {
		case key == "worker" && hasVal && val != "":
			w.Path = val
		case key == "ptx-dir" && hasVal && val != "":
			w.PTXDir = val
		case key == "timeout" && hasVal:
			d, err := time.ParseDuration(val)
			if err != nil || d <= 0 {
				return nil, fmt.Errorf("backend cuda: timeout=%q: want a positive duration such as 30s", val)
			}
			w.Timeout = d
		case key == "repeat" && hasVal:
			n, err := strconv.Atoi(val)
			if err != nil || n < 1 {
				return nil, fmt.Errorf("backend cuda: repeat=%q: want a positive integer", val)
			}
			w.Repeat = n
		case key == "sanitize" && !hasVal:
			w.Sanitize = true
		default:
			return nil, fmt.Errorf("backend cuda: unknown option %q (want worker=PATH, timeout=DURATION, sanitize, ptx-dir=DIR, repeat=N)", opt)
		}
	}
	return &Backend{Worker: w}, nil
}

// Name implements backend.Backend.
func (b *Backend) Name() string {
	if b.emulated {
		return "cuda-emu"
	}
	return "cuda"
}

// Run implements backend.Backend. A failed run's error is a *RunError
// whose Info says whether the kernel crashed, hung, wrote garbage or could
// not run here.
func (b *Backend) Run(ctx context.Context, name string, in kernel.Inputs) (map[string]*tensor.Tensor, error) {
	if err := b.refuse(name); err != nil {
		return nil, err
	}
	outs, _, err := b.Worker.Run(ctx, name, in)
	return outs, err
}

// refuse is the error of a kernel the CUDA side will never implement
// (cuda.NoKernel), before a worker is looked for: the reason, not a
// missing GPU, is what the user needs to hear.
func (b *Backend) refuse(name string) error {
	why, never := cuda.NoKernel[name]
	if !never {
		return nil
	}
	return &RunError{Worker: b.Name() + " backend", Kernel: name, Info: RunInfo{Status: StatusUnsupported, ExitCode: -1}, Reason: why}
}

// RunMeta is Run plus the worker's output metadata: the kernel's declared
// precision (acc_dtype, p_dtype, kv_dequant_dtype, fp8_saturate), device,
// driver, kernel_build, the chosen num_splits and the kcheck.cuda.* timing
// keys, which a capture should carry.
func (b *Backend) RunMeta(ctx context.Context, name string, in kernel.Inputs) (map[string]*tensor.Tensor, map[string]string, RunInfo, error) {
	if err := b.refuse(name); err != nil {
		return nil, nil, RunInfo{Status: StatusUnsupported, ExitCode: -1}, err
	}
	outs, info, err := b.Worker.Run(ctx, name, in)
	return outs, info.Meta, info, err
}
