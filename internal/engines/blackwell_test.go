package engines

import (
	"math"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/evidence"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// trtllmCapture lays a contract-named mla_decode capture out as
// flashinfer.mla.trtllm_batch_decode_with_kv_cache_mla is called and
// returns (flashinfer-python 0.7.2.post1 flashinfer/mla/_core.py:4859-4893,
// :3847-4000; vLLM's call, vllm 0.33.0
// vllm/v1/attention/backends/mla/flashinfer_mla.py:432-446): query [B,
// q_len, H, 576] as it is, kv_cache unsqueezed to [NB, 1, P, 576],
// block_tables, seq_lens, out [B, q_len, H, 512], and the lse [B*q_len, H]
// (flat) or [B, q_len, H], written here element by element from the
// contract's [B, H, s_q], independently of the conversion under test.
func trtllmCapture(meta map[string]string, ts map[string]*tensor.Tensor, flatLSE bool, extra map[string]string) (map[string]string, map[string]*tensor.Tensor) {
	q, kc, lse := ts["q"], ts["kv_cache"], ts["lse"]
	B, SQ, H := q.Shape[0], q.Shape[1], q.Shape[2]
	fl := tensor.New(tensor.F32, B*SQ, H)
	if !flatLSE {
		fl = tensor.New(tensor.F32, B, SQ, H)
	}
	for b := 0; b < B; b++ {
		for h := 0; h < H; h++ {
			for s := 0; s < SQ; s++ {
				fl.SetFloat64((b*SQ+s)*H+h, lse.Float64At((b*H+h)*SQ+s))
			}
		}
	}
	fm := map[string]string{"kcheck.format": "1", "kcheck.kernel": "mla_decode",
		"qk_nope_head_dim": "128", "kv_lora_rank": "512", "qk_rope_head_dim": "64", "max_seq_len": "21",
		"bmm1_scale": meta["softmax_scale"], "bmm2_scale": "1.0", "return_lse": "True", "sparse_mla_top_k": "0",
		"sinks": "None", "skip_softmax_threshold_scale_factor": "None", "enable_dcp": "False", "uses_shared_paged_kv_idx": "True"}
	for k, v := range extra {
		fm[k] = v
	}
	ft := map[string]*tensor.Tensor{
		"query":            q,
		"kv_cache":         {DType: kc.DType, Shape: []int{kc.Shape[0], 1, kc.Shape[1], kc.Shape[2]}, Data: kc.Data},
		"workspace_buffer": tensor.New(tensor.I8, 64),
		"block_tables":     ts["block_table"],
		"seq_lens":         ts["seq_lens"],
		"out":              ts["out"],
		"lse":              fl,
	}
	return fm, ft
}

// A trtllm MLA decode captured in FlashInfer's names checks exactly as the
// contract-named capture of the same run, planted error included: one
// query a request with the cute-dsl runner's natural-log lse in the flat
// [B*q_len, H] layout, and two causal queries a request with a base-2 lse
// (return_lse_base = base2) in [B, q_len, H], where the lse layout is a
// real transposition. Mapping the wrong base, or not transposing, moves
// the failures and fails this test.
func TestTrtllmMLADecodeNames(t *testing.T) {
	for _, tc := range []struct {
		name    string
		sq      int
		lseBase string
		flat    bool
		call    map[string]string
		corrupt string
		at      int
		want    []string
	}{
		{"cute-dsl q_len 1", 1, "e", true, map[string]string{"backend": "cute-dsl"}, "out", 700,
			[]string{"lse_base = e (backend cute-dsl's natural-log lse)", "kv_cache [4 1 32 576] read as [4 32 576]", "softmax_scale = bmm1_scale", "query -> q", "block_tables -> block_table"}},
		{"base2 q_len 2", 2, "2", false, map[string]string{"return_lse_base": "base2", "backend": "auto"}, "lse", 3,
			[]string{"lse_base = 2 (return_lse_base = base2)", "causal = true (q_len = 2", "lse [2 2 2] read as [B, H, q_len] [2 2 2]"}},
		{"trtllm-gen base 2", 1, "2", true, map[string]string{"backend": "trtllm-gen"}, "lse", 2,
			[]string{"lse_base = 2 (backend trtllm-gen's base-2 lse)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := mlaCase()
			c.PageSize = 32 // trtllm-gen takes pages of 32 or 64 tokens (_core.py:4429-4432)
			c.SQ = tc.sq
			meta, ts := capture(t, c, map[string]string{"lse_base": tc.lseBase}, tc.corrupt, tc.at)
			want := mustFail(t, check.Run(t.Context(), evidence.Capture{Name: "contract", Metadata: meta, Tensors: ts}, check.Options{}))
			fm, ft := trtllmCapture(meta, ts, tc.flat, tc.call)
			got := check.Run(t.Context(), evidence.Capture{Name: "trtllm", Metadata: fm, Tensors: ft}, fromOpts(t, "flashinfer"))
			if g, w := checksJSON(t, got), checksJSON(t, want); g != w {
				t.Fatalf("trtllm-named capture checks differently:\n got %s\nwant %s\nnotes %q", g, w, got.Notes)
			}
			wantNotes(t, got.Notes, tc.want...)
		})
	}
}

// What trtllm_batch_decode_with_kv_cache_mla can be called with but
// mla_decode does not model is refused with the argument named, never
// read as something else.
func TestTrtllmMLADecodeRefuses(t *testing.T) {
	c := mlaCase()
	c.PageSize = 32
	meta, ts := capture(t, c, map[string]string{"lse_base": "e"}, "", 0)
	for _, tc := range []struct {
		name  string
		call  map[string]string
		edit  func(ft map[string]*tensor.Tensor)
		error string
	}{
		{"auto backend, base unknown", map[string]string{"backend": "auto"}, nil, `backend "auto" and no return_lse_base`},
		{"no backend recorded", nil, nil, `backend "" and no return_lse_base`},
		{"declared base contradicts the call", map[string]string{"backend": "trtllm-gen", "lse_base": "e"}, nil, "lse_base = e, but the call's backend trtllm-gen's base-2 lse says 2"},
		{"bad return_lse_base", map[string]string{"return_lse_base": "base10"}, nil, `return_lse_base = "base10"`},
		{"output scale", map[string]string{"backend": "cute-dsl", "bmm2_scale": "0.5"}, nil, "bmm2_scale = 0.5"},
		{"sparse", map[string]string{"backend": "cute-dsl", "sparse_mla_top_k": "2048"}, nil, `sparse_mla_top_k = "2048"`},
		{"dcp", map[string]string{"backend": "cute-dsl", "enable_dcp": "True"}, nil, `enable_dcp = "True"`},
		{"skip softmax", map[string]string{"backend": "cute-dsl", "skip_softmax_threshold_scale_factor": "0.01"}, nil, "skip_softmax_threshold_scale_factor"},
		{"trt-llm page table", map[string]string{"backend": "cute-dsl", "uses_shared_paged_kv_idx": "False"}, nil, "uses_shared_paged_kv_idx"},
		{"no bmm1_scale", map[string]string{"backend": "cute-dsl", "bmm1_scale": "None"}, nil, "bmm1_scale is missing"},
		{"sinks", map[string]string{"backend": "cute-dsl"}, func(ft map[string]*tensor.Tensor) { ft["sinks"] = tensor.New(tensor.F32, 2) }, "tensor sinks"},
		{"fp8", map[string]string{"backend": "cute-dsl"}, func(ft map[string]*tensor.Tensor) {
			q := ft["query"]
			ft["query"] = &tensor.Tensor{DType: tensor.F8E4M3, Shape: q.Shape, Data: make([]byte, q.Len())}
		}, "over an fp8 cache: the query is fp8 too"},
		{"two kv heads", map[string]string{"backend": "cute-dsl"}, func(ft map[string]*tensor.Tensor) {
			kc := ft["kv_cache"]
			nb := kc.Shape[0] / 2
			ft["kv_cache"] = &tensor.Tensor{DType: kc.DType, Shape: []int{nb, 2, kc.Shape[2], kc.Shape[3]}, Data: kc.Data[:nb*2*kc.Shape[2]*kc.Shape[3]*kc.DType.Size()]}
		}, "one KV head in dimension 1"},
		{"lse shape", map[string]string{"backend": "cute-dsl"}, func(ft map[string]*tensor.Tensor) { ft["lse"] = tensor.New(tensor.F32, 3, 2) }, "writes [B*q_len, H] = [2, 2]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fm, ft := trtllmCapture(meta, ts, true, tc.call)
			if tc.edit != nil {
				tc.edit(ft)
			}
			r := check.Run(t.Context(), evidence.Capture{Name: "trtllm", Metadata: fm, Tensors: ft}, fromOpts(t, "flashinfer"))
			if r.Verdict != check.Error || r.Error == nil || !strings.Contains(*r.Error, tc.error) {
				t.Fatalf("verdict %s, error %v; want an error saying %q (notes %q)", r.Verdict, r.Error, tc.error, r.Notes)
			}
		})
	}
}

