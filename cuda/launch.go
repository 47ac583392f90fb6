//go:build cuda

package cuda

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// InputError is a problem with the inputs (a shape, a dtype, an index out
// of range), named as the contract names it. The worker exits 2.
type InputError struct{ Err error }

func (e *InputError) Error() string { return e.Err.Error() }
func (e *InputError) Unwrap() error { return e.Err }

func inputErr(format string, args ...any) error {
	return &InputError{fmt.Errorf(format, args...)}
}

// asInput marks an error from the kernel package's validation helpers.
func asInput(err error) error {
	if err == nil {
		return nil
	}
	return &InputError{err}
}

// UnsupportedError is a valid contract call the CUDA kernels do not
// implement (a head dim other than 576, an output dtype they do not write).
// The worker exits 4; the CLI records the kernel as not run.
type UnsupportedError struct{ Err error }

func (e *UnsupportedError) Error() string { return e.Err.Error() }
func (e *UnsupportedError) Unwrap() error { return e.Err }

func unsupported(format string, args ...any) error {
	return &UnsupportedError{fmt.Errorf(format, args...)}
}

// DeviceInfo describes the GPU a Device runs on.
type DeviceInfo struct {
	Name         string
	Major, Minor int
	SMs          int
	SmemOptin    int // largest dynamic shared memory a block may opt in to
	Driver       int // cuDriverGetVersion, e.g. 12080
}

// Arch is "sm_90" for compute capability 9.0.
func (i DeviceInfo) Arch() string { return fmt.Sprintf("sm_%d%d", i.Major, i.Minor) }

// OpenOptions choose the device and where the kernels are loaded from.
type OpenOptions struct {
	// PTXDir holds NAME.ptx (and optionally NAME.sm_XY[a].cubin) for each
	// kernel file; see DefaultPTXDir.
	PTXDir string
	// PTXOnly ignores cubins and JIT-compiles the compute_80 PTX.
	PTXOnly bool
	// Ordinal is the CUDA device number (0 by default).
	Ordinal int
}

// DefaultPTXDir is where the worker looks when no directory is given:
// $KCHECK_PTX_DIR, then ptx/ next to the executable (the gpu bundle), then
// cuda/ptx under the working directory (a source checkout after `make
// kernels`).
func DefaultPTXDir() string {
	if d := os.Getenv("KCHECK_PTX_DIR"); d != "" {
		return d
	}
	if exe, err := os.Executable(); err == nil {
		d := filepath.Join(filepath.Dir(exe), "ptx")
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			return d
		}
	}
	return filepath.Join("cuda", "ptx")
}

// Device is one GPU with the kcheck kernels loaded on demand. Its methods
// must not be called concurrently; each binds the context to the calling
// OS thread for its duration, so any goroutine may call them.
type Device struct {
	Info    DeviceInfo
	dev     cu.Device
	ctx     cu.CUContext
	dir     string
	ptxOnly bool
	mods    map[string]*module
}

// module is one loaded kernel file.
type module struct {
	mod   cu.Module
	file  string // the file it came from
	build string // sha256 of the image: the kernel_build of every output
	fns   map[string]cu.Function
	smem  map[string]bool // functions whose dynamic shared memory limit was raised
}

// Open creates a context on the device.
func Open(opts OpenOptions) (*Device, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	dev, err := cu.GetDevice(opts.Ordinal)
	if err != nil {
		return nil, wrap("cuDeviceGet", err)
	}
	d := &Device{dev: dev, dir: opts.PTXDir, ptxOnly: opts.PTXOnly, mods: map[string]*module{}}
	if d.dir == "" {
		d.dir = DefaultPTXDir()
	}
	if d.Info.Name, err = dev.Name(); err != nil {
		return nil, wrap("cuDeviceGetName", err)
	}
	if d.Info.Major, d.Info.Minor, err = dev.ComputeCapability(); err != nil {
		return nil, wrap("cuDeviceComputeCapability", err)
	}
	if d.Info.SMs, err = dev.Attribute(cu.MultiprocessorCount); err != nil {
		return nil, wrap("cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)", err)
	}
	if d.Info.SmemOptin, err = smemOptin(dev); err != nil {
		return nil, err
	}
	d.Info.Driver = cu.Version()
	if d.ctx, err = dev.MakeContext(cu.SchedAuto); err != nil {
		return nil, wrap("cuCtxCreate", err)
	}
	return d, nil
}

