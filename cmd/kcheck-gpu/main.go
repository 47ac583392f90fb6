//go:build cuda || cudaemu

package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"github.com/kcheck-dev/kcheck/internal/evidence"
	_ "github.com/kcheck-dev/kcheck/internal/kernels/all" // every kernel registers itself
	"io"
	"os"
	"sort"
	"strconv"
	"time"

	"github.com/kcheck-dev/kcheck/cuda"
	"github.com/kcheck-dev/kcheck/internal/gpu"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/safetensors"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

const usage = `usage:
  kcheck-gpu run --kernel NAME --in FILE --out FILE [--ptx-dir DIR] [--ptx-only] [--repeat N] [--copy-bytes N] [--force]
  kcheck-gpu info [--ptx-dir DIR] [--ptx-only]
  kcheck-gpu kernels
`

func run(argv []string, stdout, stderr io.Writer) int {
	if len(argv) == 0 {
		fmt.Fprint(stderr, usage)
		return gpu.ExitUsage
	}
	switch argv[0] {
	case "run":
		return cmdRun(argv[1:], stdout, stderr)
	case "info":
		return cmdInfo(argv[1:], stdout, stderr)
	case "kernels":
		for _, k := range cuda.Kernels() {
			fmt.Fprintln(stdout, k)
		}
		return gpu.ExitOK
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return gpu.ExitOK
	}
	fmt.Fprintf(stderr, "kcheck-gpu: unknown command %q\n%s", argv[0], usage)
	return gpu.ExitUsage
}

type deviceFlags struct {
	ptxDir  string
	ptxOnly bool
	ordinal int
}

func (d *deviceFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&d.ptxDir, "ptx-dir", "", "directory of the compiled kernels (default: $KCHECK_PTX_DIR, ptx/ next to this binary, cuda/ptx)")
	fs.BoolVar(&d.ptxOnly, "ptx-only", false, "JIT the compute_80 PTX even where a cubin for this GPU exists")
	fs.IntVar(&d.ordinal, "device", 0, "CUDA device number")
}

func (d *deviceFlags) open() (*cuda.Device, error) {
	return cuda.Open(cuda.OpenOptions{PTXDir: d.ptxDir, PTXOnly: d.ptxOnly, Ordinal: d.ordinal})
}

