package engines

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// The Blackwell MLA decode calls (audit V16, V17): FlashInfer's
// trtllm_batch_decode_with_kv_cache_mla, which vLLM's FLASHINFER_MLA and
// SGLang's trtllm_mla backends call, and vLLM's CUTLASS_MLA custom op
// sm100_cutlass_mla_decode. Both take the joined 576-wide latent query and
// cache kcheck's mla_decode takes; what differs is names, the cache's
// extra axis, the scale arguments, the lse layout and its base, which the
// call's own arguments decide.

// off reads an optional argument the capture records as Python writes it
// (None, False, 0, an empty string) as not in use.
func off(s string) bool {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "none", "false", "0", "0.0":
		return true
	}
	return false
}

// scalarParam reads a float argument recorded as a parameter or as a
// one-element F32 tensor (trtllm's bmm1_scale and bmm2_scale may be
// either: flashinfer-python 0.7.2.post1 flashinfer/mla/_core.py:4115-4120).
func scalarParam(v *View, name string) (float64, bool, error) {
	if s, ok := v.Param(name); ok && !strings.EqualFold(strings.TrimSpace(s), "none") && strings.TrimSpace(s) != "" {
		f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil {
			return 0, true, fmt.Errorf("parameter %s = %q is not a number", name, s)
		}
		return f, true, nil
	}
	t := v.T(name)
	if t == nil {
		return 0, false, nil
	}
	if err := checked(v.Prefix+name, t); err != nil {
		return 0, true, err
	}
	if t.DType != tensor.F32 || t.Len() != 1 {
		return 0, true, fmt.Errorf("tensor %s%s is %s %v; the call takes it as one float32", v.Prefix, name, t.DType, t.Shape)
	}
	f := t.Float64At(0)
	v.Del(name)
	return f, true, nil
}

