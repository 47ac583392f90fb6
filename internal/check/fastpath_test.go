package check

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/evidence"
	"github.com/kcheck-dev/kcheck/internal/faults"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/safetensors"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// TestFastPathOnFixtures: every golden and example fixture (pipelines
// included), as captured and with the outputs of every planted fault that
// applies to its kernel (near misses among them: a rounding mode, a
// nibble order, an off-by-one), gets the same result, to the last bit of
// every metric, worst element and signature, from the fast path as from
// the element path (compare.Options): the fixtures at GOMAXPROCS 1, 2 and
// 8, the faults' outputs (not under -short) at 8.
func TestFastPathOnFixtures(t *testing.T) {
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
	same := func(name string, c evidence.Capture, procsList ...int) {
		t.Helper()
		want, _ := json.Marshal(Run(t.Context(), c, Options{ElementPath: true}))
		for _, procs := range procsList {
			prev := runtime.GOMAXPROCS(procs)
			got, _ := json.Marshal(Run(t.Context(), c, Options{}))
			runtime.GOMAXPROCS(prev)
			if !bytes.Equal(got, want) {
				t.Errorf("%s at GOMAXPROCS %d: the fast path's result differs from the element path's:\n%s\n%s", name, procs, got, want)
			}
		}
	}
	checked := 0
	for _, path := range paths {
		f, err := safetensors.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		kname := f.Metadata["kcheck.kernel"]
		same(filepath.Base(path), evidence.Capture{Name: path, Metadata: f.Metadata, Tensors: f.Tensors}, 1, 2, 8)
		checked++
		if k, err := kernel.Lookup(kname); err == nil && !testing.Short() {
			in := kernel.Inputs{Tensors: map[string]*tensor.Tensor{}, Params: params(f.Metadata)}
			for _, s := range k.Spec().Inputs {
				if t, ok := f.Tensors[s.Name]; ok {
					in.Tensors[s.Name] = t
				}
			}
			for _, fault := range faults.All() {
				if !fault.Affects(kname) {
					continue
				}
				outs, err := fault.Run(context.Background(), k, in)
				if err != nil {
					continue // a fault that cannot apply to these inputs
				}
				c := evidence.Capture{Name: path, Metadata: f.Metadata, Tensors: map[string]*tensor.Tensor{}}
				for n, t := range f.Tensors {
					c.Tensors[n] = t
				}
				for n, t := range outs {
					c.Tensors[n] = t
				}
				same(filepath.Base(path)+" with "+fault.Name, c, 8) // the shared-out path; 1 is the fixtures' above
				checked++
			}
		}
		f.Close()
	}
	t.Logf("%d captures checked on both paths", checked)
}

// TestReadBlockMatchesAt: every reference value of every single-kernel
// fixture's outputs, exact and expected, read by kernel.ReadBlock in runs
// of awkward lengths and offsets (across an entry or a row, one value,
// the last few), is the same bits as At gives it: what lets the fast path
// and ThreeWay's bounds read them a block at a time.
func TestReadBlockMatchesAt(t *testing.T) {
	paths, err := filepath.Glob("../../fixtures/golden/*.safetensors")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no golden fixtures: %v", err)
	}
	blocks := 0
	for _, path := range paths {
		f, err := safetensors.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		kname := f.Metadata["kcheck.kernel"]
		k, err := kernel.Lookup(kname)
		if err != nil {
			t.Fatal(err)
		}
		p := params(f.Metadata)
		prec, err := kernel.PrecisionFrom(p)
		if err != nil {
			t.Fatal(err)
		}
		ins, outs, _ := split(k, f.Tensors, "")
		dtypes, in := outputLayout(kernel.Inputs{Tensors: ins, Params: p}, outs)
		refs, err := kernel.Evaluate(context.Background(), k, in, prec, dtypes)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		for _, o := range refs {
			for side, v := range map[string]kernel.Values{"exact": o.Exact, "expected": o.Expected} {
				n := v.Len()
				want := kernel.Float64s(v)
				for _, run := range []int{1, 7, 64, 577, 1153, 4096} {
					dst := make([]float64, run)
					for lo := 0; lo < n; lo += run + run/3 {
						d := dst[:min(run, n-lo)]
						kernel.ReadBlock(v, lo, d)
						blocks++
						for k, x := range d {
							if math.Float64bits(x) != math.Float64bits(want[lo+k]) {
								t.Fatalf("%s %s %s: ReadBlock(%d, [%d]) value %d = %v, At gives %v", filepath.Base(path), o.Name, side, lo, len(d), lo+k, x, want[lo+k])
							}
						}
					}
				}
			}
		}
		f.Close()
	}
	t.Logf("%d blocks read", blocks)
}
