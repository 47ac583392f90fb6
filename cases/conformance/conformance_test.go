package conformance

import (
	"context"
	"fmt"
	"testing"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// The reference conforms, on the smallest case of each kernel and cache
// dtype (that it passes every catalog case is
// internal/compare's TestDeclaredPrecisionReferencePasses, which make test
// runs without the race detector).
func TestReferenceConforms(t *testing.T) {
	all, err := Cases()
	if err != nil {
		t.Fatal(err)
	}
	RunCases(t, Reference(), Smallest(all))
}

// catalogCase is the catalog's case name.
func catalogCase(t *testing.T, name string) cases.Case {
	t.Helper()
	all, err := cases.Catalog()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range all {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no catalog case %s", name)
	return cases.Case{}
}

// unsupported implements nothing.
type unsupported struct{}

func (unsupported) Name() string { return "nothing" }

func (unsupported) Run(context.Context, string, map[string]*tensor.Tensor, map[string]string) (map[string]*tensor.Tensor, map[string]string, error) {
	return nil, nil, fmt.Errorf("no kernels here: %w", ErrUnsupported)
}

// The suite has teeth: a backend with a planted bug fails the cases the
// bug fires on, naming the output and the pattern; a backend that does not
// implement a kernel is skipped, not passed.
func TestOutcomes(t *testing.T) {
	offByOne, err := Faulty("page_boundary_off_by_one")
	if err != nil {
		t.Fatal(err)
	}
	nibbles, err := Faulty("nibble_order")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		b       Backend
		c       string
		verdict string
	}{
		{"reference", Reference(), "kv_cache_gather/bf16/p16/ctx-3P", string(check.Pass)},
		{"page off by one", offByOne, "kv_cache_gather/bf16/p16/ctx-3P", string(check.Fail)},
		{"nibble order", nibbles, "nvfp4_dequantize/m16/k2048/linear/dequant", string(check.Fail)},
		{"unsupported", unsupported{}, "kv_cache_gather/bf16/p16/ctx-3P", "unsupported"},
	} {
		o := runCase(t.Context(), catalogCase(t, tc.c), tc.b)
		if o.Verdict != tc.verdict {
			t.Errorf("%s on %s: verdict %s (%s), want %s", tc.name, tc.c, o.Verdict, o.Reason, tc.verdict)
		}
		if tc.verdict == string(check.Fail) && (o.Reason == "" || o.Capture == nil) {
			t.Errorf("%s on %s: a failure says nothing (%q) or keeps no capture", tc.name, tc.c, o.Reason)
		}
	}
}
