package engines

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/kcheck-dev/kcheck/internal/evidence"
	"math"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// capture builds a contract-named capture of case c: its inputs, and the
// reference outputs (what a correct kernel writes) with one element of
// output `corrupt` perturbed so that the check has failures to locate.
func capture(t *testing.T, c cases.Case, extra map[string]string, corrupt string, at int) (map[string]string, map[string]*tensor.Tensor) {
	t.Helper()
	in, err := c.Inputs()
	if err != nil {
		t.Fatal(err)
	}
	meta, err := c.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range extra {
		meta[k] = v
		in.Params[k] = v
	}
	k, err := kernel.Lookup(c.Kernel)
	if err != nil {
		t.Fatal(err)
	}
	prec, err := kernel.PrecisionFrom(in.Params)
	if err != nil {
		t.Fatal(err)
	}
	outs, err := kernel.Produce(context.Background(), k, in, prec, nil)
	if err != nil {
		t.Fatal(err)
	}
	ts := map[string]*tensor.Tensor{}
	for n, v := range in.Tensors {
		ts[n] = v
	}
	for n, v := range outs {
		ts[n] = v
	}
	if corrupt != "" {
		o := ts[corrupt].Clone()
		if o.DType.IsFloat() && o.DType.Size() > 1 {
			o.SetFloat64(at, o.Float64At(at)+0.5)
		} else {
			o.Data[at*o.DType.Size()] ^= 0x11 // a code or byte the kernel got wrong
		}
		ts[corrupt] = o
	}
	return meta, ts
}

