//go:build cuda

package cuda_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"

	"testing"
	"time"

	"github.com/kcheck-dev/kcheck/cases/conformance"
	"github.com/kcheck-dev/kcheck/cuda"
	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/evidence"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/safetensors"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// These tests run on a GPU only (gorgonia.org/cu exits the test binary at
// init on a machine without one). They run the whole case catalog on the
// CUDA kernels and judge every output with the same three-way check as
// `kcheck check`; any fail fails the test.
//
// Environment:
//   KCHECK_PTX_DIR      the compiled kernels (default: ptx, then ptx/ next to the binary)
//   KCHECK_PTX_ONLY=1   JIT the compute_80 PTX even where a cubin exists
//   KCHECK_GPU_MATCH    a regexp: run only the catalog cases it matches
//   KCHECK_GPU_RESULTS  a directory: write results.json, results.md (after
//                       every case: results_test.go) and the captures of
//                       failing cases (failures/NAME.safetensors)
//   -test.short         skip the "long" cases (contexts of 8K to 128K)

var dev *cuda.Device

func TestMain(m *testing.M) {
	dir := os.Getenv("KCHECK_PTX_DIR")
	if dir == "" {
		if st, err := os.Stat("ptx"); err == nil && st.IsDir() {
			dir = "ptx"
		}
	}
	d, err := cuda.Open(cuda.OpenOptions{PTXDir: dir, PTXOnly: os.Getenv("KCHECK_PTX_ONLY") == "1"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "cuda tests:", err)
		os.Exit(1)
	}
	dev = d
	results.dir = os.Getenv("KCHECK_GPU_RESULTS")
	results.dev = deviceDesc{Name: d.Info.Name, Arch: d.Info.Arch(), Driver: d.Info.Driver, SMs: d.Info.SMs}
	results.start = time.Now()
	code := m.Run()
	if err := results.save(); err != nil {
		fmt.Fprintln(os.Stderr, "cuda tests: writing the summary:", err)
		code = 1
	}
	_ = d.Close()
	os.Exit(code)
}

// TestCatalog is the conformance suite (cases/conformance) on the CUDA
// kernels: every catalog case judged three-way, as any backend is.
func TestCatalog(t *testing.T) {
	g := &gpuBackend{}
	if m := os.Getenv("KCHECK_GPU_MATCH"); m != "" {
		var err error
		if g.match, err = regexp.Compile(m); err != nil {
			t.Fatalf("KCHECK_GPU_MATCH: %v", err)
		}
	}
	conformance.Run(t, g)
	if g.ran == 0 {
		t.Log("no catalog case ran")
	}
}

// gpuBackend is the device as a conformance backend; it records each
// case's outcome for the results table and saves failing captures.
type gpuBackend struct {
	match *regexp.Regexp
	ran   int
	last  error // the last run's error, for the record's verdict
}

func (*gpuBackend) Name() string { return "cuda" }

// Selects implements conformance.Selector: KCHECK_GPU_MATCH.
func (g *gpuBackend) Selects(name string) bool { return g.match == nil || g.match.MatchString(name) }

// Run implements conformance.Backend.
func (g *gpuBackend) Run(_ context.Context, kname string, ts map[string]*tensor.Tensor, params map[string]string) (map[string]*tensor.Tensor, map[string]string, error) {
	g.last = nil
	if _, ok := cuda.Precisions[kname]; !ok {
		return nil, nil, fmt.Errorf("no CUDA kernel for %s: %w", kname, conformance.ErrUnsupported)
	}
	g.ran++
	res, err := dev.Run(kname, kernel.Inputs{Tensors: ts, Params: params}, cuda.RunOptions{Repeat: 1})
	g.last = err
	var ue *cuda.UnsupportedError
	if errors.As(err, &ue) {
		return nil, nil, fmt.Errorf("%v: %w", ue, conformance.ErrUnsupported)
	}
	var le *cuda.LoadError
	if errors.As(err, &le) {
		return nil, nil, fmt.Errorf("the driver cannot load the kernel image (no kernel ran): %v", le)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("the CUDA run failed: %v", err)
	}
	return res.Outputs, res.Meta, nil
}

// Report implements conformance.Reporter.
func (g *gpuBackend) Report(t *testing.T, o conformance.Outcome) {
	rec := record{Name: o.Case, Kernel: o.Kernel, Verdict: o.Verdict, Reason: o.Reason}
	var le *cuda.LoadError
	if errors.As(g.last, &le) {
		rec.Verdict = "load_failed"
	}
	if o.Capture != nil {
		m := o.Capture.Metadata
		rec.MS, _ = strconv.ParseFloat(m["kcheck.cuda.ms"], 64)
		rec.Launch, rec.Path = m["kcheck.cuda.launch"], m["kcheck.cuda.gemm_path"]
		if o.Verdict != string(check.Pass) {
			saveFailure(t, o.Case, *o.Capture)
		}
	}
	addRecord(rec)
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

func saveFailure(t *testing.T, name string, c evidence.Capture) {
	dir := os.Getenv("KCHECK_GPU_RESULTS")
	if dir == "" {
		return
	}
	dir = filepath.Join(dir, "failures")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Logf("saving the failing capture: %v", err)
		return
	}
	path := filepath.Join(dir, unsafeName.ReplaceAllString(name, "_")+".safetensors")
	if err := safetensors.Write(path, c.Metadata, c.Tensors, safetensors.WriteOptions{Force: true}); err != nil {
		t.Logf("saving the failing capture: %v", err)
		return
	}
	t.Logf("failing capture written to %s (re-check it anywhere with `kcheck check`)", path)
}
