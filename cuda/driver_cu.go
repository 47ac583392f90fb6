//go:build cuda && !cudaemu

package cuda

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/kcheck-dev/kcheck/reference/tensor"
)

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

func (a *arena) alloc(bytes int64) (devPtr, error) {
	if bytes < 1 {
		bytes = 1 // cuMemAlloc refuses 0; a kernel never reads an empty tensor
	}
	p, err := cu.MemAlloc(bytes)
	if err != nil {
		return 0, wrap(fmt.Sprintf("cuMemAlloc(%d)", bytes), err)
	}
	a.ptrs = append(a.ptrs, p)
	return devPtr(p), nil
}

// upload copies raw bytes to a new device buffer.
func (a *arena) upload(b []byte) (devPtr, error) {
	p, err := a.alloc(int64(len(b)))
	if err != nil || len(b) == 0 {
		return p, err
	}
	return p, wrap("cuMemcpyHtoD", cu.MemcpyHtoD(cu.DevicePtr(p), unsafe.Pointer(&b[0]), int64(len(b))))
}

// zeros allocates a zero-filled buffer.
func (a *arena) zeros(bytes int64) (devPtr, error) {
	p, err := a.alloc(bytes)
	if err != nil {
		return p, err
	}
	return p, wrap("cuMemsetD8", cu.MemsetD8(cu.DevicePtr(p), 0, max(bytes, 1)))
}

func (a *arena) free() {
	for _, p := range a.ptrs {
		_ = cu.MemFree(p)
	}
	a.ptrs = nil
}

// download copies a device buffer into a new tensor of dtype and shape.
func download(p devPtr, d tensor.DType, shape ...int) (*tensor.Tensor, error) {
	t := tensor.New(d, shape...)
	if len(t.Data) == 0 {
		return t, nil
	}
	return t, wrap("cuMemcpyDtoH", cu.MemcpyDtoH(unsafe.Pointer(&t.Data[0]), cu.DevicePtr(p), int64(len(t.Data))))
}

func (a args) ptrs() []unsafe.Pointer {
	p := make([]unsafe.Pointer, len(a))
	for i := range a {
		p[i] = unsafe.Pointer(&a[i])
	}
	return p
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
		if err := cu.MemcpyDtoD(cu.DevicePtr(dst), cu.DevicePtr(src), bytes); err != nil {
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

// describe adds nothing on a GPU: device, driver and arch say it all.
func (d *Device) describe(map[string]string) {}