// checksJSON is the comparable part of a result: the per-output checks,
// worst elements and signatures exactly as --json prints them.
func checksJSON(t *testing.T, r check.Result) string {
	t.Helper()
	if r.Error != nil {
		t.Fatalf("%s: error: %s (notes %q)", r.File, *r.Error, r.Notes)
	}
	b, err := json.Marshal(r.Checks)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// wantNotes fails t for each of want that no note of a check contains.
func wantNotes(t *testing.T, notes []string, want ...string) {
	t.Helper()
	all := strings.Join(notes, "\n")
	for _, s := range want {
		if !strings.Contains(all, s) {
			t.Errorf("notes do not say %q:\n%s", s, all)
		}
	}
}

func mustFail(t *testing.T, r check.Result) check.Result {
	t.Helper()
	if r.Verdict != check.Fail {
		t.Fatalf("the planted error was not detected in the contract-named capture: verdict %s", r.Verdict)
	}
	return r
}

func fromOpts(t *testing.T, name string) check.Options {
	t.Helper()
	e, err := Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return check.Options{Conventions: e.Conventions(), Adapt: e.Adapt}
}

// bf16 tensor helpers for building engine layouts by explicit index loops
// (independent of the conversions under test).
func rows(t *tensor.Tensor) [][]byte {
	es := t.DType.Size()
	last := t.Shape[len(t.Shape)-1]
	n := t.Len() / last
	out := make([][]byte, n)
	for i := range out {
		out[i] = t.Data[i*last*es : (i+1)*last*es]
	}
	return out
}

func mlaCase() cases.Case {
	return cases.Case{Name: "mla", Kernel: "mla_decode", Preset: "deepseek-v3", Heads: 2, SeqLens: []int{21, 5},
		PageSize: 16, KVCacheDType: "bf16", Seed: 7}
}

// A capture taken with FlashMLA's own names and layouts (k_cache [NB, P, 1,
// D], cache_seqlens, softmax_lse, no kcheck.kernel, no lse_empty) checks
// exactly as the contract-named capture of the same run.
func TestFlashMLANamesCheckIdentically(t *testing.T) {
	meta, ts := capture(t, mlaCase(), nil, "out", 700)
	want := check.Run(t.Context(), evidence.Capture{Name: "contract", Metadata: meta, Tensors: ts}, check.Options{})
	if want.Verdict != check.Fail {
		t.Fatalf("planted error not detected: verdict %s", want.Verdict)
	}

	fm := map[string]string{}
	for k, v := range meta {
		if k != "kcheck.kernel" {
			fm[k] = v
		}
	}
	kc := ts["kv_cache"]
	ft := map[string]*tensor.Tensor{
		"q":             ts["q"],
		"k_cache":       {DType: kc.DType, Shape: []int{kc.Shape[0], kc.Shape[1], 1, kc.Shape[2]}, Data: kc.Data},
		"block_table":   ts["block_table"],
		"cache_seqlens": ts["seq_lens"],
		"out":           ts["out"],
		"softmax_lse":   ts["lse"],
	}
	got := check.Run(t.Context(), evidence.Capture{Name: "flashmla", Metadata: fm, Tensors: ft}, fromOpts(t, "flashmla"))
	if g, w := checksJSON(t, got), checksJSON(t, want); g != w {
		t.Errorf("FlashMLA-named capture checks differently:\n got %s\nwant %s", g, w)
	}
	if got.Verdict != want.Verdict || got.Kernel != "mla_decode" {
		t.Errorf("verdict %s kernel %s, want %s mla_decode", got.Verdict, got.Kernel, want.Verdict)
	}
	squeezed := fmt.Sprintf("kv_cache %v read as %v", ft["k_cache"].Shape, kc.Shape)
	wantNotes(t, got.Notes, "the tensor names say mla_decode", "lse_empty = +inf", "k_cache -> kv_cache", squeezed)
}

// FlashInfer's MLA decode: q_nope/q_pe, ckv/kpe caches, page lists, base-2
// lse in [B*s_q, H]. With s_q = 2 the lse layout is a real transposition.
func TestFlashInferMLANamesCheckIdentically(t *testing.T) {
	c := mlaCase()
	c.SQ = 2
	meta, ts := capture(t, c, map[string]string{"lse_base": "2"}, "lse", 3)
	want := check.Run(t.Context(), evidence.Capture{Name: "contract", Metadata: meta, Tensors: ts}, check.Options{})
	if want.Verdict != check.Fail {
		t.Fatalf("planted error not detected: verdict %s", want.Verdict)
	}
	q, kc, bt, sl := ts["q"], ts["kv_cache"], ts["block_table"], ts["seq_lens"]
	B, SQ, H, D := q.Shape[0], q.Shape[1], q.Shape[2], q.Shape[3]
	L := D - 64
	split := func(t4 *tensor.Tensor, lead []int) (a, b *tensor.Tensor) {
		es := t4.DType.Size()
		var da, db []byte
		for _, r := range rows(t4) {
			da = append(da, r[:L*es]...)
			db = append(db, r[L*es:]...)
		}
		return &tensor.Tensor{DType: t4.DType, Shape: append(append([]int(nil), lead...), L), Data: da},
			&tensor.Tensor{DType: t4.DType, Shape: append(append([]int(nil), lead...), D-L), Data: db}
	}
	qn, qp := split(q, []int{B * SQ, H})
	ckv, kpe := split(kc, kc.Shape[:2])
	P := kc.Shape[1]
	var indptr, indices, lens []int64
	indptr = append(indptr, 0)
	for b := 0; b < B; b++ {
		n := int(sl.Int64At(b))
		for j := 0; j < (n+P-1)/P; j++ {
			indices = append(indices, bt.Int64At(b*bt.Shape[1]+j))
		}
		indptr = append(indptr, int64(len(indices)))
		lens = append(lens, int64(n))
	}
	// lse [B, H, SQ] -> FlashInfer [B*SQ, H], element by element.
	lse := ts["lse"]
	fl := tensor.New(tensor.F32, B*SQ, H)
	for b := 0; b < B; b++ {
		for h := 0; h < H; h++ {
			for s := 0; s < SQ; s++ {
				fl.SetFloat64((b*SQ+s)*H+h, lse.Float64At((b*H+h)*SQ+s))
			}
		}
	}
	out := ts["out"]
	fm := map[string]string{"kcheck.format": "1", "sm_scale": meta["softmax_scale"], "causal": "true", "page_size": meta["page_size"]}
	ft := map[string]*tensor.Tensor{
		"q_nope": qn, "q_pe": qp, "ckv_cache": ckv, "kpe_cache": kpe,
		"qo_indptr":  tensor.FromInt64s(tensor.I32, []int{3}, []int64{0, int64(SQ), int64(2 * SQ)}),
		"kv_indptr":  tensor.FromInt64s(tensor.I32, []int{len(indptr)}, indptr),
		"kv_indices": tensor.FromInt64s(tensor.I32, []int{len(indices)}, indices),
		"kv_len_arr": tensor.FromInt64s(tensor.I32, []int{B}, lens),
		"output":     {DType: out.DType, Shape: []int{B * SQ, H, L}, Data: out.Data},
		"lse":        fl,
	}
	got := check.Run(t.Context(), evidence.Capture{Name: "flashinfer", Metadata: fm, Tensors: ft}, fromOpts(t, "flashinfer"))
	if g, w := checksJSON(t, got), checksJSON(t, want); g != w {
		t.Errorf("FlashInfer-named capture checks differently:\n got %s\nwant %s\nnotes %q", g, w, got.Notes)
	}

	// The packed layouts: q [B*s_q, H, D] and kv_cache [NB, P, D].
	packed := map[string]*tensor.Tensor{"q": {DType: q.DType, Shape: []int{B * SQ, H, D}, Data: q.Data}, "kv_cache": kc}
	for _, n := range []string{"qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr", "output", "lse"} {
		packed[n] = ft[n]
	}
	pm := map[string]string{"kcheck.kernel": "mla_decode"}
	for k, v := range fm {
		pm[k] = v
	}
	got = check.Run(t.Context(), evidence.Capture{Name: "flashinfer-packed", Metadata: pm, Tensors: packed}, fromOpts(t, "flashinfer"))
	if g, w := checksJSON(t, got), checksJSON(t, want); g != w {
		t.Errorf("packed FlashInfer capture checks differently:\n got %s\nwant %s\nnotes %q", g, w, got.Notes)
	}
}

// vLLM TRITON_MLA's decode_attention_fwd as the capture hook records it
// (python/kcheck/capture): its own argument names (k_buffer [NB, P, 1, D],
// req_to_token, b_seq_len, o [B, H, L], lse [B, H], sm_scale,
// num_kv_splits) and its split-K scratch attn_logits [B, H, S, L+1], lse
// in column L, built here element by element from the contract's
// partials. It checks exactly as the contract-named capture, planted
// error included; SGLang's table, whose Triton decode reuses the names
// for other layouts, does not read them.
func TestVLLMTritonMLANames(t *testing.T) {
	c := mlaCase()
	c.Splits = 3
	for _, corrupt := range []string{"partial_lse", "out"} {
		meta, ts := capture(t, c, nil, corrupt, 1)
		want := mustFail(t, check.Run(t.Context(), evidence.Capture{Name: "contract", Metadata: meta, Tensors: ts}, check.Options{}))
		q, kc, po, pl := ts["q"], ts["kv_cache"], ts["partial_out"], ts["partial_lse"]
		B, H, D := q.Shape[0], q.Shape[2], q.Shape[3]
		S, L := po.Shape[3], po.Shape[4]
		al := tensor.New(tensor.F32, B, H, S, L+1)
		for b := 0; b < B; b++ {
			for h := 0; h < H; h++ {
				for s := 0; s < S; s++ {
					r := (b*H+h)*S + s
					for l := 0; l < L; l++ {
						al.SetFloat64(r*(L+1)+l, po.Float64At(r*L+l))
					}
					al.SetFloat64(r*(L+1)+L, pl.Float64At(r))
				}
			}
		}
		out, lse := ts["out"], ts["lse"]
		vm := map[string]string{"kcheck.format": "1", "kcheck.kernel": "mla_decode", "sm_scale": meta["softmax_scale"],
			"num_kv_splits": fmt.Sprint(S), "page_size": meta["page_size"], "logit_cap": "0.0", "is_mla": "true"}
		vt := map[string]*tensor.Tensor{
			"q":            {DType: q.DType, Shape: []int{B, H, D}, Data: q.Data},
			"k_buffer":     {DType: kc.DType, Shape: []int{kc.Shape[0], kc.Shape[1], 1, kc.Shape[2]}, Data: kc.Data},
			"req_to_token": ts["block_table"], "b_seq_len": ts["seq_lens"],
			"o":           {DType: out.DType, Shape: []int{B, H, L}, Data: out.Data},
			"lse":         {DType: lse.DType, Shape: []int{B, H}, Data: lse.Data},
			"attn_logits": al,
		}
		copied := map[string]*tensor.Tensor{}
		for k, v := range vt {
			copied[k] = v
		}
		got := check.Run(t.Context(), evidence.Capture{Name: "vllm", Metadata: vm, Tensors: vt}, fromOpts(t, "vllm"))
		if g, w := checksJSON(t, got), checksJSON(t, want); g != w {
			t.Errorf("%s planted: TRITON_MLA-named capture checks differently:\n got %s\nwant %s\nnotes %q", corrupt, g, w, got.Notes)
		}
		wantNotes(t, got.Notes, "sm_scale read as softmax_scale", "num_kv_splits read as num_splits", "k_buffer -> kv_cache",
			"req_to_token -> block_table", "b_seq_len -> seq_lens", "o -> out", "read as partial_out [2 1 2 3 512]")
		sg := check.Run(t.Context(), evidence.Capture{Name: "sglang", Metadata: vm, Tensors: copied}, fromOpts(t, "sglang"))
		if sg.Verdict != check.Error {
			t.Errorf("--from sglang read vLLM's TRITON_MLA names: verdict %s, notes %q", sg.Verdict, sg.Notes)
		}
	}
}

// vLLM concat_and_cache_mla with an fp8 cache named "fp8", the scale named
// scale and the cache saved before and after the call.
func TestVLLMCacheWriteNames(t *testing.T) {
	c := cases.Case{Name: "w", Kernel: "kv_cache_write", Preset: "deepseek-v3", SeqLens: []int{9, 4}, PageSize: 4,
		KVCacheDType: "fp8_e4m3", Seed: 3}
	meta, ts := capture(t, c, nil, "cache_after", 1000)
	want := check.Run(t.Context(), evidence.Capture{Name: "contract", Metadata: meta, Tensors: ts}, check.Options{})
	vm := map[string]string{}
	for k, v := range meta {
		vm[k] = v
	}
	vm["kv_cache_dtype"] = "fp8"
	vt := map[string]*tensor.Tensor{
		"kv_c": ts["kv_c"], "k_pe": ts["k_pe"], "slot_mapping": ts["slot_mapping"], "scale": ts["k_scale"],
		"kv_cache_before": ts["cache_before"], "kv_cache": ts["cache_after"],
	}
	got := check.Run(t.Context(), evidence.Capture{Name: "vllm", Metadata: vm, Tensors: vt}, fromOpts(t, "vllm"))
	if g, w := checksJSON(t, got), checksJSON(t, want); g != w {
		t.Errorf("vLLM-named capture checks differently:\n got %s\nwant %s", g, w)
	}
	if want.Verdict != check.Fail || got.Verdict != check.Fail {
		t.Errorf("verdicts %s/%s, want fail", want.Verdict, got.Verdict)
	}
}

// A vLLM fp8_ds_mla write checks with --from vllm whichever tile-scale
// convention its writer used (audit V5: the writer moved from amax to pow2
// in vLLM PR #49435), with the convention read from the stored scales and
// named in a note; a capture that declares the other convention fails, as
// does a written cache with one code flipped.
func TestVLLMDSMLAWriteConvention(t *testing.T) {
	tests := []struct {
		written  string // the writer's convention
		declared string // the capture's ds_mla_scale ("" = not set)
		corrupt  bool
		want     compare.Verdict
		wantNote string
	}{
		{written: "pow2", want: check.Pass, wantNote: "ds_mla_scale not set: pow2"},
		{written: "amax", want: check.Pass, wantNote: "ds_mla_scale not set: amax"},
		{written: "pow2", declared: "amax", want: check.Fail},
		{written: "amax", declared: "pow2", want: check.Fail},
		{written: "pow2", corrupt: true, want: check.Fail, wantNote: "ds_mla_scale not set: pow2"},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s/declared=%q/corrupt=%v", tc.written, tc.declared, tc.corrupt), func(t *testing.T) {
			c := cases.Case{Name: "w", Kernel: "kv_cache_write", Preset: "deepseek-v3", SeqLens: []int{9, 4}, PageSize: 4,
				KVCacheDType: "fp8_ds_mla", Seed: 5}
			corrupt := ""
			if tc.corrupt {
				corrupt = "cache_after"
			}
			meta, ts := capture(t, c, map[string]string{"ds_mla_scale": tc.written}, corrupt, 3)
			vm := map[string]string{"kv_cache_dtype": "fp8"} // vLLM's CLI spelling (FLASHMLA_SPARSE's alias)
			for k, v := range meta {
				if k != "ds_mla_scale" && k != "kv_cache_dtype" && k != "kcheck.kernel" {
					vm[k] = v
				}
			}
			if tc.declared != "" {
				vm["ds_mla_scale"] = tc.declared
			}
			vt := map[string]*tensor.Tensor{
				"kv_c": ts["kv_c"], "k_pe": ts["k_pe"], "slot_mapping": ts["slot_mapping"],
				"kv_cache_before": ts["cache_before"], "kv_cache": ts["cache_after"],
			}
			got := check.Run(t.Context(), evidence.Capture{Name: "vllm", Metadata: vm, Tensors: vt}, fromOpts(t, "vllm"))
			if got.Error != nil {
				t.Fatalf("error %s (notes %q)", *got.Error, got.Notes)
			}
			if got.Verdict != tc.want {
				t.Errorf("verdict %s, want %s (notes %q)", got.Verdict, tc.want, got.Notes)
			}
			if tc.wantNote != "" && !strings.Contains(strings.Join(got.Notes, "\n"), tc.wantNote) {
				t.Errorf("notes %q lack %q", got.Notes, tc.wantNote)
			}
		})
	}
}