// Close destroys the context.
func (d *Device) Close() error {
	unbind := d.bind()
	defer unbind()
	return wrap("cuCtxDestroy", d.ctx.Destroy())
}

// bind makes the context current on this goroutine's OS thread.
func (d *Device) bind() func() {
	runtime.LockOSThread()
	_ = cu.SetCurrentContext(d.ctx)
	return runtime.UnlockOSThread
}

// load returns kernel file name ("nvfp4", "kvcache", "mla_decode"),
// preferring a cubin built for this device's architecture.
func (d *Device) load(name string) (*module, error) {
	if m, ok := d.mods[name]; ok {
		return m, nil
	}
	var cands []string
	if !d.ptxOnly {
		arch := d.Info.Arch()
		cands = append(cands, name+"."+arch+"a.cubin", name+"."+arch+".cubin")
	}
	cands = append(cands, name+".ptx")
	for _, c := range cands {
		path := filepath.Join(d.dir, c)
		image, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if len(image) == 0 {
			return nil, fmt.Errorf("%s is empty", path)
		}
		mod, err := loadModule(image)
		if err != nil {
			var ce *Error
			if errors.As(err, &ce) && IsImageError(ce.Name) {
				return nil, &LoadError{File: path, CUDAError: ce.Name, Err: err}
			}
			return nil, fmt.Errorf("loading %s: %w", path, err)
		}
		sum := sha256.Sum256(image)
		m := &module{mod: mod, file: c, build: "sha256:" + hex.EncodeToString(sum[:]),
			fns: map[string]cu.Function{}, smem: map[string]bool{}}
		d.mods[name] = m
		return m, nil
	}
	return nil, fmt.Errorf("no %s.ptx in %s (run `make kernels`, or pass --ptx-dir)", name, d.dir)
}

func (m *module) fn(name string) (cu.Function, error) {
	if f, ok := m.fns[name]; ok {
		return f, nil
	}
	f, err := m.mod.Function(name)
	if err != nil {
		return f, wrap("cuModuleGetFunction("+name+")", err)
	}
	m.fns[name] = f
	return f, nil
}

// globalInt reads an `extern "C" __device__ const int` of the module (the
// shared memory size of an MLA variant, the GEMM path).
func (m *module) globalInt(name string) (int, error) {
	ptr, size, err := m.mod.Global(name)
	if err != nil {
		return 0, wrap("cuModuleGetGlobal("+name+")", err)
	}
	if size != 4 {
		return 0, fmt.Errorf("module global %s has %d bytes, want 4", name, size)
	}
	var v int32
	if err := cu.MemcpyDtoH(unsafe.Pointer(&v), ptr, 4); err != nil {
		return 0, wrap("cuMemcpyDtoH("+name+")", err)
	}
	return int(v), nil
}

// arena owns the device buffers of one Run.
type arena struct{ ptrs []cu.DevicePtr }

func (a *arena) alloc(bytes int64) (cu.DevicePtr, error) {
	if bytes < 1 {
		bytes = 1 // cuMemAlloc refuses 0; a kernel never reads an empty tensor
	}
	p, err := cu.MemAlloc(bytes)
	if err != nil {
		return 0, wrap(fmt.Sprintf("cuMemAlloc(%d)", bytes), err)
	}
	a.ptrs = append(a.ptrs, p)
	return p, nil
}

// upload copies raw bytes to a new device buffer.
func (a *arena) upload(b []byte) (cu.DevicePtr, error) {
	p, err := a.alloc(int64(len(b)))
	if err != nil || len(b) == 0 {
		return p, err
	}
	return p, wrap("cuMemcpyHtoD", cu.MemcpyHtoD(p, unsafe.Pointer(&b[0]), int64(len(b))))
}

// zeros allocates a zero-filled buffer.
func (a *arena) zeros(bytes int64) (cu.DevicePtr, error) {
	p, err := a.alloc(bytes)
	if err != nil {
		return p, err
	}
	return p, wrap("cuMemsetD8", cu.MemsetD8(p, 0, max(bytes, 1)))
}

