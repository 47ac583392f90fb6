package check

import (
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/engines"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// testdata/sglang_triton_decode_s4_ctx3.safetensors is what `kcheck run
// --backend worker:sglang --case mla_decode/split/deepseek-v3/tp8/s4/ctx-S-1
// --out` wrote: SGLang 0.5.23's Triton grouped decode (its own code, run by
// Triton 3.9's interpreter on the CPU) over two requests of three tokens,
// in SGLang's names (kcheck.worker.layout = sglang, no final lse). Its
// partial_lse failed at 3.15x of the tolerance (13 fp32 ulp where the floor
// allowed 4) until the lse's tolerance took in the scores' fp32
// accumulation noise (reference/mla ScoreNoise); out and the partials pass.
// The edits plant what the noise term must not hide.
func TestSGLangTritonDecodeWorkerCapture(t *testing.T) {
	const file = "sglang_triton_decode_s4_ctx3.safetensors"
	opts := Options{Engine: engines.Layout}
	r := Run(t.Context(), loadTestdata(t, file), opts)
	judged := map[string]compare.Verdict{}
	for _, c := range r.Checks {
		judged[c.Tensor] = c.Verdict
	}
	if r.Verdict != Pass || len(judged) != 3 || judged["partial_lse"] != Pass {
		t.Fatalf("verdict %s, checks %v (error %v); want out, partial_out and partial_lse passing", r.Verdict, judged, r.Error)
	}
	if notes := strings.Join(r.Notes, "\n"); !strings.Contains(notes, "lse: not judged") || !strings.Contains(notes, "splits empty, not judged") {
		t.Errorf("notes %q: want the unwritten lse and the empty splits named", r.Notes)
	}
	for _, p := range []struct {
		name, tensor string
		edit         func(ts map[string]*tensor.Tensor)
	}{
		// 1e-4 on a request's split lse: what a softmax scale rounded to
		// bf16 (1.7e-4 relative) does to scores of about 1
		{"attn_lse of request 0 off by 1e-4", "partial_lse", func(ts map[string]*tensor.Tensor) {
			l := ts["attn_lse"] // [B, H, S]
			h, s := l.Shape[1], l.Shape[2]
			for i := 0; i < h*s; i += s {
				l.SetFloat64(i, l.Float64At(i)+1e-4)
			}
		}},
		// (a permutation of a request's own tokens would change nothing:
		// attention does not see their order)
		{"request 0's first token read from request 1's first slot", "out", func(ts map[string]*tensor.Tensor) {
			idx := ts["kv_indices"]
			idx.SetFloat64(0, idx.Float64At(int(ts["kv_indptr"].Float64At(1))))
		}},
	} {
		cp := loadTestdata(t, file)
		p.edit(cp.Tensors)
		r := Run(t.Context(), cp, opts)
		for _, c := range r.Checks {
			if c.Tensor == p.tensor && c.Verdict != Fail {
				t.Errorf("%s: %s %s (%s), want fail", p.name, c.Tensor, c.Verdict, c.Reason)
			}
		}
		if r.Verdict != Fail {
			t.Errorf("%s: verdict %s, want fail", p.name, r.Verdict)
		}
	}
}