// cutlassCapture lays a contract-named capture out as vLLM's CUTLASS_MLA
// calls sm100_cutlass_mla_decode (vllm 0.33.0
// vllm/v1/attention/backends/mla/cutlass_mla.py:166-247): q_nope [B, H,
// 512] and q_pe [B, H, 64] split from q, the cache as it is, page_table,
// and out [B, 128, 512] and lse [B, 128] allocated for the kernel's 128
// heads, the heads past H holding NaN (torch.empty's garbage: not data).
func cutlassCapture(meta map[string]string, ts map[string]*tensor.Tensor) (map[string]string, map[string]*tensor.Tensor) {
	q, out, lse := ts["q"], ts["out"], ts["lse"]
	B, H, D := q.Shape[0], q.Shape[2], q.Shape[3]
	L := out.Shape[3]
	qn, qp := tensor.New(q.DType, B, H, L), tensor.New(q.DType, B, H, D-L)
	po, pl := tensor.New(out.DType, B, 128, L), tensor.New(tensor.F32, B, 128)
	for b := 0; b < B; b++ {
		for h := 0; h < 128; h++ {
			pl.SetFloat64(b*128+h, math.NaN())
			for i := 0; i < L; i++ {
				po.SetFloat64((b*128+h)*L+i, math.NaN())
			}
			if h >= H {
				continue
			}
			pl.SetFloat64(b*128+h, lse.Float64At(b*H+h))
			for i := 0; i < D; i++ {
				x := q.Float64At((b*H+h)*D + i)
				if i < L {
					qn.SetFloat64((b*H+h)*L+i, x)
					po.SetFloat64((b*128+h)*L+i, out.Float64At((b*H+h)*L+i))
				} else {
					qp.SetFloat64((b*H+h)*(D-L)+i-L, x)
				}
			}
		}
	}
	fm := map[string]string{"kcheck.format": "1", "kcheck.kernel": "mla_decode", "scale": meta["softmax_scale"], "num_kv_splits": "-1"}
	ft := map[string]*tensor.Tensor{
		"q_nope": qn, "q_pe": qp, "kv_c_and_k_pe_cache": ts["kv_cache"], "seq_lens": ts["seq_lens"],
		"page_table": ts["block_table"], "workspace": tensor.New(tensor.U8, 64), "out": po, "lse": pl,
	}
	return fm, ft
}

