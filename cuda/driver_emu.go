//go:build cudaemu

package cuda

// The emulated device of the cuda-emu backend. The launchers (run_*.go)
// are the same as on a GPU; only what they call underneath differs: the
// kernel modules are shared objects built by cuda/emu from the unmodified
// .cu sources (make emu), loaded with dlopen from the module directory as
// the driver loads PTX, device memory is host memory (malloc, so an
// AddressSanitizer build checks every access), and a launch runs every
// block of the grid on the CPU, each CUDA thread a fiber.
//
// Everything this device produces is labelled emulation: its name, the
// kcheck.emulation key, and kernel_build (the module's sha256). It cannot
// check the hardware's ex2.approx/rcp.approx bits, the tensor cores'
// accumulation order, nvcc's fused multiply-adds, or timing.

/*
#cgo LDFLAGS: -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <unistd.h>
#include <link.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct { int late, reverse, smem_limit, poison; } KcEmuConfig;
typedef int (*kc_launch_fn)(const char*, const int*, const int*, int, const uint64_t*, int, const KcEmuConfig*, char*, int);

// A fault inside an emulated kernel (a wild pointer, a fiber's stack guard
// page) is what CUDA_ERROR_ILLEGAL_ADDRESS is on a GPU: the worker says so
// and exits with the CUDA-error status instead of dying in the Go runtime's
// cgo crash path (exit 2, which reads as bad input).
static void kc_emu_fault(int sig, siginfo_t* si, void* uc) {
	char msg[160];
	static const char hex[] = "0123456789abcdef";
	const char* head = sig == SIGSEGV || sig == SIGBUS ? "kcheck-gpu: CUDA error CUDA_ERROR_ILLEGAL_ADDRESS: emulated kernel faulted at address 0x"
	                 : "kcheck-gpu: CUDA error CUDA_ERROR_LAUNCH_FAILED: emulated kernel raised a fatal signal at address 0x";
	size_t n = strlen(head);
	memcpy(msg, head, n);
	uintptr_t a = (uintptr_t)si->si_addr;
	for (int i = 15; i >= 0; --i) msg[n++] = hex[(a >> (4 * i)) & 15];
	msg[n++] = '\n';
	(void)uc;
	(void)!write(2, msg, n);
	_exit(3);
}

static int kc_emu_call_launch(void* f, const char* name, const int* grid, const int* block, int smem,
                              const uint64_t* args, int nargs, const KcEmuConfig* cfg, char* err, int errlen) {
	static const int sigs[4] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
	struct sigaction sa, old[4];
	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = kc_emu_fault;
	sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
	for (int i = 0; i < 4; ++i) sigaction(sigs[i], &sa, &old[i]);
	int r = ((kc_launch_fn)f)(name, grid, block, smem, args, nargs, cfg, err, errlen);
	for (int i = 0; i < 4; ++i) sigaction(sigs[i], &old[i], NULL);
	return r;
}
// Device addresses are host addresses carried as integers on the Go side.
static void kc_emu_to_dev(uint64_t dst, const void* src, size_t n) { memcpy((void*)(uintptr_t)dst, src, n); }
static void kc_emu_from_dev(void* dst, uint64_t src, size_t n) { memcpy(dst, (const void*)(uintptr_t)src, n); }
static void kc_emu_fill(uint64_t dst, int v, size_t n) { memset((void*)(uintptr_t)dst, v, n); }

// kc_emu_sym_size is the ELF size of the symbol at addr (cuModuleGetGlobal's size).
static long kc_emu_sym_size(void* addr) {
	Dl_info info;
	const ElfW(Sym)* sym = NULL;
	if (!dladdr1(addr, &info, (void**)&sym, RTLD_DL_SYMENT) || sym == NULL) return -1;
	return (long)sym->st_size;
}
*/
import "C"

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"unsafe"

	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Emulated is true in a build with the cudaemu tag: Device runs on the CPU.
const Emulated = true

// EmulationLimits is what every emulated result says it cannot check.
const EmulationLimits = "EMULATION on the CPU (cuda-emu), not a GPU: cannot check the hardware's ex2.approx/rcp.approx bits " +
	"(computed as the nearest float), the tensor cores' accumulation order (each mma sums exactly and rounds once to fp32), " +
	"nvcc's fused multiply-adds, or timing"