// vLLM scaled_fp4_quant: int32 [M_pad, K_pad/4] scales (as allocated), the
// swizzled layout and the tensor names left implicit.
func TestVLLMScaledFP4QuantNames(t *testing.T) {
	c := cases.Case{Name: "q", Kernel: "nvfp4_quantize", M: 8, K: 64, Seed: 11, Params: map[string]string{"scale_layout": "swizzled_128x4"}}
	meta, ts := capture(t, c, nil, "packed", 5)
	want := mustFail(t, check.Run(t.Context(), evidence.Capture{Name: "contract", Metadata: meta, Tensors: ts}, check.Options{}))
	sc := ts["block_scale"]
	if sc.Len()%4 != 0 {
		t.Fatalf("block_scale %v", sc.Shape)
	}
	vm := map[string]string{"kcheck.format": "1"}
	vt := map[string]*tensor.Tensor{
		"input": ts["x"], "input_global_scale": ts["global_scale"], "output": ts["packed"],
		"output_scale": {DType: tensor.I32, Shape: []int{128, 1}, Data: sc.Data}, // [M_pad, K_pad/4]
	}
	got := check.Run(t.Context(), evidence.Capture{Name: "vllm", Metadata: vm, Tensors: vt}, fromOpts(t, "vllm"))
	if g, w := checksJSON(t, got), checksJSON(t, want); g != w {
		t.Errorf("vLLM-named capture checks differently:\n got %s\nwant %s\nnotes %q", g, w, got.Notes)
	}
}

// vLLM merge_attn_states (two states, lse [H, T], +inf for an empty state)
// read as a two-split combine.
func TestVLLMMergeAttnStates(t *testing.T) {
	c := cases.Case{Name: "m", Kernel: "splitk_combine", Preset: "deepseek-v3", Heads: 2, Batch: 3, Splits: 2, Seed: 16}
	meta, ts := capture(t, c, nil, "out", 9)
	want := mustFail(t, check.Run(t.Context(), evidence.Capture{Name: "contract", Metadata: meta, Tensors: ts}, check.Options{}))
	po, pl := ts["partial_out"], ts["partial_lse"]
	N, L := po.Shape[0], po.Shape[2]
	H := 2
	T := N / H
	outs := [2]*tensor.Tensor{tensor.New(tensor.F32, T, H, L), tensor.New(tensor.F32, T, H, L)}
	lses := [2]*tensor.Tensor{tensor.New(tensor.F32, H, T), tensor.New(tensor.F32, H, T)}
	posInf := 0
	for tok := 0; tok < T; tok++ {
		for h := 0; h < H; h++ {
			row := tok*H + h
			for s := 0; s < 2; s++ {
				for l := 0; l < L; l++ {
					outs[s].SetFloat64((tok*H+h)*L+l, po.Float64At((row*2+s)*L+l))
				}
				v := pl.Float64At(row*2 + s)
				if math.IsInf(v, -1) && s == 0 {
					v = math.Inf(1) // vLLM's spelling of an empty state
					posInf++
				}
				lses[s].SetFloat64(h*T+tok, v)
			}
		}
	}
	if posInf == 0 {
		t.Fatal("the case has no empty prefix state to spell +inf")
	}
	lse := ts["lse"]
	olse := tensor.New(tensor.F32, H, T)
	for tok := 0; tok < T; tok++ {
		for h := 0; h < H; h++ {
			olse.SetFloat64(h*T+tok, lse.Float64At(tok*H+h))
		}
	}
	out := ts["out"]
	vt := map[string]*tensor.Tensor{
		"prefix_output": outs[0], "suffix_output": outs[1], "prefix_lse": lses[0], "suffix_lse": lses[1],
		"output": {DType: out.DType, Shape: []int{T, H, L}, Data: out.Data}, "output_lse": olse,
	}
	got := check.Run(t.Context(), evidence.Capture{Name: "vllm", Metadata: map[string]string{"kcheck.format": "1"}, Tensors: vt}, fromOpts(t, "vllm"))
	if g, w := checksJSON(t, got), checksJSON(t, want); g != w {
		t.Errorf("merge_attn_states capture checks differently:\n got %s\nwant %s\nnotes %q", g, w, got.Notes)
	}
	if !strings.Contains(strings.Join(got.Notes, "\n"), "+inf read as -inf") {
		t.Errorf("notes do not mention the +inf rewrite: %q", got.Notes)
	}
}

// FlashInfer merge_states: v [T, S, H, D], s [T, S, H] in base 2.
func TestFlashInferMergeStates(t *testing.T) {
	c := cases.Case{Name: "m", Kernel: "splitk_combine", Preset: "deepseek-v3", Heads: 2, Batch: 2, Splits: 3, Seed: 17}
	meta, ts := capture(t, c, map[string]string{"lse_base": "2"}, "lse", 1)
	want := mustFail(t, check.Run(t.Context(), evidence.Capture{Name: "contract", Metadata: meta, Tensors: ts}, check.Options{}))
	po, pl := ts["partial_out"], ts["partial_lse"]
	N, S, L := po.Shape[0], po.Shape[1], po.Shape[2]
	H := 2
	T := N / H
	v := tensor.New(tensor.F32, T, S, H, L)
	s := tensor.New(tensor.F32, T, S, H)
	for tok := 0; tok < T; tok++ {
		for j := 0; j < S; j++ {
			for h := 0; h < H; h++ {
				row := tok*H + h
				s.SetFloat64((tok*S+j)*H+h, pl.Float64At(row*S+j))
				for l := 0; l < L; l++ {
					v.SetFloat64(((tok*S+j)*H+h)*L+l, po.Float64At((row*S+j)*L+l))
				}
			}
		}
	}
	out, lse := ts["out"], ts["lse"]
	ft := map[string]*tensor.Tensor{
		"v": v, "s": s,
		"v_merged": {DType: out.DType, Shape: []int{T, H, L}, Data: out.Data},
		"s_merged": {DType: lse.DType, Shape: []int{T, H}, Data: lse.Data},
	}
	got := check.Run(t.Context(), evidence.Capture{Name: "fi", Metadata: map[string]string{"kcheck.format": "1"}, Tensors: ft}, fromOpts(t, "flashinfer"))
	if g, w := checksJSON(t, got), checksJSON(t, want); g != w {
		t.Errorf("merge_states capture checks differently:\n got %s\nwant %s\nnotes %q", g, w, got.Notes)
	}
}