func (a *arena) free() {
	for _, p := range a.ptrs {
		_ = cu.MemFree(p)
	}
	a.ptrs = nil
}

// download copies a device buffer into a new tensor of dtype and shape.
func download(p cu.DevicePtr, d tensor.DType, shape ...int) (*tensor.Tensor, error) {
	t := tensor.New(d, shape...)
	if len(t.Data) == 0 {
		return t, nil
	}
	return t, wrap("cuMemcpyDtoH", cu.MemcpyDtoH(unsafe.Pointer(&t.Data[0]), p, int64(len(t.Data))))
}

// Kernel arguments. cu's Launch copies 8 bytes from every argument pointer,
// and the driver reads each parameter's own size from its slot, so every
// argument is held in a uint64: pointers whole, 32-bit values in the low
// bytes (little-endian).
type args []uint64

func (a args) ptrs() []unsafe.Pointer {
	p := make([]unsafe.Pointer, len(a))
	for i := range a {
		p[i] = unsafe.Pointer(&a[i])
	}
	return p
}

func ptrArg(p cu.DevicePtr) uint64 { return uint64(p) }
func i32(v int) uint64             { return uint64(uint32(int32(v))) }
func i64(v int64) uint64           { return uint64(v) }
func f32(v float32) uint64         { return uint64(math.Float32bits(v)) }

// launch is one kernel launch of a plan.
type launch struct {
	mod   *module
	fn    string
	grid  [3]int
	block int
	smem  int
	args  args
}

func (d *Device) enqueue(l launch) error {
	f, err := l.mod.fn(l.fn)
	if err != nil {
		return err
	}
	if l.smem > 48<<10 && !l.mod.smem[l.fn] {
		if err := setMaxDynamicSmem(f, l.smem); err != nil {
			return err
		}
		l.mod.smem[l.fn] = true
	}
	for i, g := range l.grid {
		if g <= 0 {
			return fmt.Errorf("launch %s: grid dimension %d is %d", l.fn, i, g)
		}
	}
	return wrap("cuLaunchKernel("+l.fn+")",
		f.Launch(l.grid[0], l.grid[1], l.grid[2], l.block, 1, 1, l.smem, cu.Stream{}, l.args.ptrs()))
}

// runPlan enqueues the launches repeat times, timing each repetition with
// CUDA events, and waits for the device. A kernel fault surfaces here as a
// sticky context error (CUDA_ERROR_ILLEGAL_ADDRESS...).
func (d *Device) runPlan(plan []launch, repeat int) ([]float64, error) {
	if repeat < 1 {
		repeat = 1
	}
	start, err := cu.MakeEvent(cu.DefaultEvent)
	if err != nil {
		return nil, wrap("cuEventCreate", err)
	}
	defer cu.DestroyEvent(&start)
	stop, err := cu.MakeEvent(cu.DefaultEvent)
	if err != nil {
		return nil, wrap("cuEventCreate", err)
	}
	defer cu.DestroyEvent(&stop)
	ms := make([]float64, 0, repeat)
	for r := 0; r < repeat; r++ {
		if err := start.Record(cu.Stream{}); err != nil {
			return nil, wrap("cuEventRecord", err)
		}
		for _, l := range plan {
			if err := d.enqueue(l); err != nil {
				return nil, err
			}
		}
		if err := stop.Record(cu.Stream{}); err != nil {
			return nil, wrap("cuEventRecord", err)
		}
		if err := stop.Synchronize(); err != nil {
			return nil, wrap("kernel execution (cuEventSynchronize)", err)
		}
		t, err := start.Elapsed(stop)
		if err != nil {
			return nil, wrap("cuEventElapsedTime", err)
		}
		ms = append(ms, t)
	}
	return ms, wrap("cuCtxSynchronize", cu.Synchronize())
}

// RunOptions tune one Run.
type RunOptions struct {
	// Repeat runs the kernel this many times (timing each); outputs are
	// those of the last run, which equal the first for these kernels.
	Repeat int
	// OutDTypes gives an output's dtype where the contract allows several
	// (out, gathered, block_scale); absent: the contract's default.
	OutDTypes map[string]tensor.DType
}