// emuArch is an emulated GPU: the limits the launchers read.
type emuArch struct {
	major, minor, sms, smemOptin int
	name                         string
}

// The emulated architectures. SM counts and opt-in shared memory are those
// of the parts named (A100, H100 SXM, RTX PRO 6000 Blackwell): they decide
// the launchers' split counts and MLA variants, nothing else.
var emuArchs = map[string]emuArch{
	"sm_80":  {8, 0, 108, 166912, "A100"},
	"sm_90":  {9, 0, 132, 232448, "H100 SXM"},
	"sm_120": {12, 0, 188, 101376, "RTX PRO 6000 Blackwell"},
}

// EmuArchs lists the emulated architectures.
func EmuArchs() []string { return []string{"sm_80", "sm_90", "sm_120"} }

// Device is the emulated GPU.
type Device struct {
	Info    DeviceInfo
	dir     string
	ptxOnly bool
	mods    map[string]*module
	cfg     C.KcEmuConfig
	arch    string
}

// module is one loaded emulation module.
type module struct {
	handle unsafe.Pointer
	launch unsafe.Pointer
	file   string
	build  string
	smem   map[string]int // raised dynamic shared memory limits (cuFuncSetAttribute)
}

// DefaultEmuDir is where the emulated modules are looked for when no
// directory is given: $KCHECK_EMU_DIR, then emu/ next to the executable,
// then build/emu under the working directory (after `make emu`).
func DefaultEmuDir() string {
	if d := os.Getenv("KCHECK_EMU_DIR"); d != "" {
		return d
	}
	if exe, err := os.Executable(); err == nil {
		d := filepath.Join(filepath.Dir(exe), "emu")
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			return d
		}
	}
	return filepath.Join("build", "emu")
}

// Open creates the emulated device. OpenOptions.PTXDir is the module
// directory; the emulation settings come from the environment (the worker
// protocol passes them so): KCHECK_EMU_ARCH (sm_80, sm_90 default,
// sm_120), KCHECK_EMU_CP_ASYNC (late default: data lands at wait_group;
// early: at issue), KCHECK_EMU_ORDER (forward default, reverse: the warps
// of a block run last to first), KCHECK_EMU_SMS (override the SM count).
func Open(opts OpenOptions) (*Device, error) {
	arch := envOr("KCHECK_EMU_ARCH", "sm_90")
	a, ok := emuArchs[arch]
	if !ok {
		return nil, fmt.Errorf("KCHECK_EMU_ARCH = %q: the emulated architectures are %v", arch, EmuArchs())
	}
	d := &Device{dir: opts.PTXDir, ptxOnly: opts.PTXOnly, mods: map[string]*module{}, arch: arch}
	if d.dir == "" {
		d.dir = DefaultEmuDir()
	}
	d.Info = DeviceInfo{Name: "EMULATION of " + arch + " (" + a.name + " limits; cuda-emu on the CPU)",
		Major: a.major, Minor: a.minor, SMs: a.sms, SmemOptin: a.smemOptin}
	if s := os.Getenv("KCHECK_EMU_SMS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 1024 {
			return nil, fmt.Errorf("KCHECK_EMU_SMS = %q: want an SM count in 1..1024", s)
		}
		d.Info.SMs = n
	}
	switch v := envOr("KCHECK_EMU_CP_ASYNC", "late"); v {
	case "late":
		d.cfg.late = 1
	case "early":
	default:
		return nil, fmt.Errorf("KCHECK_EMU_CP_ASYNC = %q: want late or early", v)
	}
	switch v := envOr("KCHECK_EMU_ORDER", "forward"); v {
	case "forward":
	case "reverse":
		d.cfg.reverse = 1
	default:
		return nil, fmt.Errorf("KCHECK_EMU_ORDER = %q: want forward or reverse", v)
	}
	d.cfg.smem_limit = C.int(a.smemOptin)
	d.cfg.poison = 1
	return d, nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// Close unloads nothing: the modules live as long as the process.
func (d *Device) Close() error { return nil }

func (d *Device) bind() func() { return func() {} }