// Adapt at the unit level: defaults never override the capture's keys,
// value spellings are translated, an unsupported spelling is refused with
// its name, and pipeline stages are adapted under their prefix.
func TestAdaptTable(t *testing.T) {
	bf := func(shape ...int) *tensor.Tensor { return tensor.New(tensor.BF16, shape...) }
	tests := []struct {
		name     string
		engine   string
		meta     map[string]string
		tensors  map[string]*tensor.Tensor
		wantMeta map[string]string
		wantT    map[string][]int // tensor -> shape
		wantErr  string
	}{
		{
			name: "file keys win", engine: "flashmla",
			meta:     map[string]string{"kcheck.kernel": "mla_decode", "lse_empty": "-inf"},
			tensors:  map[string]*tensor.Tensor{"k_cache": bf(2, 64, 1, 576)},
			wantMeta: map[string]string{"lse_empty": "-inf", "lse_base": "e", "ds_mla_scale": "pow2"},
			wantT:    map[string][]int{"kv_cache": {2, 64, 576}},
		},
		{
			// auto is the model's dtype in vLLM (torch_utils.py:519-525): the
			// contract's auto, which reads the cache's own (audit V1)
			name: "vllm auto cache dtype", engine: "vllm",
			meta:     map[string]string{"kcheck.kernel": "kv_cache_write", "kv_cache_dtype": "auto"},
			wantMeta: map[string]string{"kv_cache_dtype": "auto", "lse_base": "e"},
		},
		{
			name: "vllm half cache dtype", engine: "vllm",
			meta:     map[string]string{"kcheck.kernel": "kv_cache_gather", "kv_cache_dtype": "half"},
			wantMeta: map[string]string{"kv_cache_dtype": "fp16"},
		},
		{
			name: "flashmla 16-bit cache", engine: "flashmla",
			meta:     map[string]string{"kcheck.kernel": "mla_decode", "is_fp8_kvcache": "False"},
			tensors:  map[string]*tensor.Tensor{"k_cache": tensor.New(tensor.F16, 2, 64, 1, 576)},
			wantMeta: map[string]string{"kv_cache_dtype": "fp16"},
			wantT:    map[string][]int{"kv_cache": {2, 64, 576}},
		},
		{
			name: "vllm e5m2 refused", engine: "vllm",
			meta:    map[string]string{"kcheck.kernel": "kv_cache_write", "kv_cache_dtype": "fp8_e5m2"},
			wantErr: `kv_cache_dtype = "fp8_e5m2"`,
		},
		{
			name: "sglang pool of fp8 bytes without a dtype: e4m3 or e5m2 is not in the bytes", engine: "sglang",
			meta:    map[string]string{"kcheck.kernel": "kv_cache_write"},
			tensors: map[string]*tensor.Tensor{"kv_buffer": tensor.New(tensor.U8, 41, 1, 576), "cache_k_nope": tensor.New(tensor.BF16, 3, 1, 512)},
			wantErr: "set kv_cache_dtype (fp8_e4m3",
		},
		{
			name: "sglang DSA pool: 656-byte rows are fp8_ds_mla", engine: "sglang",
			meta:     map[string]string{"kcheck.kernel": "kv_cache_write"},
			tensors:  map[string]*tensor.Tensor{"kv_buffer": tensor.New(tensor.U8, 41, 1, 656), "cache_k_nope": tensor.New(tensor.BF16, 3, 1, 512), "cache_k_rope": tensor.New(tensor.BF16, 3, 1, 64)},
			wantMeta: map[string]string{"kv_cache_dtype": "fp8_ds_mla", "page_size": "1"},
			wantT:    map[string][]int{"cache_after": {41, 1, 656}, "kv_c": {3, 512}, "k_pe": {3, 64}},
		},
		{
			name: "vllm merge with an fp8 output_scale refused", engine: "vllm",
			meta: map[string]string{"kcheck.kernel": "splitk_combine"},
			tensors: map[string]*tensor.Tensor{
				"prefix_output": tensor.New(tensor.BF16, 2, 1, 8), "suffix_output": tensor.New(tensor.BF16, 2, 1, 8),
				"prefix_lse": tensor.New(tensor.F32, 1, 2), "suffix_lse": tensor.New(tensor.F32, 1, 2),
				"output": tensor.New(tensor.F8E4M3, 2, 1, 8), "output_scale": tensor.New(tensor.F32),
			},
			wantErr: "output_scale quantizes the merged output to fp8",
		},
		{
			name: "vllm scaled_fp4_quant with padded_n refused", engine: "vllm",
			meta:    map[string]string{"kcheck.kernel": "nvfp4_quantize", "padded_n": "128"},
			tensors: map[string]*tensor.Tensor{"input": bf(16, 64), "input_global_scale": tensor.New(tensor.F32), "output": tensor.New(tensor.U8, 16, 64), "output_scale": tensor.New(tensor.F8E4M3, 128, 8)},
			wantErr: "K padded past the input",
		},
		{
			name: "vllm scaled_fp4_quant with padded_n = n pads nothing", engine: "vllm",
			meta:     map[string]string{"kcheck.kernel": "nvfp4_quantize", "padded_n": "64"},
			tensors:  map[string]*tensor.Tensor{"input": bf(16, 64), "input_global_scale": tensor.New(tensor.F32), "output": tensor.New(tensor.U8, 16, 32), "output_scale": tensor.New(tensor.F8E4M3, 128, 4)},
			wantMeta: map[string]string{"scale_layout": "swizzled_128x4"},
		},
		{
			name: "flashmla sparse on an sm90 GPU reads the tile scales as bf16", engine: "flashmla",
			meta:     map[string]string{"kcheck.kernel": "mla_decode_sparse", "is_fp8_kvcache": "true", "kcheck.capture.device_capability": "9.0"},
			tensors:  map[string]*tensor.Tensor{"k_cache": tensor.New(tensor.U8, 3, 64, 1, 656), "indices": tensor.New(tensor.I32, 1, 1, 8)},
			wantMeta: map[string]string{"ds_mla_scale_read": "bf16"},
		},
		{
			name: "vllm FLASHMLA_SPARSE on an sm100 GPU reads them as E8M0 toward zero", engine: "vllm",
			meta:     map[string]string{"kcheck.kernel": "mla_decode_sparse", "kv_cache_dtype": "fp8_ds_mla", "kcheck.capture.device_capability": "10.0"},
			tensors:  map[string]*tensor.Tensor{"kv_c_and_k_pe_cache": tensor.New(tensor.U8, 3, 64, 656), "indices": tensor.New(tensor.I32, 1, 1, 8)},
			wantMeta: map[string]string{"ds_mla_scale_read": "e8m0_rz"},
		},
		{
			name: "a declared scale reading wins over the device", engine: "flashmla",
			meta:     map[string]string{"kcheck.kernel": "mla_decode_sparse", "is_fp8_kvcache": "true", "kcheck.capture.device_capability": "10.0", "ds_mla_scale_read": "f32"},
			tensors:  map[string]*tensor.Tensor{"k_cache": tensor.New(tensor.U8, 3, 64, 1, 656), "indices": tensor.New(tensor.I32, 1, 1, 8)},
			wantMeta: map[string]string{"ds_mla_scale_read": "f32"},
		},
		{
			name: "vllm nvfp4_ds_mla refused with what it is", engine: "vllm",
			meta:    map[string]string{"kcheck.kernel": "mla_decode_sparse", "kv_cache_dtype": "nvfp4_ds_mla"},
			wantErr: `352-byte NVFP4 DeepSeek MLA entry`,
		},
		{
			name: "sglang fp32 cache refused", engine: "sglang",
			meta:    map[string]string{"kcheck.kernel": "kv_cache_gather", "kv_cache_dtype": "float32"},
			wantErr: `kv_cache_dtype = "float32": sglang's "float32" has no kcheck contract: an fp32 cache`,
		},
		{
			name: "flashmla fp8 flag, 656-byte entries", engine: "flashmla",
			meta:     map[string]string{"kcheck.kernel": "mla_decode_sparse", "is_fp8_kvcache": "True"},
			tensors:  map[string]*tensor.Tensor{"k_cache": tensor.New(tensor.F8E4M3, 3, 64, 1, 656), "indices": tensor.New(tensor.I32, 1, 1, 8)},
			wantMeta: map[string]string{"kv_cache_dtype": "fp8_ds_mla"},
			wantT:    map[string][]int{"kv_cache": {3, 64, 656}},
		},
		{
			name: "flashmla fp8 flag over a dense width: no such mode upstream", engine: "flashmla",
			meta:    map[string]string{"kcheck.kernel": "mla_decode", "is_fp8_kvcache": "true"},
			tensors: map[string]*tensor.Tensor{"k_cache": tensor.New(tensor.U8, 3, 64, 1, 576)},
			wantErr: "its dense decode has no FP8 mode",
		},
		{
			name: "flashmla fp8 flag false, bf16 cache", engine: "flashmla",
			meta:     map[string]string{"kcheck.kernel": "mla_decode", "is_fp8_kvcache": "false"},
			tensors:  map[string]*tensor.Tensor{"k_cache": bf(3, 64, 1, 576)},
			wantMeta: map[string]string{"kv_cache_dtype": "bf16"},
		},
		{
			name: "flashmla fp8 flag false, fp16 cache", engine: "flashmla",
			meta:     map[string]string{"kcheck.kernel": "mla_decode", "is_fp8_kvcache": "false"},
			tensors:  map[string]*tensor.Tensor{"k_cache": tensor.New(tensor.F16, 3, 64, 1, 576)},
			wantMeta: map[string]string{"kv_cache_dtype": "fp16"},
		},
		{
			name: "flashmla sparse masks only -1", engine: "flashmla",
			meta:     map[string]string{"kcheck.kernel": "mla_decode_sparse"},
			wantMeta: map[string]string{"invalid_index": "minus_one"},
		},
		{
			name: "vllm fp8 over 656-byte entries is fp8_ds_mla", engine: "vllm",
			meta:     map[string]string{"kcheck.kernel": "mla_decode_sparse", "kv_cache_dtype": "fp8"},
			tensors:  map[string]*tensor.Tensor{"kv_c_and_k_pe_cache": tensor.New(tensor.U8, 3, 64, 656), "indices": tensor.New(tensor.I32, 1, 1, 8)},
			wantMeta: map[string]string{"kv_cache_dtype": "fp8_ds_mla", "invalid_index": "minus_one"},
		},
		{
			// FlashMLA picks the layout by d_qk (sparse_decode.h:288-298)
			name: "flashmla fp8 flag, 584-byte entries: DeepSeek-V4", engine: "flashmla",
			meta:     map[string]string{"kcheck.kernel": "mla_decode_sparse", "is_fp8_kvcache": "True"},
			tensors:  map[string]*tensor.Tensor{"k_cache": tensor.New(tensor.U8, 3, 64, 1, 584), "indices": tensor.New(tensor.I32, 1, 1, 8)},
			wantMeta: map[string]string{"kv_cache_dtype": "fp8_ds_mla_model1", "invalid_index": "minus_one"},
			wantT:    map[string][]int{"kv_cache": {3, 64, 584}},
		},
		{
			// vLLM spells the V4 cache fp8_ds_mla (deepseek_v4/attention.py:94-123)
			name: "vllm fp8_ds_mla over 584-byte entries is fp8_ds_mla_model1", engine: "vllm",
			meta:     map[string]string{"kcheck.kernel": "mla_decode_sparse", "kv_cache_dtype": "fp8_ds_mla"},
			tensors:  map[string]*tensor.Tensor{"kv_c_and_k_pe_cache": tensor.New(tensor.U8, 3, 64, 584), "indices": tensor.New(tensor.I32, 1, 1, 8)},
			wantMeta: map[string]string{"kv_cache_dtype": "fp8_ds_mla_model1"},
		},
		{
			name: "vllm fp8 over 584-byte entries is fp8_ds_mla_model1", engine: "vllm",
			meta:     map[string]string{"kcheck.kernel": "mla_decode_sparse", "kv_cache_dtype": "fp8"},
			tensors:  map[string]*tensor.Tensor{"kv_c_and_k_pe_cache": tensor.New(tensor.U8, 3, 64, 584), "indices": tensor.New(tensor.I32, 1, 1, 8)},
			wantMeta: map[string]string{"kv_cache_dtype": "fp8_ds_mla_model1"},
		},
		{
			// the FlashMLA vLLM vendors (third_party/flashmla/flash_mla_interface.py:121)
			name: "flashmla fp8 flag, 528-byte entries: DeepSeek-V4.1", engine: "flashmla",
			meta:     map[string]string{"kcheck.kernel": "mla_decode_sparse", "is_fp8_kvcache": "True"},
			tensors:  map[string]*tensor.Tensor{"k_cache": tensor.New(tensor.U8, 3, 64, 1, 528), "indices": tensor.New(tensor.I32, 1, 1, 8)},
			wantMeta: map[string]string{"kv_cache_dtype": "fp8_ds_mla_v41"},
		},
		{
			name: "vllm fp8_ds_mla over 528-byte entries is fp8_ds_mla_v41", engine: "vllm",
			meta:     map[string]string{"kcheck.kernel": "mla_decode_sparse", "kv_cache_dtype": "fp8_ds_mla"},
			tensors:  map[string]*tensor.Tensor{"kv_c_and_k_pe_cache": tensor.New(tensor.U8, 3, 64, 528), "indices": tensor.New(tensor.I32, 1, 1, 8)},
			wantMeta: map[string]string{"kv_cache_dtype": "fp8_ds_mla_v41"},
		},
		{
			name: "vllm fp8_ds_mla over 656-byte entries stays fp8_ds_mla", engine: "vllm",
			meta:     map[string]string{"kcheck.kernel": "mla_decode_sparse", "kv_cache_dtype": "fp8_ds_mla"},
			tensors:  map[string]*tensor.Tensor{"kv_c_and_k_pe_cache": tensor.New(tensor.U8, 3, 64, 656), "indices": tensor.New(tensor.I32, 1, 1, 8)},
			wantMeta: map[string]string{"kv_cache_dtype": "fp8_ds_mla"},
		},
		{
			name: "vllm V4 write declares its amax floor", engine: "vllm",
			meta:     map[string]string{"kcheck.kernel": "kv_cache_write", "kv_cache_dtype": "fp8_ds_mla"},
			tensors:  map[string]*tensor.Tensor{"kv_cache": tensor.New(tensor.U8, 2, 4, 584), "slot_mapping": tensor.New(tensor.I64, 1), "kv_c": bf(1, 448), "k_pe": bf(1, 64)},
			wantMeta: map[string]string{"kv_cache_dtype": "fp8_ds_mla_model1", "ds_mla_scale": "pow2_amax_floor"},
		},
		{
			name: "vllm fp8 over 576-byte entries is fp8_e4m3", engine: "vllm",
			meta:     map[string]string{"kcheck.kernel": "kv_cache_gather", "kv_cache_dtype": "fp8"},
			tensors:  map[string]*tensor.Tensor{"src_cache": tensor.New(tensor.U8, 3, 64, 576)},
			wantMeta: map[string]string{"kv_cache_dtype": "fp8_e4m3"},
		},
		{
			name: "vllm fp4 scales whose shape fits linear and 128x4: refused, not guessed", engine: "vllm",
			meta:    map[string]string{"kcheck.kernel": "nvfp4_quantize"},
			tensors: map[string]*tensor.Tensor{"input": bf(128, 64), "output_scale": tensor.New(tensor.F8E4M3, 128, 4)},
			wantErr: "fits scale_layout linear and swizzled_128x4",
		},
		{
			name: "vllm fp4 linear by the call's flag", engine: "vllm",
			meta:     map[string]string{"kcheck.kernel": "nvfp4_quantize", "is_sf_swizzled_layout": "False"},
			tensors:  map[string]*tensor.Tensor{"input": bf(128, 64), "output_scale": tensor.New(tensor.F8E4M3, 128, 4)},
			wantMeta: map[string]string{"scale_layout": "linear"},
		},
		{
			name: "vllm fp4 int32 scales are the swizzled allocation", engine: "vllm",
			meta:     map[string]string{"kcheck.kernel": "nvfp4_quantize"},
			tensors:  map[string]*tensor.Tensor{"input": bf(128, 64), "output_scale": tensor.New(tensor.I32, 128, 1)},
			wantMeta: map[string]string{"scale_layout": "swizzled_128x4"},
			wantT:    map[string][]int{"block_scale": {128, 4}},
		},
		{
			name: "vllm fp4 unaligned linear by shape", engine: "vllm",
			meta:     map[string]string{"kcheck.kernel": "nvfp4_quantize"},
			tensors:  map[string]*tensor.Tensor{"input": bf(130, 80), "output_scale": tensor.New(tensor.F8E4M3, 130, 5)},
			wantMeta: map[string]string{"scale_layout": "linear"},
		},
		{
			name: "vllm fp4 unaligned 128x4 by shape", engine: "vllm",
			meta:     map[string]string{"kcheck.kernel": "nvfp4_quantize"},
			tensors:  map[string]*tensor.Tensor{"input": bf(130, 80), "output_scale": tensor.New(tensor.F8E4M3, 256, 8)},
			wantMeta: map[string]string{"scale_layout": "swizzled_128x4"},
		},
		{
			name: "vllm fp4 trtllm backend at m <= 32 is 8x4", engine: "vllm",
			meta:     map[string]string{"kcheck.kernel": "nvfp4_quantize", "backend": "trtllm"},
			tensors:  map[string]*tensor.Tensor{"input": bf(16, 64), "output_scale": tensor.New(tensor.F8E4M3, 16, 4)},
			wantMeta: map[string]string{"scale_layout": "swizzled_8x4"},
		},
		{
			name: "flashinfer fp4 8x4 flag", engine: "flashinfer",
			meta:     map[string]string{"kcheck.kernel": "nvfp4_quantize", "is_sf_8x4_layout": "true"},
			tensors:  map[string]*tensor.Tensor{"input": bf(16, 64), "sf": tensor.New(tensor.U8, 16, 4)},
			wantMeta: map[string]string{"scale_layout": "swizzled_8x4"},
		},
		{
			name: "flashinfer mxfp4 refused", engine: "flashinfer",
			meta:    map[string]string{"kcheck.kernel": "nvfp4_quantize", "sf_vec_size": "32"},
			wantErr: "parameter sf_vec_size = \"32\": MXFP4",
		},
		{
			name: "flashinfer inverted global scale refused", engine: "flashinfer",
			meta:    map[string]string{"kcheck.kernel": "nvfp4_quantize", "is_global_scale_inversed": "True"},
			wantErr: "is_global_scale_inversed",
		},
		{
			name: "flashinfer default modes pass", engine: "flashinfer",
			meta:     map[string]string{"kcheck.kernel": "nvfp4_quantize", "sf_vec_size": "16", "sf_use_ue8m0": "False", "is_sf_swizzled_layout": "false"},
			tensors:  map[string]*tensor.Tensor{"input": bf(16, 64), "sf": tensor.New(tensor.U8, 16, 4)},
			wantMeta: map[string]string{"scale_layout": "linear"},
		},
		{
			name: "decode without s_q axis", engine: "flashmla",
			meta:    map[string]string{"kcheck.kernel": "mla_decode"},
			tensors: map[string]*tensor.Tensor{"q": bf(2, 16, 576), "out": bf(2, 16, 512), "softmax_lse": tensor.New(tensor.F32, 2, 16)},
			wantT:   map[string][]int{"q": {2, 1, 16, 576}, "out": {2, 1, 16, 512}, "lse": {2, 16, 1}},
		},
		{
			name: "pipeline stage prefix", engine: "flashinfer",
			meta:     map[string]string{"kcheck.kernel": "pipeline", "kcheck.stages": "attn,combine", "kcheck.attn.kernel": "mla_decode", "kcheck.combine.kernel": "splitk_combine", "attn.sm_scale": "0.1"},
			tensors:  map[string]*tensor.Tensor{"combine.v_merged": tensor.New(tensor.F32, 4, 2, 8)},
			wantMeta: map[string]string{"attn.softmax_scale": "0.1", "attn.lse_base": "2", "combine.lse_base": "2"},
			wantT:    map[string][]int{"combine.out": {8, 8}},
		},
		{
			name: "ambiguous kernel", engine: "vllm",
			meta:    map[string]string{},
			tensors: map[string]*tensor.Tensor{"block_scale_a": tensor.New(tensor.U8, 1), "block_scale_b": tensor.New(tensor.U8, 1), "input": bf(1), "input_global_scale": bf(1), "output_scale": bf(1)},
			wantErr: "fit nvfp4_gemm and nvfp4_quantize",
		},
		{
			name: "vllm alpha", engine: "vllm",
			meta:     map[string]string{"kcheck.kernel": "nvfp4_gemm", "a_global_kind": "quant"},
			tensors:  map[string]*tensor.Tensor{"alpha": tensor.FromFloat64s(tensor.F32, []int{1}, []float64{0.25})},
			wantMeta: map[string]string{"a_global_kind": "dequant", "b_global_kind": "dequant", "scale_layout": "swizzled_128x4"},
			wantT:    map[string][]int{"a_global": {1}, "b_global": {1}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, err := Lookup(tc.engine)
			if err != nil {
				t.Fatal(err)
			}
			ts := tc.tensors
			if ts == nil {
				ts = map[string]*tensor.Tensor{}
			}
			_, err = e.Adapt(tc.meta, ts)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tc.wantMeta {
				if tc.meta[k] != v {
					t.Errorf("meta %s = %q, want %q", k, tc.meta[k], v)
				}
			}
			for n, shape := range tc.wantT {
				got := ts[n]
				if got == nil || !sameInts(got.Shape, shape) {
					t.Errorf("tensor %s = %v, want shape %v (tensors: %v)", n, got, shape, keys(ts))
				}
			}
		})
	}
}

