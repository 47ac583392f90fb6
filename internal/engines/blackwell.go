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
	note, err := dropUnitAxis(v, "kv_cache", 4, 1, call+"'s cache is [NB, 1, P, D] (one KV head in dimension 1)")
	if err != nil {
		return nil, err
	}
	notes = append(notes, note...)
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

// flashInferFP8MLA reads FlashInfer's FP8 MLA (BatchMLAPagedAttentionWrapper
// planned with kv_data_type = float8_e4m3fn: the SM90 fa2 and fa3 backends
// with a bf16 query, flashinfer-python 0.7.2.post1
// flashinfer/mla/_batch_mla/_backends/_fa_common.py:151-172) as
// mla_decode over an fp8_e4m3 cache with FlashInfer's scales (audit I5):
//   - run(..., ckv_scale, ckv_scale_arr, kpe_scale) (_wrapper.py:852-876)
//     takes exactly one of ckv_scale (a float) and ckv_scale_arr (F32
//     [NB, P, head_dim_ckv/128], contiguous), and kpe_scale (a float)
//     always (_fa_common.py:692-711, 745-755); the binding casts the
//     floats to fp32 (data/csrc/batch_mla_run.cu:119-120,
//     batch_mla_sm90_run.cu:119-120). ckv_scale is read as k_scale,
//     kpe_scale as k_scale_rope (it scales kpe_cache alone: mla.cuh:361-378,
//     and FlashInfer's own reference, trace/templates/attention.py:2325-2339),
//     ckv_scale_arr as k_scale_tiles;
//   - the kernels hold a per-tensor scale in the query's dtype, bf16, and
//     multiply by __hmul2 (repack_fp8_kv_to_bf16, data/include/flashinfer/
//     attention/mla.cuh:312-377 for fa2, mla_hopper.cuh:353-436 for fa3;
//     packed2_t scale{static_cast<DTypeQ>(ckv_scale), ...}): k_scale_dtype =
//     bf16. A tile scale multiplies in fp32 and the product is rounded to
//     bf16 (mla.cuh:341-346), the contract's reading of k_scale_tiles;
//   - both caches are fp8 (_fa_common.py:655-664): kv_cache_dtype =
//     fp8_e4m3, latent_dim the width of ckv_cache (512, :163-168);
//   - fa2's FP8 kernel takes its running max per 32-token KV tile
//     (EFF_CTA_TILE_KV, mla.cuh:1262; update_mdo_states_ per tile,
//     :1111-1122): softmax_block = 32 when the capture names backend fa2.
//
// Refused, naming them: the scales with any other backend (cutlass,
// trtllm-gen and xqa refuse them: cutlass_backend.py:364-366,
// trtllm_gen_backend.py:488-490, xqa_backend.py:379), a query that is not
// bf16 (_fa_common.py:158-162), both ckv scales or neither, no kpe_scale,
// and the scales without an fp8 cache (_fa_common.py:712-721). A
// trtllm_batch_decode_with_kv_cache_mla capture (query and a 4-D kv_cache)
// is left to trtllmMLA.
var flashInferFP8MLA = Fix{Doc: "FP8 MLA: ckv_scale -> k_scale, kpe_scale -> k_scale_rope, ckv_scale_arr -> k_scale_tiles; kv_cache_dtype fp8_e4m3, k_scale_dtype bf16", Apply: func(v *View) ([]string, error) {
	ckv, kpe, kvc := v.T("ckv_cache"), v.T("kpe_cache"), v.T("kv_cache")
	if v.T("q_nope") == nil && ckv == nil && (kvc == nil || len(kvc.Shape) != 3) {
		return nil, nil // not the wrapper's call
	}
	if b1, _ := v.Param("bmm1_scale"); ckv == nil && (!off(b1) || v.T("bmm1_scale") != nil || v.Declared("kv_lora_rank")) {
		return nil, nil // trtllm_batch_decode_with_kv_cache_mla's (a 3-D kv_cache too): trtllmMLA reads or refuses it
	}
	isFP8 := func(t *tensor.Tensor) bool { return t != nil && (t.DType == tensor.F8E4M3 || t.DType == tensor.U8) }
	fp8 := isFP8(ckv) || isFP8(kpe) || (ckv == nil && isFP8(kvc))
	var named []string
	for _, n := range []string{"ckv_scale", "ckv_scale_arr", "kpe_scale"} {
		if s, ok := v.Param(n); (ok && !off(s)) || v.T(n) != nil {
			named = append(named, n)
		}
	}
	if !fp8 && len(named) == 0 {
		return nil, nil
	}
	const src = "flashinfer-python 0.7.2.post1 flashinfer/mla/_batch_mla/_backends/_fa_common.py"
	if !fp8 {
		return nil, fmt.Errorf("%s given but the cache is not fp8: FlashInfer takes them only with kv_data_type float8_e4m3fn (%s:712-721)", strings.Join(named, ", "), src)
	}
	if b, ok := v.Param("backend"); ok && !off(b) && b != "auto" && b != "fa2" && b != "fa3" {
		return nil, fmt.Errorf("parameter backend = %q with an fp8 cache: FlashInfer's FP8 MLA scales (ckv_scale, kpe_scale, ckv_scale_arr) are the fa2 and fa3 backends' (%s:151-172; cutlass, trtllm-gen and xqa refuse them), and this backend's fp8 path is not read", b, src)
	}
	q := v.T("q_nope")
	if q == nil {
		q = v.T("q")
	}
	if q != nil && q.DType != tensor.BF16 {
		return nil, fmt.Errorf("tensor %s%s is %s: FlashInfer's FP8 MLA takes a bf16 query only (%s:158-162; its kernels dequantize the cache to the query's dtype as bf16 pairs)", v.Prefix, map[bool]string{true: "q_nope", false: "q"}[v.T("q_nope") != nil], q.DType, src)
	}
	ckvS, hasCKV, err := scalarParam(v, "ckv_scale")
	if err != nil {
		return nil, err
	}
	arr := v.T("ckv_scale_arr")
	if hasCKV == (arr != nil) {
		what := "neither"
		if hasCKV {
			what = "both"
		}
		return nil, fmt.Errorf("FlashInfer's FP8 MLA takes exactly one of ckv_scale and tensor ckv_scale_arr (%s:693-697); the capture has %s", src, what)
	}
	kpeS, hasKPE, err := scalarParam(v, "kpe_scale")
	if err != nil {
		return nil, err
	}
	if !hasKPE {
		return nil, fmt.Errorf("kpe_scale is missing: FlashInfer's FP8 MLA requires it (%s:698-699); record run()'s kpe_scale in the metadata", src)
	}
	var notes []string
	if hasCKV {
		// the binding's static_cast<float>(double) (data/csrc/batch_mla_run.cu:119)
		v.Set("k_scale", tensor.FromFloat64s(tensor.F32, []int{}, []float64{float64(float32(ckvS))}))
		notes = append(notes, fmt.Sprintf("ckv_scale %v -> k_scale (fp32)", ckvS))
	} else {
		v.Set("k_scale_tiles", arr)
		v.Del("ckv_scale_arr")
		notes = append(notes, fmt.Sprintf("ckv_scale_arr %v -> k_scale_tiles", arr.Shape))
	}
	if kpe != nil && len(kpe.Shape) == 3 && kpe.Shape[2] == 0 {
		notes = append(notes, "kpe_scale not read: kpe_cache has no columns (head_dim_kpe = 0)")
	} else {
		v.Set("k_scale_rope", tensor.FromFloat64s(tensor.F32, []int{}, []float64{float64(float32(kpeS))}))
		notes = append(notes, fmt.Sprintf("kpe_scale %v -> k_scale_rope (fp32)", kpeS))
	}
	set := func(key, val string) {
		if !v.Declared(key) {
			v.SetParam(key, val)
			notes = append(notes, key+" = "+val)
		}
	}
	set("kv_cache_dtype", "fp8_e4m3")
	set("k_scale_dtype", "bf16")
	if ckv != nil && len(ckv.Shape) == 3 {
		set("latent_dim", strconv.Itoa(ckv.Shape[2]))
	}
	if b, _ := v.Param("backend"); b == "fa2" {
		set("softmax_block", "32")
	}
	return []string{"FlashInfer's FP8 MLA (the scale held in bf16, __hmul2; tile scales in fp32): " + strings.Join(notes, ", ")}, nil
}}
