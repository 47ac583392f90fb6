package check

import (
	"github.com/kcheck-dev/kcheck/internal/evidence"
	"slices"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/safetensors"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

func loadExample(t *testing.T, name string) evidence.Capture {
	t.Helper()
	f, err := safetensors.Open("../../fixtures/examples/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c := evidence.Capture{Name: name, Metadata: map[string]string{}, Tensors: map[string]*tensor.Tensor{}}
	for k, v := range f.Metadata {
		c.Metadata[k] = v
	}
	for k, v := range f.Tensors {
		c.Tensors[k] = v.Clone()
	}
	return c
}

func TestPipelineAttribution(t *testing.T) {
	if testing.Short() {
		t.Skip("pipelines checked stage by stage: make test runs it in its pass without -race (-short is its race-detector pass)")
	}
	ok := Run(t.Context(), loadExample(t, "pipeline_ok.safetensors"), Options{})
	if ok.Verdict != Pass || ok.Stage != nil {
		t.Fatalf("correct pipeline: verdict %s stage %v", ok.Verdict, ok.Stage)
	}
	if len(ok.Stages) != 4 {
		t.Fatalf("%d stages, want quant,cache,attn,combine", len(ok.Stages))
	}
	for _, st := range ok.Stages[1:] {
		if len(st.Propagated) == 0 {
			t.Errorf("stage %s has links but no propagated checks", st.Prefix)
		}
	}
	bad := Run(t.Context(), loadExample(t, "pipeline_quant_nibble_order.safetensors"), Options{})
	if bad.Verdict != Fail || bad.Stage == nil || *bad.Stage != "quant" {
		t.Fatalf("faulty quant: verdict %s stage %v, want fail at quant", bad.Verdict, bad.Stage)
	}
	// Downstream stages are correct on what they were given (local pass)
	// but carry the error along the chain (propagated fail).
	for _, st := range bad.Stages[1:] {
		if st.Verdict != Pass {
			t.Errorf("stage %s local verdict %s, want pass", st.Prefix, st.Verdict)
		}
	}
	propagatedFail := false
	for _, c := range bad.Stages[2].Propagated {
		propagatedFail = propagatedFail || c.Verdict == "fail"
	}
	if !propagatedFail {
		t.Errorf("attn's propagated checks all pass; the quant error should reach them")
	}
}

func TestPipelineMetadataErrors(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(c *evidence.Capture)
		want   string
	}{
		{"no stages", func(c *evidence.Capture) { delete(c.Metadata, "kcheck.stages") }, "kcheck.stages"},
		{"repeated stage", func(c *evidence.Capture) { c.Metadata["kcheck.stages"] = "quant,quant" }, "repeated"},
		{"stage without kernel", func(c *evidence.Capture) { delete(c.Metadata, "kcheck.attn.kernel") }, "kcheck.attn.kernel"},
		{"link to a later stage", func(c *evidence.Capture) { c.Metadata["kcheck.cache.from.kv_c"] = "combine.out" }, "not an earlier stage"},
		{"link to a missing output", func(c *evidence.Capture) { c.Metadata["kcheck.cache.from.kv_c"] = "quant.nothing" }, "has no output nothing"},
		{"link into a missing input", func(c *evidence.Capture) { c.Metadata["kcheck.cache.from.bogus"] = "quant.out" }, "has no input bogus"},
		{"stored copy differs from its link", func(c *evidence.Capture) {
			out := c.Tensors["quant.out"].Clone()
			out.Data[0] ^= 1
			c.Tensors["cache.kv_c"] = out
		}, "linked to quant.out but holds different data"},
		{"stored copy of another size", func(c *evidence.Capture) {
			c.Tensors["cache.kv_c"] = tensor.New(tensor.BF16, 3, 7)
		}, "cache.kv_c is linked to quant.out but holds different data"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := loadExample(t, "pipeline_ok.safetensors")
			tc.mutate(&c)
			res := Run(t.Context(), c, Options{})
			if res.Verdict != Error || res.Error == nil || !strings.Contains(*res.Error, tc.want) {
				t.Fatalf("verdict %s error %v, want error mentioning %q", res.Verdict, res.Error, tc.want)
			}
		})
	}
}

// A link from attn.partial_out [B,s_q,H,S,L] into combine's [N,S,L]
// flattens the leading dimensions (the shipped pipeline relies on it).
func TestFitLinkFlattens(t *testing.T) {
	src := tensor.New(tensor.F32, 2, 1, 4, 3, 8)
	got, err := fitLink(src, kernelSpec("partial_out", 3), nil, "combine.partial_out")
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{8, 3, 8}; !slices.Equal(got.Shape, want) {
		t.Errorf("shape %v, want %v", got.Shape, want)
	}
}

func kernelSpec(name string, rank int) kernel.TensorSpec {
	return kernel.TensorSpec{Name: name, Rank: rank}
}

func TestFitLinkRefusesOtherCounts(t *testing.T) {
	src := tensor.New(tensor.F32, 2, 3)
	if _, err := fitLink(src, kernel.TensorSpec{Name: "x"}, tensor.New(tensor.F32, 7), "s.x"); err == nil || !strings.Contains(err.Error(), "element counts differ") {
		t.Fatalf("err = %v, want element counts differ", err)
	}
}