// describe labels every output of the emulated device.
func (d *Device) describe(meta map[string]string) {
	meta["kcheck.emulation"] = EmulationLimits
	meta["driver"] = "none (emulation)"
	meta["kcheck.cuda.arch"] = d.arch + " (emulated)"
	mode := "late"
	if d.cfg.late == 0 {
		mode = "early"
	}
	order := "forward"
	if d.cfg.reverse != 0 {
		order = "reverse"
	}
	meta["kcheck.emu.cp_async"] = mode
	meta["kcheck.emu.order"] = order
}

// load opens kernel file name's module, preferring the build for this
// architecture (NAME.sm_120a.emu.so), as the driver prefers a cubin.
func (d *Device) load(name string) (*module, error) {
	if m, ok := d.mods[name]; ok {
		return m, nil
	}
	var cands []string
	if !d.ptxOnly {
		cands = append(cands, name+"."+d.Info.Arch()+"a.emu.so", name+"."+d.Info.Arch()+".emu.so")
	}
	cands = append(cands, name+".emu.so")
	for _, c := range cands {
		path := filepath.Join(d.dir, c)
		image, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		abs, err := filepath.Abs(path)
		if err != nil {
			return nil, err
		}
		cpath := C.CString(abs)
		h := C.dlopen(cpath, C.RTLD_NOW|C.RTLD_LOCAL)
		C.free(unsafe.Pointer(cpath))
		if h == nil {
			return nil, &Error{Op: "dlopen(" + path + ")", Code: 200, Name: "CUDA_ERROR_INVALID_IMAGE", Detail: C.GoString(C.dlerror())}
		}
		m := &module{handle: h, file: c, smem: map[string]int{}}
		if m.launch = m.sym("kc_emu_launch"); m.launch == nil {
			return nil, &Error{Op: "loading " + path, Code: 200, Name: "CUDA_ERROR_INVALID_IMAGE", Detail: "not a cuda-emu module (no kc_emu_launch)"}
		}
		sum := sha256.Sum256(image)
		m.build = "sha256:" + hex.EncodeToString(sum[:]) + " (cuda-emu module)"
		d.mods[name] = m
		return m, nil
	}
	return nil, fmt.Errorf("no %s.emu.so in %s (run `make emu`, or set KCHECK_EMU_DIR)", name, d.dir)
}

func (m *module) sym(name string) unsafe.Pointer {
	c := C.CString(name)
	defer C.free(unsafe.Pointer(c))
	return C.dlsym(m.handle, c)
}

// globalInt reads an `extern "C" __device__ int` of the module.
func (m *module) globalInt(name string) (int, error) {
	p := m.sym(name)
	if p == nil {
		return 0, &Error{Op: "cuModuleGetGlobal(" + name + ")", Code: 500, Name: "CUDA_ERROR_NOT_FOUND"}
	}
	if n := C.kc_emu_sym_size(p); n != 4 {
		return 0, fmt.Errorf("module global %s has %d bytes, want 4", name, n)
	}
	return int(*(*int32)(p)), nil
}

// arena owns the host buffers that stand for device memory in one Run.
type arena struct{ ptrs []unsafe.Pointer }

// alloc returns uninitialized memory as cuMemAlloc does; it is filled with
// 0xFF bytes (NaN in every float format) so that an output element a kernel
// never writes cannot pass as a plausible value.
func (a *arena) alloc(bytes int64) (devPtr, error) {
	if bytes < 1 {
		bytes = 1
	}
	p := C.malloc(C.size_t(bytes))
	if p == nil {
		return 0, &Error{Op: fmt.Sprintf("cuMemAlloc(%d)", bytes), Code: 2, Name: "CUDA_ERROR_OUT_OF_MEMORY"}
	}
	C.memset(p, 0xff, C.size_t(bytes))
	a.ptrs = append(a.ptrs, p)
	return devPtr(uintptr(p)), nil
}

func (a *arena) upload(b []byte) (devPtr, error) {
	p, err := a.alloc(int64(len(b)))
	if err != nil || len(b) == 0 {
		return p, err
	}
	C.kc_emu_to_dev(C.uint64_t(p), unsafe.Pointer(&b[0]), C.size_t(len(b)))
	return p, nil
}