// vLLM's CUTLASS_MLA call checks exactly as the contract-named capture of
// the same run, planted errors in out and lse included; the heads past H
// the kernel's 128-head tile leaves in out and lse are not read (they hold
// NaN here, which would fail any check that read them).
func TestCutlassMLADecodeNames(t *testing.T) {
	c := mlaCase()
	c.PageSize = 128 // CUTLASS_MLA's only block size (cutlass_mla.py:48-50)
	for _, corrupt := range []string{"out", "lse"} {
		meta, ts := capture(t, c, map[string]string{"softmax_block": "128"}, corrupt, 1)
		want := mustFail(t, check.Run(t.Context(), evidence.Capture{Name: "contract", Metadata: meta, Tensors: ts}, check.Options{}))
		fm, ft := cutlassCapture(meta, ts)
		got := check.Run(t.Context(), evidence.Capture{Name: "cutlass", Metadata: fm, Tensors: ft}, fromOpts(t, "vllm"))
		if g, w := checksJSON(t, got), checksJSON(t, want); g != w {
			t.Fatalf("%s planted: CUTLASS_MLA-named capture checks differently:\n got %s\nwant %s\nnotes %q", corrupt, g, w, got.Notes)
		}
		wantNotes(t, got.Notes, "q = q_nope [2 2 512] | q_pe [2 2 64]", "page_table -> block_table", "scale read as softmax_scale",
			"out [2 128 512] read for q's 2 heads", "lse [2 128] read for q's 2 heads", "softmax_block = 128, p_dtype = bf16", "not mla_decode's num_splits")
	}
	meta, ts := capture(t, c, nil, "", 0)
	for _, tc := range []struct {
		name  string
		edit  func(ft map[string]*tensor.Tensor)
		error string
	}{
		{"fp8", func(ft map[string]*tensor.Tensor) {
			q := ft["q_nope"]
			ft["q_nope"] = &tensor.Tensor{DType: tensor.F8E4M3, Shape: q.Shape, Data: make([]byte, q.Len())}
		}, "with an fp8 q_nope"},
		{"q_pe missing", func(ft map[string]*tensor.Tensor) { delete(ft, "q_pe") }, "q_nope and q_pe come together"},
		{"out with fewer heads", func(ft map[string]*tensor.Tensor) { ft["out"] = tensor.New(tensor.BF16, 2, 1, 512) }, "tensor out has shape [2 1 512]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fm, ft := cutlassCapture(meta, ts)
			tc.edit(ft)
			r := check.Run(t.Context(), evidence.Capture{Name: "cutlass", Metadata: fm, Tensors: ft}, fromOpts(t, "vllm"))
			if r.Verdict != check.Error || r.Error == nil || !strings.Contains(*r.Error, tc.error) {
				t.Fatalf("verdict %s, error %v; want an error saying %q (notes %q)", r.Verdict, r.Error, tc.error, r.Notes)
			}
		})
	}
}