// trtllmMLA reads flashinfer.mla.trtllm_batch_decode_with_kv_cache_mla(
// query, kv_cache, workspace_buffer, qk_nope_head_dim, kv_lora_rank,
// qk_rope_head_dim, block_tables, seq_lens, max_seq_len, ..., out,
// bmm1_scale, bmm2_scale, ..., backend, ..., lse, return_lse, ...,
// return_lse_base) (flashinfer-python 0.7.2.post1 flashinfer/mla/_core.py
// :4859-4893, documented at :3847-4100), as vLLM's FLASHINFER_MLA
// (vllm 0.33.0 vllm/v1/attention/backends/mla/flashinfer_mla.py:432-446)
// and SGLang's trtllm_mla (sglang 0.5.23
// sglang/srt/layers/attention/trtllm_mla_backend.py:1041-1055) call it:
//   - query [B, q_len, H, 576] is the contract's q; out [B, q_len, H, 512]
//     is allocated BF16 (_core.py:4660-4664);
//   - kv_cache [NB, 1, P, 576] (vLLM passes its cache unsqueeze(1),
//     flashinfer_mla.py:434; a 3D cache is read as such, _core.py:778-780)
//     is read as [NB, P, 576];
//   - bmm1_scale is q_scale·k_scale·sm_scale and bmm2_scale is
//     v_scale·o_scale (_core.py:4068-4071; vLLM folds q_scale·k_scale in only
//     for an fp8 cache, flashinfer_mla.py:371-379): over a bf16 or fp16
//     cache bmm1_scale is the softmax scale and bmm2_scale is 1. An fp8
//     cache comes with an fp8 query (vLLM's MLA layer quantizes q for
//     backends that take it, vllm/model_executor/layers/attention/
//     mla_attention.py:1107-1112), which mla_decode does not take: refused;
//     so is a bmm2_scale other than 1, an output scale mla_decode has no
//     parameter for;
//   - lse [B*q_len, H] (the default allocation) or [B, q_len, H]
//     (_core.py:3973-3980, 4684-4707) is read as [B, H, q_len]. Its base is
//     return_lse_base when the call passes it; otherwise each backend's own:
//     base 2 for trtllm-gen, natural log for cute-dsl (:3990-3998; the
//     runners, :3532-3535 and :143-147). With backend "auto" (the default,
//     and vLLM's unless the head count needs cute-dsl,
//     flashinfer_mla.py:59-69) the autotuner picks either runner
//     (AutoTuner.choose_one, :4735-4850), so a capture with an lse must say which: lse_base, or
//     the call's return_lse_base or backend;
//   - with q_len > 1 the decode is causal: the call has no causal flag, and
//     vLLM flattens a non-causal block into rows of one query
//     (flashinfer_mla.py:345-354), so causal = true unless the capture says;
//   - kv_lora_rank is the latent width L (latent_dim).
//
// Refused with the argument named, as mla_decode has no model of them:
// sparse_mla_top_k > 0 (top-k indices in block_tables: mla_decode_sparse's
// job, not read from this call yet), sinks, skip-softmax, enable_dcp (a
// rank-local state), a TRT-LLM [B, 2, pages] page table
// (uses_shared_paged_kv_idx = false), use_fp16_softmax, and the compact
// query of cum_seq_lens_q.
var trtllmMLA = Fix{Doc: "trtllm_batch_decode_with_kv_cache_mla: kv_cache [NB, 1, P, D], bmm1_scale, lse [B*q_len, H] and its base", Apply: func(v *View) ([]string, error) {
	kc := v.T("kv_cache")
	b1, _ := v.Param("bmm1_scale") // BatchMLAPagedAttentionWrapper.run takes a bmm1_scale too, None unless its backend wants one
	_, kl := v.Param("kv_lora_rank")
	if off(b1) && !kl && v.T("bmm1_scale") == nil && (kc == nil || len(kc.Shape) != 4 || kc.Shape[1] != 1) {
		return nil, nil
	}
	const call = "trtllm_batch_decode_with_kv_cache_mla"
	for _, o := range []struct{ key, why string }{
		{"sparse_mla_top_k", "sparse MLA (top-k indices in block_tables) is mla_decode_sparse's, and this call's sparse form is not read yet"},
		{"skip_softmax_threshold_scale_factor", "skip-softmax sparsity drops scores by a threshold mla_decode does not model"},
		{"enable_dcp", "a decode-context-parallel rank's state (rank-local tokens, global causal bound) is not an mla_decode"},
		{"use_fp16_softmax", "the fp16 softmax cubin's precision has no kcheck model"},
		{"max_q_len", "the compact variable-length query (cum_seq_lens_q) is not read: capture a call with query [B, q_len, H, D]"},
	} {
		if s, ok := v.Param(o.key); ok && !off(s) {
			return nil, fmt.Errorf("parameter %s = %q of %s: %s", o.key, s, call, o.why)
		}
	}
	if s, ok := v.Param("uses_shared_paged_kv_idx"); ok && off(s) {
		return nil, fmt.Errorf("parameter uses_shared_paged_kv_idx = %q of %s: the TRT-LLM page table [B, 2, pages] (separate K and V pages) is not read; vLLM's and SGLang's calls share one", s, call)
	}
	for _, n := range []string{"sinks", "cum_seq_lens_q", "causal_seqlens_kv_global", "sparse_mla_top_k_lens"} {
		if v.T(n) != nil {
			return nil, fmt.Errorf("tensor %s%s of %s: not modelled by mla_decode (attention sinks, the compact query, DCP and sparse lengths are refused rather than ignored)", v.Prefix, n, call)
		}
	}
	q := v.T("q")
	if q == nil || len(q.Shape) != 4 {
		return nil, fmt.Errorf("%s: tensor query is missing or not [B, q_len, H, D]", call)
	}
	if q.DType == tensor.F8E4M3 || (kc != nil && (kc.DType == tensor.F8E4M3 || kc.DType == tensor.U8)) {
		return nil, fmt.Errorf("%s over an fp8 cache: the query is fp8 too (vLLM quantizes it with q_scale, and bmm1_scale folds in q_scale·k_scale, vllm 0.33.0 flashinfer_mla.py:371-379), and mla_decode takes a BF16, F16 or F32 query: not supported", call)
	}
	var notes []string
	b, sq, h := q.Shape[0], q.Shape[1], q.Shape[2]
	if kc != nil && len(kc.Shape) == 4 {
		if kc.Shape[1] != 1 {
			return nil, fmt.Errorf("tensor %skv_cache has shape %v; %s's cache is [NB, 1, P, D] (one KV head in dimension 1)", v.Prefix, kc.Shape, call)
		}
		r, err := reshape(v.Prefix+"kv_cache", kc, kc.Shape[0], kc.Shape[2], kc.Shape[3])
		if err != nil {
			return nil, err
		}
		v.Set("kv_cache", r)
		notes = append(notes, fmt.Sprintf("kv_cache %v read as %v (one KV head)", kc.Shape, r.Shape))
	}
	s1, ok, err := scalarParam(v, "bmm1_scale")
	if err != nil {
		return nil, err
	}
	switch {
	case v.Declared("softmax_scale"):
		if ok {
			notes = append(notes, "bmm1_scale ignored: softmax_scale is set")
		}
	case ok:
		v.SetParam("softmax_scale", strconv.FormatFloat(s1, 'g', -1, 64))
		notes = append(notes, fmt.Sprintf("softmax_scale = bmm1_scale = %g (an unquantized cache: q_scale = k_scale = 1)", s1))
	default:
		return nil, fmt.Errorf("%s: parameter bmm1_scale is missing: it is the call's softmax scale (the function's default 1.0 is almost never the model's)", call)
	}
	if s2, ok, err := scalarParam(v, "bmm2_scale"); err != nil {
		return nil, err
	} else if ok && s2 != 1 {
		return nil, fmt.Errorf("parameter bmm2_scale = %g of %s: an output scale (v_scale·o_scale) mla_decode has no parameter for; over a bf16 or fp16 cache it is 1", s2, call)
	}
	if s, ok := v.Param("kv_lora_rank"); ok && !v.Declared("latent_dim") {
		l, err := strconv.Atoi(s)
		if err != nil || l < 1 || l >= q.Shape[3] {
			return nil, fmt.Errorf("parameter kv_lora_rank = %q: want the latent width, 1 to %d (query's D)", s, q.Shape[3]-1)
		}
		if r, ok := v.Param("qk_rope_head_dim"); ok && r != strconv.Itoa(q.Shape[3]-l) {
			return nil, fmt.Errorf("parameters kv_lora_rank = %d and qk_rope_head_dim = %s do not add up to query's D = %d", l, r, q.Shape[3])
		}
		v.SetParam("latent_dim", s)
	}
	if sq > 1 && !v.Declared("causal") {
		v.SetParam("causal", "true")
		notes = append(notes, fmt.Sprintf("causal = true (q_len = %d: the call has no causal flag and decodes a request's queries causally)", sq))
	}
	lse := v.T("lse")
	if lse == nil {
		return notes, nil
	}
	var r *tensor.Tensor
	switch {
	case len(lse.Shape) == 2 && lse.Shape[0] == b*sq && lse.Shape[1] == h:
		r, err = reshape(v.Prefix+"lse", lse, b, sq, h)
	case len(lse.Shape) == 3 && sameInts(lse.Shape, []int{b, sq, h}):
		r = lse
	default:
		return nil, fmt.Errorf("tensor %slse has shape %v; %s writes [B*q_len, H] = [%d, %d] or [B, q_len, H]", v.Prefix, lse.Shape, call, b*sq, h)
	}
	if err == nil {
		r, err = permute(v.Prefix+"lse", r, 0, 2, 1)
	}
	if err != nil {
		return nil, err
	}
	v.Set("lse", r)
	notes = append(notes, fmt.Sprintf("lse %v read as [B, H, q_len] %v", lse.Shape, r.Shape))
	base, why := "", ""
	backend, _ := v.Param("backend")
	switch rb, _ := v.Param("return_lse_base"); {
	case rb == "basee":
		base, why = "e", "return_lse_base = basee"
	case rb == "base2":
		base, why = "2", "return_lse_base = base2"
	case !off(rb):
		return nil, fmt.Errorf("parameter return_lse_base = %q: the call takes basee, base2 or None", rb)
	case backend == "cute-dsl":
		base, why = "e", "backend cute-dsl's natural-log lse"
	case backend == "trtllm-gen":
		base, why = "2", "backend trtllm-gen's base-2 lse"
	}
	declared, _ := v.Param("lse_base")
	switch {
	case v.Declared("lse_base") && base != "" && declared != base:
		return nil, fmt.Errorf("parameter lse_base = %s, but the call's %s says %s", declared, why, base)
	case v.Declared("lse_base"):
		notes = append(notes, fmt.Sprintf("lse_base = %s, as the capture says", declared))
	case base == "":
		return nil, fmt.Errorf("%s with backend %q and no return_lse_base: the lse is base 2 from the trtllm-gen runner and natural-log from cute-dsl, and the autotuner picks one (flashinfer-python 0.7.2.post1 flashinfer/mla/_core.py:3990-3998): record the call's backend or return_lse_base, or set lse_base", call, backend)
	default:
		v.SetParam("lse_base", base)
		notes = append(notes, fmt.Sprintf("lse_base = %s (%s)", base, why))
	}
	return notes, nil
}}