// Result is what a Run produced.
type Result struct {
	Outputs map[string]*tensor.Tensor
	// Meta holds what the run adds to the evidence file's metadata: the
	// declared precision, the kernel function, its launch shape, the build
	// hash of the module, timing (kcheck.cuda.* keys) and any parameter the
	// run chose (num_splits).
	Meta map[string]string
	// Millis are the per-repetition device times.
	Millis []float64
}

type runner func(d *Device, in kernel.Inputs, opt RunOptions) (*Result, error)

var runners = map[string]runner{}

// Run runs contract kernel name on in. Errors are *InputError (unusable
// inputs), *UnsupportedError (not implemented by the CUDA kernels), *Error
// (a CUDA failure) or a plain error (kernels not found).
func (d *Device) Run(name string, in kernel.Inputs, opt RunOptions) (*Result, error) {
	run, ok := runners[name]
	if !ok {
		return nil, unsupported("kernel %s has no CUDA implementation (implemented: %v)", name, Kernels())
	}
	unbind := d.bind()
	defer unbind()
	res, err := run(d, in, opt)
	if err != nil {
		return nil, err
	}
	sat, err := in.Params.Bool("fp8_saturate", true)
	if err != nil {
		return nil, asInput(err)
	}
	pm, _ := PrecisionMeta(name, sat)
	for k, v := range pm {
		res.Meta[k] = v
	}
	if len(res.Millis) > 0 {
		s := append([]float64(nil), res.Millis...)
		sort.Float64s(s)
		res.Meta["kcheck.cuda.ms"] = strconv.FormatFloat(s[len(s)/2], 'g', 6, 64)
		res.Meta["kcheck.cuda.repeat"] = strconv.Itoa(len(s))
	}
	res.Meta["device"] = d.Info.Name
	res.Meta["driver"] = strconv.Itoa(d.Info.Driver)
	res.Meta["kcheck.cuda.arch"] = d.Info.Arch()
	return res, nil
}

// finish runs plan and downloads outs (name -> buffer, dtype, shape).
func (d *Device) finish(m *module, plan []launch, opt RunOptions, outs []outBuf) (*Result, error) {
	ms, err := d.runPlan(plan, opt.Repeat)
	if err != nil {
		return nil, err
	}
	res := &Result{Outputs: map[string]*tensor.Tensor{}, Meta: map[string]string{}, Millis: ms}
	for _, o := range outs {
		t, err := download(o.ptr, o.dtype, o.shape...)
		if err != nil {
			return nil, err
		}
		res.Outputs[o.name] = t
	}
	res.Meta["kernel_build"] = m.build
	res.Meta["source"] = "kcheck cuda/" + m.file
	var fns string
	for i, l := range plan {
		if i > 0 {
			fns += ","
		}
		fns += fmt.Sprintf("%s<<<(%d,%d,%d),%d,%d>>>", l.fn, l.grid[0], l.grid[1], l.grid[2], l.block, l.smem)
	}
	res.Meta["kcheck.cuda.launch"] = fns
	return res, nil
}

type outBuf struct {
	name  string
	ptr   cu.DevicePtr
	dtype tensor.DType
	shape []int
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// gridFor caps a grid-stride kernel's grid at a few waves.
func (d *Device) gridFor(threads, block int) int {
	g := ceilDiv(threads, block)
	if limit := d.Info.SMs * 16; g > limit {
		g = limit
	}
	return max(g, 1)
}

// scalarF32 reads a [] or [1] F32 tensor.
func scalarF32(in kernel.Inputs, name string) (float32, []byte, error) {
	t, err := kernel.Need(in, name, tensor.F32)
	if err != nil {
		return 0, nil, asInput(err)
	}
	if len(t.Shape) > 1 || t.Len() != 1 {
		return 0, nil, inputErr("tensor %s has shape %v; the contract wants [] or [1]", name, t.Shape)
	}
	return math.Float32frombits(uint32(t.Data[0]) | uint32(t.Data[1])<<8 | uint32(t.Data[2])<<16 | uint32(t.Data[3])<<24), t.Data, nil
}

// outDType picks an output's dtype from opt or def, within allowed (what
// the CUDA kernel can write).
func outDType(opt RunOptions, name string, def tensor.DType, allowed ...tensor.DType) (tensor.DType, error) {
	d, ok := opt.OutDTypes[name]
	if !ok || d == "" {
		return def, nil
	}
	for _, a := range allowed {
		if d == a {
			return d, nil
		}
	}
	return "", unsupported("output %s as %s: the CUDA kernel writes %v", name, d, allowed)
}

// indexData returns an integer tensor's values as int64 (I32 or I64).
func indexData(t *tensor.Tensor) []int64 {
	v := make([]int64, t.Len())
	for i := range v {
		v[i] = t.Int64At(i)
	}
	return v
}

func int32Bytes(v []int64) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		u := uint32(int32(x))
		b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
	}
	return b
}

