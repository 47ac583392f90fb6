package engines

import (
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/evidence"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// indexerCase is an MTP step (next_n 2) over the fp8 indexer cache, small.
func indexerCase(extra map[string]string) cases.Case {
	p := map[string]string{"k_cache_dtype": "fp8_e4m3", "next_n": "2"}
	for k, v := range extra {
		p[k] = v
	}
	return cases.Case{Name: "idx", Kernel: "dsa_indexer", Heads: 4, SeqLens: []int{21, 9}, PageSize: 16, TopK: 8, Seed: 11, Params: p}
}

// asVLLM rewrites a contract-named dsa_indexer capture the way vLLM's
// decode hands the tensors to its logits call and top-k (internal/engines
// indexer.go has the sources), by explicit shapes and copies independent
// of the conversions under test: q [B, next_n, H, D], the cache viewed
// [NB, P, 1, D+4], context_lens [B, 1], and logits whose columns past each
// row's visible length hold what a torch.empty workspace may (here 7 and
// NaN): a correct kernel's capture.
func asVLLM(t *testing.T, meta map[string]string, ts map[string]*tensor.Tensor) (map[string]string, map[string]*tensor.Tensor) {
	t.Helper()
	m := map[string]string{}
	for k, v := range meta {
		if k != "next_n" && k != "k_cache_dtype" && k != "topk" && k != "max_seq" {
			m[k] = v
		}
	}
	q, kc, sl := ts["q"], ts["k_cache"], ts["seq_lens"]
	b := sl.Shape[0]
	n := q.Shape[0] / b
	out := map[string]*tensor.Tensor{
		"q_fp8":        {DType: q.DType, Shape: []int{b, n, q.Shape[1], q.Shape[2]}, Data: q.Data},
		"kv_cache":     {DType: kc.DType, Shape: []int{kc.Shape[0], kc.Shape[1], 1, kc.Shape[2]}, Data: kc.Data},
		"context_lens": {DType: sl.DType, Shape: []int{b, 1}, Data: sl.Data},
		"block_tables": ts["block_table"],
		"weights":      ts["weights"],
		"topk_indices": ts["topk_indices"],
	}
	lg := ts["scores"].Clone()
	w := lg.Shape[1]
	for r := 0; r < lg.Shape[0]; r++ {
		for c := int(sl.Int64At(r/n)) - n + r%n + 1; c < w; c++ {
			lg.SetFloat64(r*w+c, []float64{7, math.NaN()}[c%2])
		}
	}
	out["logits"] = lg
	m["max_model_len"] = strconv.Itoa(w)
	m["topk_tokens"] = strconv.Itoa(ts["topk_indices"].Shape[1])
	return m, out
}

// A dsa_indexer decode captured in vLLM's names and layouts checks, under
// --from vllm, exactly as the contract-named capture of the same step; a
// wrong score, a future token in a logits buffer declared filled with
// -inf, and the converted top-k with another request's slots fail on the
// right tensor; what has no contract is refused by name. (Planted: with
// indexerUnwritten skipped, the faithful capture fails on the 7s and NaNs
// past the rows' lengths; with the req_id check removed the swapped
// conversion is read.)
func TestVLLMIndexerNames(t *testing.T) {
	meta, ts := capture(t, indexerCase(nil), nil, "", 0)
	want := check.Run(t.Context(), evidence.Capture{Name: "contract", Metadata: meta, Tensors: ts}, check.Options{})
	if want.Verdict != check.Pass {
		t.Fatalf("the contract-named capture: verdict %s", want.Verdict)
	}
	gmeta, gts := capture(t, indexerCase(map[string]string{"topk_index": "global_slot"}), nil, "", 0)
	type tc struct {
		name    string
		edit    func(m map[string]string, ts map[string]*tensor.Tensor)
		global  bool
		verdict compare.Verdict
		tensor  string // the failing output
		err     string // the error names this
	}
	for _, c := range []tc{
		{name: "faithful", verdict: check.Pass},
		{name: "score wrong", edit: func(m map[string]string, ts map[string]*tensor.Tensor) {
			lg := ts["logits"].Clone()
			lg.SetFloat64(3, lg.Float64At(3)*1.5+1)
			ts["logits"] = lg
		}, verdict: check.Fail, tensor: "scores"},
		{name: "future token, buffer filled with -inf", edit: func(m map[string]string, ts map[string]*tensor.Tensor) {
			m["logits_past_len"] = "-inf"
			lg := ts["logits"].Clone()
			w := lg.Shape[1]
			for i := 0; i < lg.Len(); i++ {
				if v := lg.Float64At(i); math.IsNaN(v) || v == 7 {
					lg.SetFloat64(i, math.Inf(-1))
				}
			}
			lg.SetFloat64(0*w+20, 1.25) // request 0 row 0 sees 20 of 21 tokens: token 20 is its future
			ts["logits"] = lg
		}, verdict: check.Fail, tensor: "scores"},
		// weights and logits name the kernel (a note says so)
		{name: "no kcheck.kernel", edit: func(m map[string]string, ts map[string]*tensor.Tensor) {
			delete(m, "kcheck.kernel")
		}, verdict: check.Pass},
		// the case's cache is written with amax scales: vLLM's scale_fmt None
		{name: "scale_fmt None", edit: func(m map[string]string, ts map[string]*tensor.Tensor) {
			m["scale_fmt"] = "None"
		}, verdict: check.Pass},
		{name: "scale_fmt ue8m0 over amax scales", edit: func(m map[string]string, ts map[string]*tensor.Tensor) {
			m["scale_fmt"] = "ue8m0"
		}, verdict: check.Error, err: "tensor k_cache: request 0 token 0"},
		{name: "global slots", global: true, verdict: check.Pass},
		{name: "global slots, another request's", global: true, edit: func(m map[string]string, ts map[string]*tensor.Tensor) {
			ts["req_id"] = tensor.FromInt64s(tensor.I32, []int{4}, []int64{0, 1, 1, 0})
		}, verdict: check.Error, err: "req_id[1] = 1"},
		{name: "MX query scale", edit: func(m map[string]string, ts map[string]*tensor.Tensor) {
			ts["q_scale"] = tensor.New(tensor.I32, 2, 2, 4)
		}, verdict: check.Error, err: "q_scale"},
		{name: "MXFP4 cache", edit: func(m map[string]string, ts map[string]*tensor.Tensor) {
			ts["kv_cache"] = tensor.New(tensor.U8, ts["kv_cache"].Shape[0], 16, 1, 68)
		}, verdict: check.Error, err: "MXFP4 indexer cache"},
		// SM100's DeepGEMM returns bf16 logits from bf16 weights
		// (vllm 0.33.0 vllm/utils/deep_gemm.py:763-764, :775-777)
		{name: "bf16 logits", edit: func(m map[string]string, ts map[string]*tensor.Tensor) {
			lg := ts["logits"]
			ts["logits"] = tensor.New(tensor.BF16, lg.Shape...)
		}, verdict: check.Error, err: "tensor scores has dtype BF16"},
		{name: "next_n against q", edit: func(m map[string]string, ts map[string]*tensor.Tensor) {
			m["next_n"] = "1"
		}, verdict: check.Error, err: "parameter next_n = 1"},
		{name: "block stride", global: true, edit: func(m map[string]string, ts map[string]*tensor.Tensor) {
			m["BLOCK_STRIDE_ROWS"] = "32"
		}, verdict: check.Error, err: "BLOCK_STRIDE_ROWS = 32"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, vts := asVLLM(t, meta, ts)
			if c.global {
				m, vts = asVLLM(t, gmeta, gts)
				delete(m, "topk_index")
				vts["req_id"] = tensor.FromInt64s(tensor.I32, []int{4}, []int64{0, 0, 1, 1})
				vts["topk_length"] = tensor.New(tensor.I32, 4)
			}
			if c.edit != nil {
				c.edit(m, vts)
			}
			r := check.Run(t.Context(), evidence.Capture{Name: "vllm", Metadata: m, Tensors: vts}, fromOpts(t, "vllm"))
			if r.Verdict != c.verdict {
				t.Fatalf("verdict %s, want %s (error %v)\n  %s\n  %s", r.Verdict, c.verdict, r.Error, failing(r), strings.Join(r.Notes, "\n  "))
			}
			switch {
			case c.err != "":
				if r.Error == nil || !strings.Contains(*r.Error, c.err) {
					t.Fatalf("error %q does not name %q", errText(r), c.err)
				}
			case c.tensor != "":
				if got := failing(r); got != c.tensor {
					t.Fatalf("failing %q, want %s", got, c.tensor)
				}
			case !c.global && c.edit == nil:
				if got, w := checksJSON(t, r), checksJSON(t, want); got != w {
					t.Fatalf("checks differ from the contract-named capture's:\n got %s\nwant %s", got, w)
				}
			}
		})
	}
}

func errText(r check.Result) string {
	if r.Error == nil {
		return ""
	}
	return *r.Error
}
