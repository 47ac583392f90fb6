package gpu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/kcheck-dev/kcheck/internal/backend"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// The cuda-emu backend: the same worker protocol as cuda (an evidence file
// in, one out, typed exit codes, a timeout, a fresh process a kernel), run
// by kcheck-gpu built with the cudaemu tag (make emu), which executes the
// unmodified .cu kernels on the CPU. Its results carry the device name
// "EMULATION of ..." and the kcheck.emulation key, which the checker turns
// into a note on every result: it is never a GPU result.

// EmuDefaultTimeout bounds one emulated kernel run: the emulator is some
// thousand times slower than a GPU.
const EmuDefaultTimeout = 10 * time.Minute

func init() {
	backend.Register("cuda-emu", func(arg string) (backend.Backend, error) { return ParseEmuBackend(arg) })
}

// FindEmuWorker locates the emulated worker: $KCHECK_EMU_WORKER, then
// kcheck-gpu-emu next to the running executable, then bin/kcheck-gpu-emu
// under the working directory, then PATH.
func FindEmuWorker() (string, error) {
	if p := os.Getenv("KCHECK_EMU_WORKER"); p != "" {
		return p, nil
	}
	var cands []string
	if exe, err := os.Executable(); err == nil {
		cands = append(cands, filepath.Join(filepath.Dir(exe), "kcheck-gpu-emu"))
	}
	cands = append(cands, filepath.Join("bin", "kcheck-gpu-emu"))
	for _, p := range cands {
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	p, err := exec.LookPath("kcheck-gpu-emu")
	if err != nil {
		return "", errors.New("no emulated worker: run `make emu` (bin/kcheck-gpu-emu), or set KCHECK_EMU_WORKER")
	}
	return p, nil
}

// ParseEmuBackend reads the text after "cuda-emu:": a comma list of
// worker=PATH, dir=DIR (the modules, default build/emu), timeout=DURATION,
// arch=sm_80|sm_90|sm_120 (the emulated device's limits and module
// choice, default sm_90), cp-async=late|early (when cp.async data lands:
// at wait_group, the default, or at issue), order=forward|reverse (the
// order of the warps of a block), sms=N, asan (the AddressSanitizer
// modules of make emu-asan, dir default build/emu-asan).
func ParseEmuBackend(arg string) (*Backend, error) {
	w := &Worker{Timeout: EmuDefaultTimeout, Find: FindEmuWorker}
	var dir string
	asan := false
	for _, opt := range strings.Split(arg, ",") {
		if opt == "" {
			continue
		}
		key, val, hasVal := strings.Cut(opt, "=")
		switch {
		case key == "worker" && hasVal && val != "":
			w.Path = val
		case key == "dir" && hasVal && val != "":
			dir = val
		case key == "timeout" && hasVal:
			d, err := time.ParseDuration(val)
			if err != nil || d <= 0 {
				return nil, fmt.Errorf("backend cuda-emu: timeout=%q: want a positive duration such as 30s", val)
			}
			w.Timeout = d
		case key == "arch" && (val == "sm_80" || val == "sm_90" || val == "sm_120"):
			w.Env = append(w.Env, "KCHECK_EMU_ARCH="+val)
		case key == "cp-async" && (val == "late" || val == "early"):
			w.Env = append(w.Env, "KCHECK_EMU_CP_ASYNC="+val)
		case key == "order" && (val == "forward" || val == "reverse"):
			w.Env = append(w.Env, "KCHECK_EMU_ORDER="+val)
		case key == "sms" && hasVal && val != "":
			w.Env = append(w.Env, "KCHECK_EMU_SMS="+val)
		case key == "asan" && !hasVal:
			asan = true
		default:
			return nil, fmt.Errorf("backend cuda-emu: unknown option %q (want worker=PATH, dir=DIR, timeout=DURATION, arch=sm_80|sm_90|sm_120, cp-async=late|early, order=forward|reverse, sms=N, asan)", opt)
		}
	}
	if dir == "" {
		dir = filepath.Join("build", "emu")
		if asan {
			dir = filepath.Join("build", "emu-asan")
		}
	}
	w.PTXDir = dir
	if asan {
		// The modules are instrumented; the Go worker is not, so the
		// runtime comes first by preloading. ASan's errors exit with the
		// memcheck status.
		lib, err := asanRuntime()
		if err != nil {
			return nil, err
		}
		w.Env = append(w.Env, "LD_PRELOAD="+lib, "ASAN_OPTIONS=exitcode=6:detect_leaks=0:handle_segv=0:allow_user_segv_handler=1")
	}
	return &Backend{Worker: w, emulated: true}, nil
}

// asanRuntime is the path of the compiler's libasan.
func asanRuntime() (string, error) {
	cxx := os.Getenv("CXX")
	if cxx == "" {
		cxx = "g++"
	}
	out, err := exec.Command(cxx, "-print-file-name=libasan.so").Output()
	p := strings.TrimSpace(string(out))
	if err != nil || !filepath.IsAbs(p) {
		return "", fmt.Errorf("backend cuda-emu: asan needs %s's libasan.so (%s -print-file-name=libasan.so said %q)", cxx, cxx, p)
	}
	return p, nil
}

// RunWithMeta is Run plus the metadata the worker wrote into its outputs,
// which a capture of the run must carry, on the cuda backend and in
// emulation alike (cuda/cuda_test.go builds its captures the same way):
// the kernel's declared precision (acc_dtype, p_dtype, kv_dequant_dtype,
// fp8_saturate, softmax_block: cuda/precision.go, from each .cu file's
// kcheck:precision line), what the launcher chose (num_splits,
// ds_mla_scale), device, driver, kernel_build, source, and the
// kcheck.emulation, kcheck.emu.* and kcheck.cuda.* keys. Judged without the
// declared precision, a correct kernel with a 32-token softmax tile reads as
// inconclusive against FlashMLA's 64.
func (b *Backend) RunWithMeta(ctx context.Context, name string, in kernel.Inputs) (map[string]*tensor.Tensor, map[string]string, error) {
	outs, info, err := b.Worker.Run(ctx, name, in)
	if err != nil {
		return outs, nil, err
	}
	meta := make(map[string]string, len(info.Meta))
	for k, v := range info.Meta {
		meta[k] = v
	}
	return outs, meta, nil
}