// cutlassMLA reads vLLM's CUTLASS_MLA custom op
// sm100_cutlass_mla_decode(out, lse, q_nope, q_pe, kv_c_and_k_pe_cache,
// seq_lens, page_table, workspace, scale, num_kv_splits) (vllm 0.33.0
// vllm/_custom_ops.py:3434-3458; the call in
// vllm/v1/attention/backends/mla/cutlass_mla.py:166-247):
//   - q = q_nope [B, H, 512] | q_pe [B, H, 64] (cutlass_mla.py:185-194),
//     page_table [B, pages] is the block table (:200-204, and the kernel
//     reads it as one, csrc/attention/mla/sm100_cutlass_mla_kernel.cu
//     @0f5257e2 args_from_options), kv_c_and_k_pe_cache [NB, P, 576] and
//     scale the softmax scale (:238);
//   - out [B, 128, 512] and lse [B, 128] F32 are allocated for 128 heads
//     whatever H (MAX_HEADS, cutlass_mla.py:215-227) because the kernel's
//     head tile is 128 (TileShape 128 x 128 x (512, 64),
//     sm100_cutlass_mla_kernel.cu); vLLM keeps the first H (:241-245), so
//     heads past q_nope's are not data and are not read. An empty lse
//     (torch.Tensor(), no lse asked for) is dropped;
//   - the lse is natural-log: fast_log(row_sum) + softmax_scale·row_max
//     (csrc/attention/mla/cutlass_sm100_mla/kernel/
//     sm100_fmha_mla_tma_warpspecialized.hpp@236e0fe9, epilogue), and the
//     split-K reduction merges with expf/logf
//     (kernel/sm100_fmha_mla_reduction.hpp@e5fd201a): vLLM's lse_base = e;
//   - its softmax takes the running max per 128-token K tile and converts
//     P to the input dtype before the PV product (the "quantize" step of
//     softmax() in sm100_fmha_mla_tma_warpspecialized.hpp@236e0fe9):
//     softmax_block = 128 and p_dtype = q's dtype, unless the capture says;
//   - num_kv_splits is the kernel's own split count (-1: chosen by it); its
//     partials live in the workspace, so it is not mla_decode's num_splits.
//
// An fp8 cache comes with an fp8 q_nope (one dtype for q and cache,
// cutlass_mla.py:206-209), which mla_decode does not take: refused.
var cutlassMLA = Fix{Doc: "sm100_cutlass_mla_decode: q_nope | q_pe, page_table, out [B, 128, L] and lse [B, 128] read for q's heads", Apply: func(v *View) ([]string, error) {
	qn, qp := v.T("q_nope"), v.T("q_pe")
	if qn == nil && qp == nil {
		return nil, nil
	}
	const call = "sm100_cutlass_mla_decode"
	if qn == nil || qp == nil {
		return nil, fmt.Errorf("%s: tensors q_nope and q_pe come together (the query's latent and rope parts); one is missing", call)
	}
	if qn.DType == tensor.F8E4M3 || qn.DType == tensor.U8 {
		return nil, fmt.Errorf("%s with an fp8 q_nope: the fp8 cache's query is fp8 too (cutlass_mla.py:206-209), and mla_decode takes a BF16, F16 or F32 query: not supported", call)
	}
	if len(qn.Shape) != 3 {
		return nil, fmt.Errorf("tensor %sq_nope has shape %v; %s's is [B, H, 512]", v.Prefix, qn.Shape, call)
	}
	q, err := concatLast(v.Prefix+"q_nope", qn, v.Prefix+"q_pe", qp)
	if err != nil {
		return nil, err
	}
	v.Set("q", q)
	v.Del("q_nope")
	v.Del("q_pe")
	b, h := q.Shape[0], q.Shape[1]
	notes := []string{fmt.Sprintf("q = q_nope %v | q_pe %v", qn.Shape, qp.Shape)}
	heads := func(name string, t *tensor.Tensor, inner int) error {
		if len(t.Shape) < 2 || t.Shape[0] != b || t.Shape[1] < h || t.Len() != b*t.Shape[1]*inner {
			return fmt.Errorf("tensor %s%s has shape %v; %s writes it [B = %d, 128 heads (at least q's H = %d), ...]", v.Prefix, name, t.Shape, call, b, h)
		}
		if t.Shape[1] == h {
			return nil
		}
		if err := checked(v.Prefix+name, t); err != nil {
			return err
		}
		es := t.DType.Size()
		shape := append([]int{b, h}, t.Shape[2:]...)
		r := tensor.New(t.DType, shape...)
		for i := 0; i < b; i++ {
			copy(r.Data[i*h*inner*es:(i+1)*h*inner*es], t.Data[i*t.Shape[1]*inner*es:])
		}
		v.Set(name, r)
		notes = append(notes, fmt.Sprintf("%s %v read for q's %d heads as %v (the kernel's 128-head tile; vLLM keeps the first H)", name, t.Shape, h, r.Shape))
		return nil
	}
	if o := v.T("out"); o != nil {
		if len(o.Shape) != 3 {
			return nil, fmt.Errorf("tensor %sout has shape %v; %s writes [B, 128, 512]", v.Prefix, o.Shape, call)
		}
		if err := heads("out", o, o.Shape[2]); err != nil {
			return nil, err
		}
	}
	if l := v.T("lse"); l != nil {
		if l.Len() == 0 {
			v.Del("lse")
			notes = append(notes, "lse is empty (no lse asked for): dropped")
		} else if err := heads("lse", l, 1); err != nil {
			return nil, err
		}
	}
	if _, ok := v.Param("num_kv_splits"); ok {
		delete(v.Meta, v.Prefix+"num_splits")
		notes = append(notes, "num_kv_splits is the kernel's own split count (its partials stay in the workspace): not mla_decode's num_splits")
	}
	var filled []string
	if !v.Declared("softmax_block") {
		v.SetParam("softmax_block", "128")
		filled = append(filled, "softmax_block = 128")
	}
	if !v.Declared("p_dtype") {
		p := "bf16"
		if q.DType == tensor.F16 {
			p = "f16"
		} else if q.DType != tensor.BF16 {
			p = "f32"
		}
		v.SetParam("p_dtype", p)
		filled = append(filled, "p_dtype = "+p)
	}
	if len(filled) > 0 {
		notes = append(notes, fmt.Sprintf("%s (the kernel's 128-token K tile, P in q's dtype %s)", strings.Join(filled, ", "), q.DType))
	}
	return notes, nil
}}