func keys(m map[string]*tensor.Tensor) []string { return sortedKeys(m) }

// The byte-moving helpers against hand-written results.
func TestLayoutHelpers(t *testing.T) {
	i32 := func(shape []int, v ...int64) *tensor.Tensor { return tensor.FromInt64s(tensor.I32, shape, v) }
	// [[0 1 2] [3 4 5]] transposed is [[0 3] [1 4] [2 5]].
	p, err := permute("x", i32([]int{2, 3}, 0, 1, 2, 3, 4, 5), 1, 0)
	if err != nil || !sameInts(p.Shape, []int{3, 2}) || !bytes.Equal(p.Data, i32([]int{3, 2}, 0, 3, 1, 4, 2, 5).Data) {
		t.Errorf("permute: %v %v", p, err)
	}
	// x[a][b][c] = 100a+10b+c with shape [2,2,2], perm (0,2,1): y[a][c][b] = x[a][b][c].
	var v []int64
	for a := 0; a < 2; a++ {
		for b := 0; b < 2; b++ {
			for c := 0; c < 2; c++ {
				v = append(v, int64(100*a+10*b+c))
			}
		}
	}
	p, _ = permute("x", i32([]int{2, 2, 2}, v...), 0, 2, 1)
	if want := i32([]int{2, 2, 2}, 0, 10, 1, 11, 100, 110, 101, 111); !bytes.Equal(p.Data, want.Data) {
		t.Errorf("permute 3d: got %v", p.Data)
	}
	c, _ := concatLast("a", i32([]int{2, 1}, 1, 2), "b", i32([]int{2, 2}, 10, 11, 20, 21))
	if want := i32([]int{2, 3}, 1, 10, 11, 2, 20, 21); !bytes.Equal(c.Data, want.Data) || !sameInts(c.Shape, want.Shape) {
		t.Errorf("concatLast: %v", c)
	}
	s, _ := stack(1, []string{"a", "b"}, []*tensor.Tensor{i32([]int{2, 2}, 1, 2, 3, 4), i32([]int{2, 2}, 5, 6, 7, 8)})
	if want := i32([]int{2, 2, 2}, 1, 2, 5, 6, 3, 4, 7, 8); !bytes.Equal(s.Data, want.Data) || !sameInts(s.Shape, want.Shape) {
		t.Errorf("stack: %v", s)
	}
	bt, err := csrToBlockTable([]int64{0, 2, 2, 5}, []int64{7, 3, 9, 1, 4})
	if want := i32([]int{3, 3}, 7, 3, 0, 0, 0, 0, 9, 1, 4); err != nil || !bytes.Equal(bt.Data, want.Data) {
		t.Errorf("csrToBlockTable: %v %v", bt, err)
	}
	if _, err := csrToBlockTable([]int64{0, 3}, []int64{1}); err == nil || !strings.Contains(err.Error(), "kv_indptr[0..1] = 0..3") {
		t.Errorf("bad indptr: %v", err)
	}
	l, _ := lensFromCumulative("cu", []int64{0, 5, 5, 12})
	if want := i32([]int{3}, 5, 0, 7); !bytes.Equal(l.Data, want.Data) {
		t.Errorf("lensFromCumulative: %v", l)
	}
	w, _ := bytesOf("s", tensor.FromInt64s(tensor.I32, []int{1, 1}, []int64{0x04030201}), tensor.U8)
	if !bytes.Equal(w.Data, []byte{1, 2, 3, 4}) || !sameInts(w.Shape, []int{1, 4}) {
		t.Errorf("bytesOf: %v", w)
	}
}