func int64Bytes(v []int64) []byte {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		u := uint64(x)
		for k := 0; k < 8; k++ {
			b[8*i+k] = byte(u >> (8 * k))
		}
	}
	return b
}

func cuPtr(v uint64) cu.DevicePtr { return cu.DevicePtr(v) }

// Faults are the deliberately broken kernels of faults.cu.
var Faults = []string{"oob", "trap", "hang"}

// RunFault launches one deliberately broken kernel ("oob", "trap", "hang")
// and waits for it; its error is what a crashing kernel gives (an *Error
// named CUDA_ERROR_...), and "hang" does not return. It exists to test the
// worker protocol on a real GPU.
func (d *Device) RunFault(kind string) error {
	unbind := d.bind()
	defer unbind()
	mod, err := d.load("faults")
	if err != nil {
		return err
	}
	var a arena
	defer a.free()
	buf, err := a.zeros(4)
	if err != nil {
		return err
	}
	var l launch
	switch kind {
	case "oob":
		l = launch{mod: mod, fn: "fault_oob", grid: [3]int{1, 1, 1}, block: 32, args: args{ptrArg(buf), i64(1 << 38)}}
	case "trap":
		l = launch{mod: mod, fn: "fault_trap", grid: [3]int{1, 1, 1}, block: 32, args: args{ptrArg(buf)}}
	case "hang":
		out, err := a.zeros(4)
		if err != nil {
			return err
		}
		l = launch{mod: mod, fn: "fault_hang", grid: [3]int{1, 1, 1}, block: 1, args: args{ptrArg(buf), ptrArg(out)}}
	default:
		return fmt.Errorf("unknown fault %q (known: %v)", kind, Faults)
	}
	_, err = d.runPlan([]launch{l}, 1)
	return err
}

// CopyMillis times a device-to-device copy of bytes (the bandwidth yardstick
// of the benchmarks), median of repeat runs.
func (d *Device) CopyMillis(bytes int64, repeat int) (float64, error) {
	unbind := d.bind()
	defer unbind()
	var a arena
	defer a.free()
	src, err := a.zeros(bytes)
	if err != nil {
		return 0, err
	}
	dst, err := a.alloc(bytes)
	if err != nil {
		return 0, err
	}
	start, err := cu.MakeEvent(cu.DefaultEvent)
	if err != nil {
		return 0, wrap("cuEventCreate", err)
	}
	defer cu.DestroyEvent(&start)
	stop, err := cu.MakeEvent(cu.DefaultEvent)
	if err != nil {
		return 0, wrap("cuEventCreate", err)
	}
	defer cu.DestroyEvent(&stop)
	var ms []float64
	for r := 0; r < max(repeat, 1); r++ {
		if err := start.Record(cu.Stream{}); err != nil {
			return 0, wrap("cuEventRecord", err)
		}
		if err := cu.MemcpyDtoD(dst, src, bytes); err != nil {
			return 0, wrap("cuMemcpyDtoD", err)
		}
		if err := stop.Record(cu.Stream{}); err != nil {
			return 0, wrap("cuEventRecord", err)
		}
		if err := stop.Synchronize(); err != nil {
			return 0, wrap("cuEventSynchronize", err)
		}
		t, err := start.Elapsed(stop)
		if err != nil {
			return 0, wrap("cuEventElapsedTime", err)
		}
		ms = append(ms, t)
	}
	sort.Float64s(ms)
	return ms[len(ms)/2], nil
}
