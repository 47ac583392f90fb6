//go:build cuda

package cuda_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/cuda"
	"github.com/kcheck-dev/kcheck/internal/check"
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

func TestCatalog(t *testing.T) {
	all, err := cases.Catalog()
	if err != nil {
		t.Fatal(err)
	}
	var match *regexp.Regexp
	if m := os.Getenv("KCHECK_GPU_MATCH"); m != "" {
		if match, err = regexp.Compile(m); err != nil {
			t.Fatalf("KCHECK_GPU_MATCH: %v", err)
		}
	}
	ran := 0
	for _, c := range all {
		if match != nil && !match.MatchString(c.Name) {
			continue
		}
		c := c
		t.Run(c.Name, func(t *testing.T) {
			rec := record{Name: c.Name, Kernel: c.Kernel}
			defer func() { addRecord(rec) }()
			if _, ok := cuda.Precisions[c.Kernel]; !ok {
				rec.Verdict, rec.Reason = "skipped", "no CUDA kernel for "+c.Kernel
				t.Skip(rec.Reason)
			}
			if c.HasTag("long") && testing.Short() {
				rec.Verdict, rec.Reason = "skipped", "long case under -short"
				t.Skip(rec.Reason)
			}
			ran++
			verdict, reason, res := runCase(t, c)
			rec.Verdict, rec.Reason = verdict, reason
			if res != nil {
				rec.MS, _ = strconv.ParseFloat(res.Meta["kcheck.cuda.ms"], 64)
				rec.Launch, rec.Path = res.Meta["kcheck.cuda.launch"], res.Meta["kcheck.cuda.gemm_path"]
			}
			switch verdict {
			case check.Pass:
			case "unsupported":
				t.Skip(reason)
			case check.Inconclusive:
				t.Logf("inconclusive: %s", reason)
			default:
				t.Errorf("%s: %s", verdict, reason)
			}
		})
	}
	if ran == 0 {
		t.Log("no catalog case ran")
	}
}

// runCase runs c on the GPU and checks the capture.
func runCase(t *testing.T, c cases.Case) (verdict, reason string, res *cuda.Result) {
	in, err := c.Inputs()
	if err != nil {
		t.Fatalf("building the inputs: %v", err)
	}
	meta, err := c.Metadata()
	if err != nil {
		t.Fatalf("metadata: %v", err)
	}
	res, err = dev.Run(c.Kernel, in, cuda.RunOptions{Repeat: 1})
	var ue *cuda.UnsupportedError
	if errors.As(err, &ue) {
		return "unsupported", ue.Error(), nil
	}
	var le *cuda.LoadError
	if errors.As(err, &le) {
		return "load_failed", "the driver cannot load the kernel image (no kernel ran): " + le.Error(), nil
	}
	if err != nil {
		return check.Error, "the CUDA run failed: " + err.Error(), nil
	}
	capture := check.Capture{Name: c.Name, Metadata: map[string]string{}, Tensors: map[string]*tensor.Tensor{}}
	for k, v := range meta {
		capture.Metadata[k] = v
	}
	for k, v := range res.Meta {
		capture.Metadata[k] = v
	}
	for k, v := range in.Tensors {
		capture.Tensors[k] = v
	}
	for k, v := range res.Outputs {
		capture.Tensors[k] = v
	}
	r := check.Run(capture, check.Options{})
	reason = explain(r)
	if r.Verdict != check.Pass {
		saveFailure(t, c.Name, capture)
	}
	return r.Verdict, reason, res
}

// explain is one line per non-passing output: what check said and where.
func explain(r check.Result) string {
	if r.Error != nil {
		return *r.Error
	}
	var parts []string
	for _, ch := range r.Checks {
		if ch.Verdict == "pass" {
			continue
		}
		p := fmt.Sprintf("%s %s: %s", ch.Tensor, ch.Verdict, ch.Reason)
		if len(ch.Worst) > 0 {
			p += " (worst at " + ch.Worst[0].Where() + ")"
		}
		if ch.Signature != nil {
			p += fmt.Sprintf(" [signature %v]", *ch.Signature)
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

func saveFailure(t *testing.T, name string, c check.Capture) {
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
