//go:build cuda || cudaemu

package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"

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

// Error is a CUDA driver error. The worker prints Name on stderr and exits
// with code 3, so a crashed kernel (CUDA_ERROR_ILLEGAL_ADDRESS,
// CUDA_ERROR_LAUNCH_FAILED...) is told apart from bad input.
type Error struct {
	Op     string // the call that failed
	Code   int    // the CUresult
	Name   string // CUDA_ERROR_...
	Detail string // the JIT log, when there is one
}

func (e *Error) Error() string {
	s := fmt.Sprintf("%s: %s (%d)", e.Op, e.Name, e.Code)
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
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

// Kernel arguments. cu's Launch copies 8 bytes from every argument pointer,
// and the driver reads each parameter's own size from its slot, so every
// argument is held in a uint64: pointers whole, 32-bit values in the low
// bytes (little-endian).
type args []uint64

// devPtr is a device address: a CUdeviceptr on a GPU, a host address in
// emulation.
type devPtr uint64

func i32(v int) uint64     { return uint64(uint32(int32(v))) }
func f32(v float32) uint64 { return uint64(math.Float32bits(v)) }

// launch is one kernel launch of a plan.
type launch struct {
	mod   *module
	fn    string
	grid  [3]int
	block int
	smem  int
	args  args
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
	// Drop names the input file's parameters the run made untrue, to be
	// left out of the output's metadata: a dense decode asked for split
	// partials that ran with one split writes none, so its num_splits
	// would ask the check for partials that do not exist.
	Drop []string
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
	if why, never := NoKernel[name]; never {
		return nil, unsupported("kernel %s has no CUDA implementation: %s", name, why)
	}
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
	d.describe(res.Meta)
	return res, nil
}

// finish runs plan and downloads outs (name -> buffer, dtype, shape).
func (d *Device) finish(bufs *buffers, m *module, plan []launch, opt RunOptions, outs []outBuf) (*Result, error) {
	if bufs.err != nil {
		return nil, bufs.err
	}
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
	ptr   devPtr
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
		l = launch{mod: mod, fn: "fault_oob", grid: [3]int{1, 1, 1}, block: 32, args: args{uint64(buf), uint64(1 << 38)}}
	case "trap":
		l = launch{mod: mod, fn: "fault_trap", grid: [3]int{1, 1, 1}, block: 32, args: args{uint64(buf)}}
	case "hang":
		out, err := a.zeros(4)
		if err != nil {
			return err
		}
		l = launch{mod: mod, fn: "fault_hang", grid: [3]int{1, 1, 1}, block: 1, args: args{uint64(buf), uint64(out)}}
	default:
		return fmt.Errorf("unknown fault %q (known: %v)", kind, Faults)
	}
	_, err = d.runPlan([]launch{l}, 1)
	return err
}

// buffers are one Run's device buffers (its arena) with a sticky error:
// once an allocation or upload fails, the later ones do nothing and finish
// reports the first failure, so a launcher lists its buffers without a
// check after each. No buffer is used before finish launches the plan.
type buffers struct {
	a   arena
	err error
}

// upload copies data to a new device buffer.
func (b *buffers) upload(data []byte) devPtr {
	if b.err != nil {
		return 0
	}
	p, err := b.a.upload(data)
	b.err = err
	return p
}

// alloc returns an uninitialized device buffer.
func (b *buffers) alloc(bytes int64) devPtr {
	if b.err != nil {
		return 0
	}
	p, err := b.a.alloc(bytes)
	b.err = err
	return p
}

// zeros returns a zero-filled device buffer.
func (b *buffers) zeros(bytes int64) devPtr {
	if b.err != nil {
		return 0
	}
	p, err := b.a.zeros(bytes)
	b.err = err
	return p
}

// free releases every buffer.
func (b *buffers) free() { b.a.free() }

// validate is the one validation of a launcher's inputs: the kernel's
// own, its errors marked as bad input.
func validate(name string, in kernel.Inputs) (kernel.Problem, error) {
	k, err := kernel.Lookup(name)
	if err != nil {
		return nil, err
	}
	p, err := kernel.Validate(k, in)
	return p, asInput(err)
}

// f32Bytes is v as the 4 bytes of an F32 scalar tensor.
func f32Bytes(v float64) []byte {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], math.Float32bits(float32(v)))
	return b[:]
}
