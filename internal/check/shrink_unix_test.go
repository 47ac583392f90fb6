//go:build unix

package check

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/safetensors"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// A capture truncated while it is checked (issue 11 item 7): re-capturing
// into the same path with safetensors' save_file truncates the file the
// check has mapped, and reading a page past its new end raises SIGBUS,
// which killed kcheck ("fatal error: fault") with every result of the run.
// The test really truncates a mapped file in the middle of its check, in
// a child process (a fault that is not turned into a panic ends the
// process), twice: once where the check itself next reads the file, once
// where the reference's worker goroutines do. The truncated file must get
// verdict error saying what happened, and the next file must still be
// checked.
func TestFileShrinkingDuringCheck(t *testing.T) {
	for _, tc := range []struct {
		name    string
		write   func(t *testing.T, path string)
		tensor  string // the tensor whose bytes were gone
		culprit string // what reads it first after the cut
	}{
		{"the comparison reads an output", writeTruncatedToZero, "lse", "the comparison, on the check's goroutine"},
		{"the reference's workers read an input in place", writeCutBeforeLastPartials, "b.partial_out", "splitk's worker goroutines"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			shrinking := filepath.Join(dir, "a.safetensors")
			tc.write(t, shrinking)
			intact := filepath.Join(dir, "b.safetensors")
			data, err := os.ReadFile(golden + "nvfp4_gemm.safetensors")
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(intact, data, 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), shrinkChildEnv+"="+tc.name+"|"+shrinking+"|"+intact)
			out, err := cmd.Output()
			if err != nil {
				stderr := ""
				if ee, ok := err.(*exec.ExitError); ok {
					stderr = string(ee.Stderr)
				}
				t.Fatalf("the child checking a shrinking file died (%v): %.600s\nstdout: %s", err, stderr, out)
			}
			var results []Result
			sc := bufio.NewScanner(strings.NewReader(string(out)))
			for sc.Scan() {
				var r Result
				if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
					t.Fatalf("child output %q: %v", sc.Text(), err)
				}
				results = append(results, r)
			}
			if len(results) != 2 {
				t.Fatalf("%d results, want 2:\n%s", len(results), out)
			}
			want := "tensor " + tc.tensor + " could no longer be read: the file shrank while it was being checked"
			if r := results[0]; r.Verdict != Error || r.Error == nil || !strings.Contains(*r.Error, want) {
				t.Errorf("the shrinking file (read first by %s): verdict %s, error %v; want error %q", tc.culprit, r.Verdict, deref(r.Error), want)
			}
			if r := results[1]; r.Verdict != Pass {
				t.Errorf("the next file: verdict %s (%v), want pass: the run must go on", r.Verdict, deref(r.Error))
			}
		})
	}
}

const shrinkChildEnv = "KCHECK_SHRINK_CHILD"

func init() {
	childMains = append(childMains, func() (int, bool) {
		if spec := os.Getenv(shrinkChildEnv); spec != "" {
			return shrinkChild(spec), true
		}
		return 0, false
	})
}

// shrinkChild checks the shrinking file, cutting it once the first output
// has been compared, then the intact one, and prints both results.
func shrinkChild(spec string) int {
	parts := strings.Split(spec, "|")
	name, shrinking, intact := parts[0], parts[1], parts[2]
	cut := map[string]func(string){
		"the comparison reads an output":                 func(p string) { os.Truncate(p, 0) },
		"the reference's workers read an input in place": cutBeforeLastPartials,
	}[name]
	done := false
	opts := Options{Observe: func(Observation) {
		if !done {
			done = true
			cut(shrinking)
		}
	}}
	enc := json.NewEncoder(os.Stdout)
	enc.Encode(File(context.Background(), shrinking, nil, opts))
	enc.Encode(File(context.Background(), intact, nil, Options{}))
	return 0
}

// splitkInputs are splitk_combine's inputs of n rows with the reference's
// outputs, all F32, under prefix.
func splitkInputs(t *testing.T, prefix string, n, s, l int, seed uint64) map[string]*tensor.Tensor {
	r := rand.New(rand.NewPCG(seed, 1))
	po, pl := tensor.New(tensor.F32, n, s, l), tensor.New(tensor.F32, n, s)
	for i := 0; i < po.Len(); i++ {
		po.SetFloat64(i, r.NormFloat64())
	}
	for i := 0; i < pl.Len(); i++ {
		pl.SetFloat64(i, r.NormFloat64())
	}
	in := map[string]*tensor.Tensor{"partial_out": po, "partial_lse": pl}
	k, err := kernel.Lookup("splitk_combine")
	if err != nil {
		t.Fatal(err)
	}
	outs, err := kernel.Produce(context.Background(), k, kernel.Inputs{Tensors: in, Params: kernel.Params{}}, kernel.DefaultPrecision(),
		map[string]tensor.DType{"out": tensor.F32, "lse": tensor.F32})
	if err != nil {
		t.Fatal(err)
	}
	ts := map[string]*tensor.Tensor{}
	for name, v := range in {
		ts[prefix+name] = v
	}
	for name, v := range outs {
		ts[prefix+name] = v
	}
	return ts
}

// writeTruncatedToZero writes a splitk_combine capture whose check reads
// lse after out: truncated to 0 bytes after out, every page of the file
// is gone when the comparison reads lse.
func writeTruncatedToZero(t *testing.T, path string) {
	ts := splitkInputs(t, "", 64, 4, 512, 1)
	meta := map[string]string{"kcheck.format": "1", "kcheck.kernel": "splitk_combine"}
	if err := safetensors.Write(path, meta, ts, safetensors.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// writeCutBeforeLastPartials writes a pipeline of two splitk_combine
// stages; after stage a's first output, the file is cut at the first page
// boundary after the start of b.partial_out (the last tensor, 4 MiB), so
// that what stage b reads on the check's goroutine (b.partial_lse, its
// outputs) is still there and only b.partial_out, which the reference's
// workers read in place, is gone.
func writeCutBeforeLastPartials(t *testing.T, path string) {
	ts := splitkInputs(t, "a.", 4, 2, 64, 2)
	for name, v := range splitkInputs(t, "b.", 512, 4, 512, 3) {
		ts[name] = v
	}
	meta := map[string]string{"kcheck.format": "1", "kcheck.kernel": "pipeline", "kcheck.stages": "a,b",
		"kcheck.a.kernel": "splitk_combine", "kcheck.b.kernel": "splitk_combine"}
	if err := safetensors.Write(path, meta, ts, safetensors.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// cutBeforeLastPartials truncates the pipeline capture at path at the
// first page boundary after b.partial_out's first byte.
func cutBeforeLastPartials(path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		panic(err)
	}
	f, err := safetensors.Parse(b)
	if err != nil {
		panic(err)
	}
	start := int64(uintptr(unsafe.Pointer(&f.Tensors["b.partial_out"].Data[0])) - uintptr(unsafe.Pointer(&b[0])))
	page := int64(os.Getpagesize())
	at := (start + page) / page * page
	if at >= int64(len(b)) {
		panic(fmt.Sprintf("b.partial_out starts at %d of %d bytes: nothing left to cut", start, len(b)))
	}
	if err := os.Truncate(path, at); err != nil {
		panic(err)
	}
}
