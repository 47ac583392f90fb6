package shrink

import (
	"context"
	"github.com/kcheck-dev/kcheck/internal/evidence"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/backend"
	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/faults"
	"github.com/kcheck-dev/kcheck/internal/safetensors"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

func faulty(t *testing.T, name string) backend.Backend {
	t.Helper()
	f, err := faults.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return faults.Backend{Fault: f}
}

// A shrunk case is smaller, fails with the fingerprint of the original, and
// its evidence file re-checks to the same fingerprint.
func TestCaseShrinkKeepsTheSignature(t *testing.T) {
	tests := []struct {
		fault string
		c     cases.Case
	}{
		{"page_tail_attended", cases.Case{Name: "tail", Kernel: "mla_decode", Preset: "deepseek-v3", TP: 8, SeqLens: []int{17, 40}, PageSize: 16, Splits: 2, Seed: 1}},
		{"page_boundary_off_by_one", cases.Case{Name: "boundary", Kernel: "kv_cache_write", Latent: 32, Rope: 16, SeqLens: []int{33, 20, 5}, PageSize: 16, Seed: 2}},
		{"global_scale_inverted", cases.Case{Name: "gemm", Kernel: "nvfp4_gemm", M: 16, N: 64, K: 256, Seed: 3}},
		{"unweighted_average", cases.Case{Name: "combine", Kernel: "splitk_combine", Preset: "kimi-k2", TP: 8, Batch: 2, Splits: 4, Seed: 4}},
	}
	for _, tc := range tests {
		t.Run(tc.fault, func(t *testing.T) {
			r, err := Case(context.Background(), tc.c, faulty(t, tc.fault), Options{})
			if err != nil {
				t.Fatal(err)
			}
			if r.After >= r.Before || len(r.Steps) == 0 {
				t.Errorf("%d -> %d bytes in %v: want smaller evidence", r.Before, r.After, r.Steps)
			}
			if got := FingerprintOf(r.Check); got != r.Fingerprint || got.Verdict != check.Fail {
				t.Errorf("shrunk fingerprint %v, original %v", got, r.Fingerprint)
			}
			if err := r.Case.Validate(); err != nil {
				t.Errorf("shrunk case is not a valid case: %v", err)
			}
			path := filepath.Join(t.TempDir(), "min.safetensors")
			if err := safetensors.Write(path, r.Capture.Metadata, r.Capture.Tensors, safetensors.WriteOptions{}); err != nil {
				t.Fatal(err)
			}
			if got := FingerprintOf(check.File(t.Context(), path, nil, check.Options{})); got != r.Fingerprint {
				t.Errorf("the written evidence checks to %v, want %v", got, r.Fingerprint)
			}
			if r.Capture.Metadata["kcheck.case_json"] == "" || r.Capture.Metadata["kcheck.shrunk_from"] != tc.c.Name {
				t.Errorf("metadata lacks the shrunk case or its origin: %v", r.Capture.Metadata)
			}
		})
	}
}

// Where the signature needs structure, shrinking keeps it: a page-boundary
// off-by-one still fails on page offsets.
func TestCaseShrinkPageBoundaryPattern(t *testing.T) {
	c := cases.Case{Name: "b", Kernel: "kv_cache_write", Latent: 32, Rope: 16, SeqLens: []int{33, 20}, PageSize: 16, Seed: 2}
	r, err := Case(context.Background(), c, faulty(t, "page_boundary_off_by_one"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if r.Fingerprint.Pattern != "page_boundary" || FingerprintOf(r.Check).Pattern != "page_boundary" {
		t.Errorf("fingerprint %v -> %v; want page_boundary kept", r.Fingerprint, FingerprintOf(r.Check))
	}
}

func TestShrinkRefusesAPass(t *testing.T) {
	c := cases.Case{Name: "ok", Kernel: "nvfp4_gemm", M: 4, N: 16, K: 64, Seed: 1}
	if _, err := Case(context.Background(), c, backend.Reference{}, Options{}); err == nil {
		t.Error("shrinking a passing case succeeded")
	}
}

// captureOf runs a fault's trigger (reshaped inputs included) into a capture.
func captureOf(t *testing.T, name string) evidence.Capture {
	t.Helper()
	f, _ := faults.Lookup(name)
	in, err := f.Trigger.Inputs()
	if err != nil {
		t.Fatal(err)
	}
	meta, _ := f.Trigger.Case.Metadata()
	outs, err := faults.Backend{Fault: f}.Run(context.Background(), f.Trigger.Case.Kernel, in)
	if err != nil {
		t.Fatal(err)
	}
	ts := map[string]*tensor.Tensor{}
	for k, v := range in.Tensors {
		ts[k] = v
	}
	for k, v := range outs {
		ts[k] = v
	}
	return evidence.Capture{Name: name, Metadata: meta, Tensors: ts}
}

// Captures shrink by slicing, on every kernel family that decomposes.
func TestCaptureShrink(t *testing.T) {
	for _, name := range []string{"zero_block_nan", "fused_shard_global_scale", "scale_padding_uninitialised",
		"stale_pages", "rope_dropped", "stale_partial", "global_scale_inverted"} {
		t.Run(name, func(t *testing.T) {
			r, err := Capture(context.Background(), captureOf(t, name), Options{})
			if err != nil {
				t.Fatal(err)
			}
			if r.After >= r.Before {
				t.Errorf("%d -> %d bytes: want smaller", r.Before, r.After)
			}
			if got := FingerprintOf(r.Check); got != r.Fingerprint {
				t.Errorf("shrunk fingerprint %v, original %v", got, r.Fingerprint)
			}
		})
	}
}

func TestCaptureShrinkRefusesPipelines(t *testing.T) {
	c, closeFn, err := check.Load("../../fixtures/examples/pipeline_quant_nibble_order.safetensors", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	if _, err := Capture(context.Background(), c, Options{}); err == nil {
		t.Error("a pipeline capture was sliced")
	}
}

func TestSubsets(t *testing.T) {
	// The first item, each half, then each quarter's complement.
	want := [][]int{{0}, {0, 1}, {2, 3}, {1, 2, 3}, {0, 2, 3}, {0, 1, 3}, {0, 1, 2}}
	if got := subsets(4); !reflect.DeepEqual(got, want) {
		t.Errorf("subsets(4) = %v, want %v", got, want)
	}
	if got := subsets(1); got != nil {
		t.Errorf("subsets(1) = %v, want none", got)
	}
}