func TestLookup(t *testing.T) {
	if got := strings.Join(Names(), ","); got != "flashinfer,flashmla,sglang,vllm" {
		t.Errorf("engines %s", got)
	}
	if _, err := Lookup("trtllm"); err == nil || !strings.Contains(err.Error(), "flashinfer, flashmla, sglang, vllm") {
		t.Errorf("unknown engine error: %v", err)
	}
	if e, err := Lookup("FlashMLA"); err != nil || e.Conventions()["lse_empty"] != "+inf" {
		t.Errorf("FlashMLA conventions: %v %v", e, err)
	}
}

// A duplicate, empty or mixed-case name is refused, and the table is left
// as it was: before, register overwrote silently, so a second "vllm"
// would have replaced the first by init order.
func TestRegisterRefuses(t *testing.T) {
	first := &Engine{Name: "vllm"}
	for _, tc := range []struct {
		name string
		e    *Engine
		want string // "" = accepted
	}{
		{"new name", &Engine{Name: "sglang"}, ""},
		{"the same name again", &Engine{Name: "vllm"}, `engine "vllm" registered twice`},
		{"no name", &Engine{}, "an engine without a name"},
		{"mixed case", &Engine{Name: "FlashMLA"}, `engine "FlashMLA": names are lower case`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := map[string]*Engine{first.Name: first}
			err := registerIn(reg, tc.e)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want == "" && reg[tc.e.Name] != tc.e:
				t.Fatalf("accepted but not in the table")
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
			if reg[first.Name] != first {
				t.Errorf("the first vllm was replaced")
			}
		})
	}
	defer func() {
		if p := recover(); p == nil || !strings.Contains(fmt.Sprint(p), `engine "flashmla" registered twice`) {
			t.Errorf("register of a second flashmla: panic %v", p)
		}
	}()
	register(&Engine{Name: "flashmla"})
}