// FlashInfer's MLA wrapper with backend = "cutlass" (flashinfer-python
// 0.7.2.post1 flashinfer/mla/_batch_mla/_wrapper.py:852-877 run(...,
// kv_len, page_table), the structural query= and kv_cache= packed, 128
// heads, no lse: _batch_mla/_backends/cutlass_backend.py:43-80, 354-355)
// checks exactly as the contract-named capture; an FP8 output scale is
// refused.
func TestFlashInferCutlassMLANames(t *testing.T) {
	c := mlaCase()
	c.Heads = 128   // the backend's only head count (cutlass_backend.py:54-55)
	c.PageSize = 64 // a page size dividing 128 (cutlass_backend.py:28-40)
	meta, ts := capture(t, c, map[string]string{"softmax_block": "128"}, "out", 9000)
	delete(ts, "lse") // the cutlass backend writes none
	want := mustFail(t, check.Run(t.Context(), evidence.Capture{Name: "contract", Metadata: meta, Tensors: ts}, check.Options{}))
	q, out := ts["q"], ts["out"]
	fm := map[string]string{"kcheck.format": "1", "kcheck.kernel": "mla_decode", "backend": "cutlass", "sm_scale": meta["softmax_scale"],
		"page_size": meta["page_size"], "return_lse": "False", "bmm1_scale": "None", "bmm2_scale": "None", "o_scale": "None"}
	ft := map[string]*tensor.Tensor{
		"query":      {DType: q.DType, Shape: []int{q.Shape[0], q.Shape[2], q.Shape[3]}, Data: q.Data},
		"kv_cache":   ts["kv_cache"],
		"kv_len":     ts["seq_lens"],
		"page_table": ts["block_table"],
		"output":     {DType: out.DType, Shape: []int{out.Shape[0], out.Shape[2], out.Shape[3]}, Data: out.Data},
	}
	got := check.Run(t.Context(), evidence.Capture{Name: "cutlass", Metadata: fm, Tensors: ft}, fromOpts(t, "flashinfer"))
	if g, w := checksJSON(t, got), checksJSON(t, want); g != w {
		t.Fatalf("cutlass-backend capture checks differently:\n got %s\nwant %s\nnotes %q", g, w, got.Notes)
	}
	wantNotes(t, got.Notes, "kv_len -> seq_lens", "page_table -> block_table", "query -> q", "softmax_block = 128, p_dtype = bf16")
	fm["o_scale"] = "0.5"
	r := check.Run(t.Context(), evidence.Capture{Name: "cutlass", Metadata: fm, Tensors: ft}, fromOpts(t, "flashinfer"))
	if r.Verdict != check.Error || r.Error == nil || !strings.Contains(*r.Error, `o_scale = "0.5"`) {
		t.Fatalf("verdict %s, error %v; want o_scale refused", r.Verdict, r.Error)
	}
}

