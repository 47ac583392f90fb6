package shrink

import (
	"context"
	"testing"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/backend"
	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/faults"
)

// A gather reading token t from block_table[(t-1)/P] is first wrong at the
// context that holds token P, i.e. P+1: with P = 16, 17.
func TestBisectContext(t *testing.T) {
	f, _ := faults.Lookup("page_boundary_off_by_one")
	c := cases.Case{Name: "g", Kernel: "kv_cache_gather", Latent: 32, Rope: 16, SeqLens: []int{50, 40}, PageSize: 16, Seed: 5}
	res, err := BisectContext(context.Background(), c, faults.Backend{Fault: f}, check.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.FirstContextLen == nil || *res.FirstContextLen != 17 || res.Verdict != "fail" {
		t.Errorf("first context %v (%s, %v); want 17", res.FirstContextLen, res.Verdict, res.Probes)
	}
	pass, err := BisectContext(context.Background(), c, backend.Reference{}, check.Options{})
	if err != nil || pass.Verdict != "pass" || pass.FirstContextLen != nil {
		t.Errorf("reference: %+v, %v; want pass", pass, err)
	}
	if _, err := BisectContext(context.Background(), cases.Case{Name: "q", Kernel: "nvfp4_gemm"}, backend.Reference{}, check.Options{}); err == nil {
		t.Error("a GEMM case was bisected on context length")
	}
}