// TRITON_MLA leaves a split with no token unwritten (its attn_logits are
// torch.empty): those partials are not judged, however they read, while
// the written splits, out and lse are judged as the contract-named capture
// of the same run. Request 1 has one token, so with S = 3 splits two are
// empty.
func TestVLLMTritonMLAUnwrittenSplits(t *testing.T) {
	c := mlaCase()
	c.SeqLens = []int{21, 1}
	c.Splits = 3
	for _, corrupt := range []string{"", "partial_out"} {
		meta, ts := capture(t, c, nil, corrupt, 3) // element 3: request 0, head 0, split 0
		want := check.Run(t.Context(), evidence.Capture{Name: "contract", Metadata: meta, Tensors: ts}, check.Options{})
		if (want.Verdict == check.Pass) != (corrupt == "") {
			t.Fatalf("contract capture, %q planted: verdict %s", corrupt, want.Verdict)
		}
		q, kc, po, pl := ts["q"], ts["kv_cache"], ts["partial_out"], ts["partial_lse"]
		B, H, D := q.Shape[0], q.Shape[2], q.Shape[3]
		S, L := po.Shape[3], po.Shape[4]
		al := tensor.New(tensor.F32, B, H, S, L+1)
		unwritten := 0
		for b := 0; b < B; b++ {
			for h := 0; h < H; h++ {
				for s := 0; s < S; s++ {
					r := (b*H+h)*S + s
					empty := math.IsInf(pl.Float64At(r), -1)
					for l := 0; l <= L; l++ {
						switch {
						case empty:
							al.SetFloat64(r*(L+1)+l, math.NaN()) // what torch.empty may hold
						case l < L:
							al.SetFloat64(r*(L+1)+l, po.Float64At(r*L+l))
						default:
							al.SetFloat64(r*(L+1)+L, pl.Float64At(r))
						}
					}
					if empty && h == 0 {
						unwritten++
					}
				}
			}
		}
		if unwritten != 2 {
			t.Fatalf("%d empty splits, want 2 (request 1's splits 1 and 2)", unwritten)
		}
		out, lse := ts["out"], ts["lse"]
		vm := map[string]string{"kcheck.format": "1", "kcheck.kernel": "mla_decode", "sm_scale": meta["softmax_scale"],
			"num_kv_splits": fmt.Sprint(S), "page_size": meta["page_size"]}
		vt := map[string]*tensor.Tensor{
			"q":            {DType: q.DType, Shape: []int{B, H, D}, Data: q.Data},
			"k_buffer":     {DType: kc.DType, Shape: []int{kc.Shape[0], kc.Shape[1], 1, kc.Shape[2]}, Data: kc.Data},
			"req_to_token": ts["block_table"], "b_seq_len": ts["seq_lens"],
			"o":           {DType: out.DType, Shape: []int{B, H, L}, Data: out.Data},
			"lse":         {DType: lse.DType, Shape: []int{B, H}, Data: lse.Data},
			"attn_logits": al,
		}
		before := append([]byte(nil), al.Data...)
		got := check.Run(t.Context(), evidence.Capture{Name: "vllm", Metadata: vm, Tensors: vt}, fromOpts(t, "vllm"))
		if g, w := checksJSON(t, got), checksJSON(t, want); g != w {
			t.Errorf("%q planted: TRITON_MLA capture with unwritten splits checks differently:\n got %s\nwant %s\nnotes %q", corrupt, g, w, got.Notes)
		}
		if !strings.Contains(strings.Join(got.Notes, "\n"), "2 of 6 splits empty, not judged") {
			t.Errorf("notes do not say the empty splits are not judged: %q", got.Notes)
		}
		if !bytes.Equal(al.Data, before) {
			t.Error("the capture's attn_logits were changed")
		}
	}
}