// What of FlashInfer's FP8 MLA stays refused (audit I5; the rest reads,
// fp8mla_test.go): each refusal names the argument and the source.
func TestFlashInferFP8MLARefused(t *testing.T) {
	fp8 := map[string]*tensor.Tensor{"ckv_cache": tensor.New(tensor.F8E4M3, 2, 4, 512), "kpe_cache": tensor.New(tensor.F8E4M3, 2, 4, 64)}
	bf := map[string]*tensor.Tensor{"ckv_cache": tensor.New(tensor.BF16, 2, 4, 512), "kpe_cache": tensor.New(tensor.BF16, 2, 4, 64)}
	for _, tc := range []struct {
		name  string
		meta  map[string]string
		ts    map[string]*tensor.Tensor
		qType tensor.DType
		error string
	}{
		{"scales over a bf16 cache", map[string]string{"ckv_scale": "0.02", "kpe_scale": "0.01"}, bf, tensor.BF16, "ckv_scale, kpe_scale given but the cache is not fp8"},
		{"both latent scales", map[string]string{"ckv_scale": "0.02", "kpe_scale": "0.01"},
			map[string]*tensor.Tensor{"ckv_scale_arr": tensor.New(tensor.F32, 2, 4, 4)}, tensor.BF16, "exactly one of ckv_scale and tensor ckv_scale_arr (flashinfer-python 0.7.2.post1 flashinfer/mla/_batch_mla/_backends/_fa_common.py:693-697); the capture has both"},
		{"no latent scale", map[string]string{"ckv_scale": "None", "kpe_scale": "0.01"}, nil, tensor.BF16, "the capture has neither"},
		{"no kpe_scale", map[string]string{"ckv_scale": "0.02"}, nil, tensor.BF16, "kpe_scale is missing"},
		{"fp16 query", map[string]string{"ckv_scale": "0.02", "kpe_scale": "0.01"}, nil, tensor.F16, "tensor q_nope is F16: FlashInfer's FP8 MLA takes a bf16 query only"},
		{"cutlass backend", map[string]string{"ckv_scale": "0.02", "kpe_scale": "0.01", "backend": "cutlass"}, nil, tensor.BF16, `parameter backend = "cutlass" with an fp8 cache`},
		{"scale not a number", map[string]string{"ckv_scale": "0.02", "kpe_scale": "tiny"}, nil, tensor.BF16, `parameter kpe_scale = "tiny" is not a number`},
		// a trtllm call over a 3-D fp8 kv_cache is trtllmMLA's to refuse, in its own words
		{"trtllm fp8 call", map[string]string{"bmm1_scale": "0.1", "kv_lora_rank": "512"},
			map[string]*tensor.Tensor{"ckv_cache": nil, "kpe_cache": nil, "q_nope": nil, "q_pe": nil,
				"query": tensor.New(tensor.F8E4M3, 2, 1, 2, 576), "kv_cache": tensor.New(tensor.F8E4M3, 2, 4, 576)}, tensor.BF16, "trtllm_batch_decode_with_kv_cache_mla over an fp8 cache"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			meta := map[string]string{"kcheck.format": "1", "kcheck.kernel": "mla_decode", "sm_scale": "0.1"}
			for k, v := range tc.meta {
				meta[k] = v
			}
			ts := map[string]*tensor.Tensor{"q_nope": tensor.New(tc.qType, 2, 2, 512), "q_pe": tensor.New(tc.qType, 2, 2, 64)}
			for k, v := range fp8 {
				ts[k] = v
			}
			for k, v := range tc.ts {
				if v == nil {
					delete(ts, k)
				} else {
					ts[k] = v
				}
			}
			r := check.Run(t.Context(), evidence.Capture{Name: "fp8", Metadata: meta, Tensors: ts}, fromOpts(t, "flashinfer"))
			if r.Verdict != check.Error || r.Error == nil || !strings.Contains(*r.Error, tc.error) {
				t.Fatalf("verdict %s, error %v; want a refusal saying %q", r.Verdict, r.Error, tc.error)
			}
		})
	}
}