// withCutlassMLA adds CUTLASS_MLA's names to vLLM's mla_decode (a copy,
// as withTritonMLA: SGLang's table starts from vLLM's and its cutlass
// backend is not read).
func withCutlassMLA(k Kernel) Kernel {
	out := Kernel{Tensors: map[string]string{}, Params: map[string]string{}, Defaults: k.Defaults,
		Fixes: append([]Fix{cutlassMLA}, k.Fixes...), Identify: k.Identify}
	for a, b := range k.Tensors {
		out.Tensors[a] = b
	}
	for a, b := range k.Params {
		out.Params[a] = b
	}
	out.Tensors["page_table"] = "block_table"
	return out
}

// flashInferCutlassMLA declares the precision of FlashInfer's MLA wrapper
// with backend = "cutlass" (BatchMLAPagedAttentionWrapper.run(..., kv_len,
// page_table), flashinfer-python 0.7.2.post1
// flashinfer/mla/_batch_mla/_wrapper.py:852-877), whose kv_len and
// page_table the table reads as seq_lens and block_table. Its kernel is
// CUTLASS's SM100 MLA (flashinfer/data/include/flashinfer/attention/
// cutlass_mla.cuh:41-63, Sm100FmhaMlaKernelTmaWarpspecialized with a 128 x
// 128 x (512, 64) tile): the running max per 128-token K tile and P
// converted to the input dtype before the PV product (blackwell/kernel/
// sm100_fmha_mla_tma_warpspecialized.hpp:1580-1597), so softmax_block =
// 128 and p_dtype = q's dtype unless the capture says. It writes no lse
// (return_lse is refused, _batch_mla/_backends/cutlass_backend.py:354-355;
// the kernel gets a null lse, cutlass_mla.cuh:117-118) and takes a fixed
// scale 1/sqrt(128 + 64) (cutlass_mla.cuh:87-90; plan checks sm_scale
// against it, cutlass_backend.py:185-190). An FP8 output with o_scale
// (cutlass_backend.py:414-430) is refused: mla_decode's out is BF16, F16 or
// F32 without a scale.
var flashInferCutlassMLA = Fix{Doc: "backend cutlass: softmax_block = 128, P in q's dtype, no lse; o_scale refused", Apply: func(v *View) ([]string, error) {
	if b, _ := v.Param("backend"); b != "cutlass" {
		return nil, nil
	}
	if s, ok := v.Param("o_scale"); ok && !off(s) {
		return nil, fmt.Errorf("parameter o_scale = %q of FlashInfer's cutlass MLA: an FP8 output scaled per tensor, which mla_decode does not model", s)
	}
	q := v.T("q")
	if q == nil {
		return nil, nil
	}
	p := map[tensor.DType]string{tensor.BF16: "bf16", tensor.F16: "f16"}[q.DType]
	var set []string
	for _, d := range []struct{ key, val string }{{"softmax_block", "128"}, {"p_dtype", p}} {
		if d.val != "" && !v.Declared(d.key) {
			v.SetParam(d.key, d.val)
			set = append(set, d.key+" = "+d.val)
		}
	}
	if len(set) == 0 {
		return nil, nil
	}
	return []string{"backend cutlass (CUTLASS's SM100 MLA: a running max per 128-token tile, P in q's dtype): " + strings.Join(set, ", ")}, nil
}}