// SGLang's Triton decode: a token pool with page lists, separate
// attn_logits / attn_lse, a split count per request and splits rounded up
// to 32 tokens. Request 0 (45 tokens, 2 splits of 32 of S = 3) splits at
// 32 and leaves split 2 empty; request 1
// (3 tokens, 1 split) leaves splits 1-2 empty; request 2 (70 tokens, 3
// splits) splits at 32 and 64. The contract-named capture of the same
// run, with the same split_bounds, checks the same; the unwritten splits
// hold NaN and are not judged; a token list shifted by one fails.
func TestSGLangTritonDecode(t *testing.T) {
	const S = 3
	c := cases.Case{Name: "sgl", Kernel: "mla_decode", Preset: "deepseek-v3", Heads: 2, SeqLens: []int{45, 3, 70},
		PageSize: 1, KVCacheDType: "bf16", Seed: 11}
	lens, per := []int{45, 3, 70}, []int64{2, 1, 3}
	bounds := []int64{0, 32, 45, 45, 0, 3, 3, 3, 0, 32, 64, 70}
	in, err := c.Inputs()
	if err != nil {
		t.Fatal(err)
	}
	in.Tensors["split_bounds"] = tensor.FromInt64s(tensor.I32, []int{3, S + 1}, bounds)
	meta, err := c.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	k, _ := kernel.Lookup("mla_decode")
	prec, _ := kernel.PrecisionFrom(in.Params)
	outs, err := kernel.Produce(context.Background(), k, in, prec, nil)
	if err != nil {
		t.Fatal(err)
	}
	ts := map[string]*tensor.Tensor{}
	for n, v := range in.Tensors {
		ts[n] = v
	}
	for n, v := range outs {
		ts[n] = v
	}
	q, kc, bt, po, pl := ts["q"], ts["kv_cache"], ts["block_table"], ts["partial_out"], ts["partial_lse"]
	if po == nil || po.Shape[3] != S {
		t.Fatalf("the reference gave no partials of %d splits: %v", S, ts["partial_out"])
	}
	B, H, D, L := 3, q.Shape[2], q.Shape[3], po.Shape[4]
	var indices, indptr []int64
	indptr = append(indptr, 0)
	for b, n := range lens {
		for tok := 0; tok < n; tok++ {
			indices = append(indices, bt.Int64At(b*bt.Shape[1]+tok)) // pages of one token: the page is the slot
		}
		indptr = append(indptr, int64(len(indices)))
	}
	attnLogits, attnLSE := po.Clone(), pl.Clone()
	for r := 0; r < attnLSE.Len(); r++ {
		if math.IsInf(attnLSE.Float64At(r), -1) {
			attnLSE.SetFloat64(r, math.NaN())
			for l := 0; l < L; l++ {
				attnLogits.SetFloat64(r*L+l, math.NaN())
			}
		}
	}
	sglang := func(idx []int64) evidence.Capture {
		return evidence.Capture{Name: "sglang", Metadata: map[string]string{"kcheck.format": "1", "kcheck.kernel": "mla_decode",
			"sm_scale": meta["softmax_scale"], "max_kv_splits": fmt.Sprint(S)}, Tensors: map[string]*tensor.Tensor{
			"q":             {DType: q.DType, Shape: []int{B, H, D}, Data: q.Data},
			"k_buffer":      {DType: kc.DType, Shape: []int{kc.Shape[0], 1, kc.Shape[2]}, Data: kc.Data},
			"kv_indptr":     tensor.FromInt64s(tensor.I32, []int{B + 1}, indptr),
			"kv_indices":    tensor.FromInt64s(tensor.I64, []int{len(idx)}, idx),
			"num_kv_splits": tensor.FromInt64s(tensor.I32, []int{B}, per),
			"o":             {DType: ts["out"].DType, Shape: []int{B, H, L}, Data: ts["out"].Data},
			"attn_logits":   {DType: attnLogits.DType, Shape: []int{B, H, S, L}, Data: attnLogits.Data},
			"attn_lse":      {DType: attnLSE.DType, Shape: []int{B, H, S}, Data: attnLSE.Data},
		}}
	}
	delete(ts, "lse") // SGLang's decode returns no final lse
	want := check.Run(t.Context(), evidence.Capture{Name: "contract", Metadata: meta, Tensors: ts}, check.Options{})
	if want.Verdict != check.Pass {
		t.Fatalf("contract capture: %s %q", want.Verdict, want.Notes)
	}
	got := check.Run(t.Context(), sglang(indices), fromOpts(t, "sglang"))
	if g, w := checksJSON(t, got), checksJSON(t, want); g != w {
		t.Errorf("SGLang-named capture checks differently:\n got %s\nwant %s\nnotes %q", g, w, got.Notes)
	}
	wantNotes(t, got.Notes, "3 of 9 splits empty, not judged", "split_bounds [3 4] from num_kv_splits [2 1 3]", "one token a page")
	shifted := append([]int64(nil), indices...)
	copy(shifted[1:lens[0]], indices[2:lens[0]+1]) // request 0's tokens 1.. read one slot late
	if r := check.Run(t.Context(), sglang(shifted), fromOpts(t, "sglang")); r.Verdict != check.Fail {
		t.Errorf("a kv_indices shift passed: %s", r.Verdict)
	}
}

// vLLM's TRITON_MLA returns o and lse in the query's dtype (vllm 0.33.0
// vllm/v1/attention/backends/mla/triton_mla.py:262-265, `lse =
// torch.zeros(B, q_num_heads, dtype=q.dtype, ...)`), bf16 or fp16
// (supported_dtypes, :100), over a cache of the model's dtype ("auto",
// :101-106). The audit's tested case (V15): a bf16 lse was "ERROR tensor
// lse has dtype BF16". A capture in TRITON_MLA's names and dtypes, what a
// correct kernel of that precision stores, passes judged at the lse's own
// dtype, and a planted fault (a base-2 lse, or the softmax scale
// FlashMLA's default 576^-0.5) fails.
func TestVLLMTritonMLALSEInQueryDType(t *testing.T) {
	for _, c := range []struct {
		cache string       // the case's kv_cache_dtype
		q     tensor.DType // the model's dtype: q, o and lse
	}{{"bf16", tensor.BF16}, {"fp16", tensor.F16}} {
		cs := mlaCase()
		cs.KVCacheDType = c.cache
		in, err := cs.Inputs()
		if err != nil {
			t.Fatal(err)
		}
		meta, err := cs.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		if q := in.Tensors["q"]; q.DType != c.q {
			t.Fatalf("%s case: q is %s, want %s", c.cache, q.DType, c.q)
		}
		// the worker's declared precision for a 16-bit cache
		// (python/kcheck/worker/vllm.py _triton_mla_precision): P in the
		// cache's dtype, softmax_block 32
		pd := map[tensor.DType]string{tensor.BF16: "bf16", tensor.F16: "f16"}[c.q]
		in.Params["p_dtype"], in.Params["softmax_block"] = pd, "32"
		prec, err := kernel.PrecisionFrom(in.Params)
		if err != nil {
			t.Fatal(err)
		}
		k, _ := kernel.Lookup("mla_decode")
		outs, err := kernel.Produce(context.Background(), k, in, prec, kernel.OutDTypes{"out": c.q, "lse": c.q})
		if err != nil {
			t.Fatal(err)
		}
		q, kc, out, lse := in.Tensors["q"], in.Tensors["kv_cache"], outs["out"], outs["lse"]
		B, H, D, L := q.Shape[0], q.Shape[2], q.Shape[3], out.Shape[3]
		if lse.DType != c.q {
			t.Fatalf("lse produced as %s, want %s", lse.DType, c.q)
		}
		vm := map[string]string{"kcheck.format": "1", "kcheck.kernel": "mla_decode", "sm_scale": meta["softmax_scale"],
			"page_size": meta["page_size"], "kv_cache_dtype": "auto", "p_dtype": pd, "softmax_block": "32"}
		named := func(o, l *tensor.Tensor) map[string]*tensor.Tensor {
			return map[string]*tensor.Tensor{
				"q":            {DType: q.DType, Shape: []int{B, H, D}, Data: q.Data},
				"k_buffer":     {DType: kc.DType, Shape: []int{kc.Shape[0], kc.Shape[1], 1, kc.Shape[2]}, Data: kc.Data},
				"req_to_token": in.Tensors["block_table"], "b_seq_len": in.Tensors["seq_lens"],
				"o":   {DType: o.DType, Shape: []int{B, H, L}, Data: o.Data},
				"lse": {DType: l.DType, Shape: []int{B, H}, Data: l.Data},
			}
		}
		got := check.Run(t.Context(), evidence.Capture{Name: "vllm", Metadata: vm, Tensors: named(out, lse)}, fromOpts(t, "vllm"))
		if got.Verdict != check.Pass {
			t.Errorf("%s: a correct TRITON_MLA capture (lse %s): verdict %s, error %v, checks %s", c.cache, lse.DType, got.Verdict, got.Error, checksJSON(t, got))
			continue
		}
		for _, ch := range got.Checks {
			if ch.DType != c.q {
				t.Errorf("%s: %s judged as %s, want its own %s", c.cache, ch.Tensor, ch.DType, c.q)
			}
		}
		bad := lse.Clone() // a base-2 lse where vLLM's is natural: log2(e)·lse, stored in the lse's dtype
		for i := 0; i < bad.Len(); i++ {
			bad.SetFloat64(i, bad.Float64At(i)*math.Log2E)
		}
		if r := check.Run(t.Context(), evidence.Capture{Name: "vllm", Metadata: vm, Tensors: named(out, bad)}, fromOpts(t, "vllm")); r.Verdict != check.Fail {
			t.Errorf("%s: a base-2 lse: verdict %s, want fail", c.cache, r.Verdict)
		}
		wrong := map[string]string{}
		for k, v := range vm {
			wrong[k] = v
		}
		wrong["sm_scale"] = fmt.Sprint(math.Pow(576, -0.5))
		if r := check.Run(t.Context(), evidence.Capture{Name: "vllm", Metadata: wrong, Tensors: named(out, lse)}, fromOpts(t, "vllm")); r.Verdict != check.Fail {
			t.Errorf("%s: the capture judged with FlashMLA's default scale: verdict %s, want fail", c.cache, r.Verdict)
		}
	}
}
