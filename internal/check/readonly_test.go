package check

import (
	"context"
	"crypto/sha256"
	"github.com/kcheck-dev/kcheck/internal/evidence"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/engines"
	"github.com/kcheck-dev/kcheck/internal/faults"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/safetensors"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	var s [32]byte
	copy(s[:], h.Sum(nil))
	return s
}

// kcheck never writes into an input file. Captures opened with
// safetensors.Open are read-only memory mappings: a reference, a fault
// hook, an engine adapter or the checker writing into an input tensor
// would die with SIGSEGV here. Every kernel (golden captures and the
// shipped examples, pipelines included) runs through every fault of
// faults.All() and the check, with and without every engine's conventions,
// and the files' sha256 must not change. The files are copied first, so a
// failure cannot damage the repository's fixtures.
func TestInputsNeverWritten(t *testing.T) {
	var paths []string
	for _, glob := range []string{"../../fixtures/golden/*.safetensors", "../../fixtures/examples/*.safetensors"} {
		p, err := filepath.Glob(glob)
		if err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p...)
	}
	if len(paths) < len(kernel.Names()) {
		t.Fatalf("%d fixtures for %d kernels", len(paths), len(kernel.Names()))
	}
	dir := t.TempDir()
	ran := map[string]int{}
	for _, src := range paths {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, filepath.Base(src))
		if err := os.WriteFile(path, b, 0o444); err != nil {
			t.Fatal(err)
		}
		before := fileSum(t, path)
		f, err := safetensors.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		capture := evidence.Capture{Name: path, Metadata: f.Metadata, Tensors: f.Tensors}
		kname := f.Metadata["kcheck.kernel"]
		if k, err := kernel.Lookup(kname); err == nil {
			in := kernel.Inputs{Tensors: map[string]*tensor.Tensor{}, Params: params(f.Metadata)}
			for _, s := range k.Spec().Inputs {
				if t, ok := f.Tensors[s.Name]; ok {
					in.Tensors[s.Name] = t
				}
			}
			for _, fault := range faults.All() {
				if !fault.Affects(kname) {
					continue // the plain reference: the check below runs it
				}
				outs, err := fault.Run(context.Background(), k, in)
				if err != nil {
					continue // a fault that cannot apply to these inputs says so
				}
				ran[fault.Name]++
				// The faulty outputs judged against the mapped inputs.
				c := evidence.Capture{Name: path, Metadata: f.Metadata, Tensors: map[string]*tensor.Tensor{}}
				for n, t := range f.Tensors {
					c.Tensors[n] = t
				}
				for n, t := range outs {
					c.Tensors[n] = t
				}
				Run(t.Context(), c, Options{})
			}
		}
		Run(t.Context(), capture, Options{})
		// The adapters rename and re-lay tensors the same way in a pipeline
		// as alone: run them on the single-kernel files (a pipeline check
		// takes seconds under -race).
		for _, name := range engines.Names() {
			if kname == "pipeline" {
				break
			}
			e, err := engines.Lookup(name)
			if err != nil {
				t.Fatal(err)
			}
			Run(t.Context(), capture, Options{Conventions: e.Conventions(), Adapt: e.Adapt})
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		if after := fileSum(t, path); after != before {
			t.Errorf("%s changed while it was checked", filepath.Base(src))
		}
	}
	for _, fault := range faults.All() {
		if ran[fault.Name] == 0 {
			t.Logf("fault %s found no fixture of its kernels %v it applies to", fault.Name, fault.Kernels)
		}
	}
}