func (a *arena) zeros(bytes int64) (devPtr, error) {
	p, err := a.alloc(bytes)
	if err != nil {
		return p, err
	}
	C.kc_emu_fill(C.uint64_t(p), 0, C.size_t(max(bytes, 1)))
	return p, nil
}

func (a *arena) free() {
	for _, p := range a.ptrs {
		C.free(p)
	}
	a.ptrs = nil
}

func download(p devPtr, d tensor.DType, shape ...int) (*tensor.Tensor, error) {
	t := tensor.New(d, shape...)
	if len(t.Data) > 0 {
		C.kc_emu_from_dev(unsafe.Pointer(&t.Data[0]), C.uint64_t(p), C.size_t(len(t.Data)))
	}
	return t, nil
}

// cudaCodes are the CUresult values of the error names the runtime reports.
var cudaCodes = map[string]int{
	"CUDA_ERROR_INVALID_VALUE": 1, "CUDA_ERROR_OUT_OF_MEMORY": 2, "CUDA_ERROR_INVALID_IMAGE": 200,
	"CUDA_ERROR_NOT_FOUND": 500, "CUDA_ERROR_ILLEGAL_ADDRESS": 700, "CUDA_ERROR_ILLEGAL_INSTRUCTION": 715,
	"CUDA_ERROR_MISALIGNED_ADDRESS": 716, "CUDA_ERROR_LAUNCH_FAILED": 719, "CUDA_ERROR_NOT_SUPPORTED": 801,
}

func (d *Device) enqueue(l launch) error {
	for i, g := range l.grid {
		if g <= 0 {
			return fmt.Errorf("launch %s: grid dimension %d is %d", l.fn, i, g)
		}
	}
	// As the driver: more than 48 KB of dynamic shared memory needs the
	// function's limit raised first, which the GPU launcher does in enqueue.
	if l.smem > 48<<10 && l.mod.smem[l.fn] < l.smem {
		if l.smem > d.Info.SmemOptin {
			return &Error{Op: "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)", Code: 1, Name: "CUDA_ERROR_INVALID_VALUE",
				Detail: fmt.Sprintf("emulation: %d bytes, the device allows %d", l.smem, d.Info.SmemOptin)}
		}
		l.mod.smem[l.fn] = l.smem
	}
	name := C.CString(l.fn)
	defer C.free(unsafe.Pointer(name))
	grid := [3]C.int{C.int(l.grid[0]), C.int(l.grid[1]), C.int(l.grid[2])}
	block := [3]C.int{C.int(l.block), 1, 1}
	var args *C.uint64_t
	if len(l.args) > 0 {
		// C memory: the runtime keeps the pointer for the whole launch.
		n := C.size_t(8 * len(l.args))
		cargs := (*C.uint64_t)(C.malloc(n))
		defer C.free(unsafe.Pointer(cargs))
		C.memcpy(unsafe.Pointer(cargs), unsafe.Pointer(&l.args[0]), n)
		args = cargs
	}
	const errLen = 2048
	errBuf := (*C.char)(C.malloc(errLen))
	defer C.free(unsafe.Pointer(errBuf))
	cfg := d.cfg
	if r := C.kc_emu_call_launch(l.mod.launch, name, &grid[0], &block[0], C.int(l.smem), args, C.int(len(l.args)), &cfg, errBuf, errLen); r != 0 {
		msg := C.GoString(errBuf)
		ename, detail, _ := strings.Cut(msg, ": ")
		return &Error{Op: "kernel " + l.fn + " (emulated)", Code: cudaCodes[ename], Name: ename, Detail: detail}
	}
	return nil
}

// runPlan runs the launches once: the emulator's times are not device
// times, so no kcheck.cuda.ms is reported (repeat only repeats the work).
func (d *Device) runPlan(plan []launch, repeat int) ([]float64, error) {
	for r := 0; r < max(repeat, 1); r++ {
		for _, l := range plan {
			if err := d.enqueue(l); err != nil {
				return nil, err
			}
		}
	}
	return nil, nil
}

// CopyMillis has no meaning in emulation.
func (d *Device) CopyMillis(bytes int64, repeat int) (float64, error) {
	return 0, unsupported("cuda-emu measures no device time (%s)", EmulationLimits)
}