// flashInferFP8MLA refuses FlashInfer's FP8 MLA (BatchMLAPagedAttentionWrapper
// planned with kv_data_type = float8_e4m3fn, SM90 fa2/fa3 with a bf16
// query: flashinfer-python 0.7.2.post1
// flashinfer/mla/_batch_mla/_backends/_fa_common.py:151-172). Its cache is
// dequantized with two per-tensor scales, ckv_scale for the latent part and
// kpe_scale for the rope part, or with ckv_scale_arr [NB, P, 4], a scale per
// 128 latent channels of every token (_fa_common.py:693-701, 745-755).
// The kernels dequantize in the query's dtype (repack_fp8_kv_to_bf16,
// flashinfer/data/include/flashinfer/attention/mla_hopper.cuh:353-436 for
// fa3, mla.cuh:312-377 for fa2): with per-tensor scales each code becomes
// bf16 and is multiplied by the scale rounded to bf16 (__hmul2 on bf16
// pairs), with ckv_scale_arr by bf16(float(code) * scale). mla_decode's
// fp8_e4m3 cache has one k_scale for both parts, read as the fp32 product,
// and no per-channel scale tensor, so reading either form would check
// against other scales and another rounding: refused, naming them (audit
// I5). Modelling it needs the two scales, the bf16 rounding of a
// per-tensor scale and a [NB, P, L/128] scale input in mla_decode.
var flashInferFP8MLA = Fix{Doc: "FP8 MLA (ckv_scale, kpe_scale, ckv_scale_arr) refused", Apply: func(v *View) ([]string, error) {
	const why = "FlashInfer's FP8 MLA scales the latent and rope parts separately (ckv_scale, kpe_scale) or per 128 latent channels (ckv_scale_arr [NB, P, 4]); mla_decode's fp8_e4m3 cache has one k_scale: not supported"
	for _, n := range []string{"ckv_scale", "kpe_scale"} {
		if s, ok := v.Param(n); ok && !off(s) {
			return nil, fmt.Errorf("parameter %s = %q: %s", n, s, why)
		}
	}
	for _, n := range []string{"ckv_scale_arr", "ckv_scale", "kpe_scale"} {
		if v.T(n) != nil {
			return nil, fmt.Errorf("tensor %s%s: %s", v.Prefix, n, why)
		}
	}
	for _, n := range []string{"ckv_cache", "kpe_cache"} {
		if c := v.T(n); c != nil && (c.DType == tensor.F8E4M3 || c.DType == tensor.U8) {
			return nil, fmt.Errorf("tensor %s%s is %s (kv_data_type float8_e4m3fn): %s", v.Prefix, n, c.DType, why)
		}
	}
	return nil, nil
}}