func cmdInfo(argv []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("info", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var df deviceFlags
	df.register(fs)
	if err := fs.Parse(argv); err != nil {
		return gpu.ExitUsage
	}
	dev, err := df.open()
	if err != nil {
		return fail(stderr, err)
	}
	defer dev.Close()
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(map[string]any{
		"name": dev.Info.Name, "arch": dev.Info.Arch(), "sms": dev.Info.SMs,
		"smem_optin": dev.Info.SmemOptin, "driver": dev.Info.Driver, "kernels": cuda.Kernels(),
	})
	return gpu.ExitOK
}

func cmdRun(argv []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var df deviceFlags
	df.register(fs)
	name := fs.String("kernel", "", "contract kernel name (default: the input's kcheck.kernel)")
	inPath := fs.String("in", "", "input evidence file (safetensors)")
	outPath := fs.String("out", "", "output evidence file to write")
	repeat := fs.Int("repeat", 1, "run the kernel N times and report the median device time")
	force := fs.Bool("force", false, "overwrite --out if it exists")
	copyBytes := fs.Int64("copy-bytes", 0, "also time a device-to-device copy of this many bytes (kcheck.cuda.copy_ms), for bandwidth ratios")
	if err := fs.Parse(argv); err != nil {
		return gpu.ExitUsage
	}
	if *inPath == "" || *outPath == "" || fs.NArg() > 0 || *repeat < 1 {
		fmt.Fprintf(stderr, "kcheck-gpu run: need --in and --out (and --repeat >= 1)\n%s", usage)
		return gpu.ExitUsage
	}
	f, err := safetensors.Open(*inPath)
	if err != nil {
		fmt.Fprintf(stderr, "kcheck-gpu: %v\n", err)
		return gpu.ExitUsage
	}
	defer f.Close()
	k := *name
	if fk := f.Metadata["kcheck.kernel"]; k == "" {
		k = fk
	} else if fk != "" && fk != k {
		fmt.Fprintf(stderr, "kcheck-gpu: --kernel %s but %s says kcheck.kernel = %s\n", k, *inPath, fk)
		return gpu.ExitUsage
	}
	if k == "" {
		fmt.Fprintf(stderr, "kcheck-gpu: no --kernel and %s has no kcheck.kernel\n", *inPath)
		return gpu.ExitUsage
	}
	contract, err := kernel.Lookup(k)
	if err != nil {
		fmt.Fprintf(stderr, "kcheck-gpu: %v\n", err)
		return gpu.ExitUsage
	}
	in := kernel.Inputs{Tensors: f.Tensors, Params: kernel.Params(f.Metadata)}
	opt := cuda.RunOptions{Repeat: *repeat, OutDTypes: map[string]tensor.DType{}}
	for _, o := range contract.Spec().Outputs {
		if t, ok := f.Tensors[o.Name]; ok {
			opt.OutDTypes[o.Name] = t.DType
		}
	}
	// A capture's split_bounds fixes S when num_splits does not.
	if sb, ok := f.Tensors["split_bounds"]; ok && len(sb.Shape) == 2 && sb.Shape[1] > 1 && in.Params["num_splits"] == "" {
		p := kernel.Params{}
		for key, v := range in.Params {
			p[key] = v
		}
		p["num_splits"] = strconv.Itoa(sb.Shape[1] - 1)
		in.Params = p
	}

	dev, err := df.open()
	if err != nil {
		return fail(stderr, err)
	}
	defer dev.Close()
	if fault := os.Getenv("KCHECK_GPU_FAULT"); fault != "" {
		// Test hook: run a deliberately broken kernel instead (faults.cu).
		if err := dev.RunFault(fault); err != nil {
			return fail(stderr, err)
		}
		fmt.Fprintf(stderr, "kcheck-gpu: fault %s did not fail\n", fault)
		return gpu.ExitInternal
	}
	start := time.Now()
	res, err := dev.Run(k, in, opt)
	if err != nil {
		return fail(stderr, err)
	}

	capt := evidence.Assemble(*outPath, f.Tensors, res.Outputs, f.Metadata, res.Meta)
	meta := capt.Metadata
	if *copyBytes > 0 {
		ms, err := dev.CopyMillis(*copyBytes, *repeat)
		if err != nil {
			return fail(stderr, err)
		}
		meta["kcheck.cuda.copy_ms"] = strconv.FormatFloat(ms, 'g', 6, 64)
		meta["kcheck.cuda.copy_bytes"] = strconv.FormatInt(*copyBytes, 10)
	}
	for _, name := range res.Drop {
		delete(meta, name)
	}
	meta["kcheck.format"] = "1"
	meta["kcheck.kernel"] = k
	meta["captured_at"] = time.Now().UTC().Format(time.RFC3339)
	if err := safetensors.Write(*outPath, meta, capt.Tensors, safetensors.WriteOptions{Force: *force}); err != nil {
		fmt.Fprintf(stderr, "kcheck-gpu: %v\n", err)
		return gpu.ExitUsage
	}
	outs := make([]string, 0, len(res.Outputs))
	for n := range res.Outputs {
		outs = append(outs, n)
	}
	sort.Strings(outs)
	_ = json.NewEncoder(stdout).Encode(map[string]any{
		"kernel": k, "out": *outPath, "outputs": outs, "device": dev.Info.Name,
		"ms": res.Meta["kcheck.cuda.ms"], "wall_s": time.Since(start).Seconds(),
	})
	return gpu.ExitOK
}

// fail prints err and maps it to the worker's exit status.
func fail(stderr io.Writer, err error) int {
	if code, ok := loadFailure(stderr, err); ok {
		return code
	}
	var ce *cuda.Error
	var ie *cuda.InputError
	var ue *cuda.UnsupportedError
	switch {
	case errors.As(err, &ce):
		fmt.Fprintf(stderr, "kcheck-gpu: CUDA error %s: %v\n", ce.Name, err)
		return gpu.ExitCUDA
	case errors.As(err, &ie):
		fmt.Fprintf(stderr, "kcheck-gpu: input: %v\n", err)
		return gpu.ExitUsage
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "kcheck-gpu: unsupported: %v\n", err)
		return gpu.ExitUnsupported
	}
	fmt.Fprintf(stderr, "kcheck-gpu: %v\n", err)
	return gpu.ExitInternal
}
