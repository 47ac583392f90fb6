package engines

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/kcheck-dev/kcheck/reference/kvcache"
	"github.com/kcheck-dev/kcheck/reference/nvfp4"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// squeezeHeads drops the num_heads_k = 1 axis of a [NB, P, 1, D] cache
// (FlashMLA's k_cache; vLLM passes its [NB, P, D] cache unsqueezed).
func squeezeHeads(names ...string) Fix {
	return Fix{Doc: "cache [NB, P, 1, D] read as [NB, P, D]", Apply: func(v *View) ([]string, error) {
		var notes []string
		for _, n := range names {
			note, err := dropUnitAxis(v, n, 4, 2, "an MLA cache has one KV head (dimension 2 must be 1)")
			if err != nil {
				return nil, err
			}
			notes = append(notes, note...)
		}
		return notes, nil
	}}
}

// dropUnitAxis reads tensor name of the given rank without its axis of
// size 1 (an engine's view with a head or row axis of one), noting it; a
// tensor of another rank, or absent, is left alone, and an axis that is not
// 1 is an error saying why it must be (want).
func dropUnitAxis(v *View, name string, rank, axis int, want string) ([]string, error) {
	t := v.T(name)
	if t == nil || len(t.Shape) != rank {
		return nil, nil
	}
	if t.Shape[axis] != 1 {
		return nil, fmt.Errorf("tensor %s%s has shape %v: %s", v.Prefix, name, t.Shape, want)
	}
	shape := append(append([]int(nil), t.Shape[:axis]...), t.Shape[axis+1:]...)
	r, err := reshape(v.Prefix+name, t, shape...)
	if err != nil {
		return nil, err
	}
	v.Set(name, r)
	return []string{fmt.Sprintf("%s %v read as %v (one KV head)", name, t.Shape, r.Shape)}, nil
}

// decodeRank adds the s_q = 1 axis to a decode captured without it: q [B,
// H, D] -> [B, 1, H, D], out [B, H, L] -> [B, 1, H, L], lse [B, H] -> [B,
// H, 1]. All three are pure reshapes because s_q = 1.
var decodeRank = Fix{Doc: "q [B, H, D], out [B, H, L], lse [B, H] read with s_q = 1", Apply: func(v *View) ([]string, error) {
	q := v.T("q")
	if q == nil || len(q.Shape) != 3 {
		return nil, nil
	}
	b, h := q.Shape[0], q.Shape[1]
	var notes []string
	set := func(name string, t *tensor.Tensor, shape ...int) error {
		r, err := reshape(v.Prefix+name, t, shape...)
		if err != nil {
			return err
		}
		v.Set(name, r)
		notes = append(notes, fmt.Sprintf("%s %v read as %v (s_q = 1)", name, t.Shape, r.Shape))
		return nil
	}
	if err := set("q", q, b, 1, h, q.Shape[2]); err != nil {
		return nil, err
	}
	if o := v.T("out"); o != nil && len(o.Shape) == 3 {
		if err := set("out", o, o.Shape[0], 1, o.Shape[1], o.Shape[2]); err != nil {
			return nil, err
		}
	}
	if l := v.T("lse"); l != nil && len(l.Shape) == 2 {
		if err := set("lse", l, l.Shape[0], l.Shape[1], 1); err != nil {
			return nil, err
		}
	}
	return notes, nil
}}

// flashMLAFP8 turns FlashMLA's is_fp8_kvcache flag into kv_cache_dtype.
// Upstream FlashMLA's only FP8 cache is the sparse decode's 656-byte
// fp8_ds_mla entry (deepseek-ai/FlashMLA@9241ae3
// flash_mla/flash_mla_interface.py:94-99, csrc/api/sparse_decode.h:292):
// its dense decode has no FP8 mode (dense_decode_fwd is not given the flag,
// interface.py:165-170, and csrc/api/dense_decode.h:35 requires the cache's
// dtype to be q's), so a true flag over any other width is refused rather
// than read as a per-tensor fp8_e4m3 cache FlashMLA never reads (audit F9).
// A false flag means the cache holds q's dtype: the cache tensor's own, bf16
// or fp16 (dense_decode.h:33-35). A capture that names kv_cache_dtype keeps
// it.
var flashMLAFP8 = Fix{Doc: "is_fp8_kvcache -> kv_cache_dtype", Apply: func(v *View) ([]string, error) {
	flag, ok := v.Param("is_fp8_kvcache")
	if !ok {
		return nil, nil
	}
	if _, set := v.Param("kv_cache_dtype"); set {
		return nil, nil
	}
	c := v.T("kv_cache")
	if c == nil || len(c.Shape) != 3 {
		return nil, fmt.Errorf("parameter is_fp8_kvcache = %s but tensor kv_cache is missing or not [NB, P, entry]", flag)
	}
	fp8, _, err := v.Bool("is_fp8_kvcache")
	if err != nil {
		return nil, err
	}
	if !fp8 {
		kind, err := cacheDTypeOf(c)
		if err != nil {
			return nil, fmt.Errorf("parameter is_fp8_kvcache = %s: %v", flag, err)
		}
		v.SetParam("kv_cache_dtype", kind)
		return []string{fmt.Sprintf("is_fp8_kvcache = false: kv_cache_dtype = %s (the cache tensor's dtype)", kind)}, nil
	}
	kind, ok := dsMLAKindOf(c.Shape[2])
	if !ok {
		return nil, fmt.Errorf("parameter is_fp8_kvcache = true with %d-byte kv_cache entries: FlashMLA's FP8 caches are the %d-byte fp8_ds_mla (V3.2), %d-byte fp8_ds_mla_model1 (V4) and %d-byte fp8_ds_mla_v41 (V4.1) entries of its sparse decode; its dense decode has no FP8 mode (FlashMLA@9241ae3 csrc/api/dense_decode.h:35), and vLLM's fork's flash_mla_with_kvcache_fp8 (fp8 q, descale_q, descale_k) has no kcheck mapping: set kv_cache_dtype in the metadata if this cache is another layout",
			c.Shape[2], kvcache.DSEntryBytes, kvcache.M1EntryBytes, kvcache.V41EntryBytes)
	}
	v.SetParam("kv_cache_dtype", kind)
	return []string{fmt.Sprintf("is_fp8_kvcache = true with %d-byte entries: kv_cache_dtype = %s", c.Shape[2], kind)}, nil
}}

// dsMLAKindOf names a DeepSeek sparse FP8 cache by its entry width, as
// FlashMLA does: it takes no layout argument and picks the layout from
// d_qk, 576 -> 656-byte V3.2 entries, 512 -> 584-byte MODEL1 entries
// (FlashMLA@9241ae3 csrc/api/sparse_decode.h:288-298, :316-323), and vLLM
// passes the cache through unlabelled ("FlashMLA infers which of these the
// cache holds from its bytes-per-token", vllm 0.33.0
// vllm/v1/attention/backends/mla/flashmla_sparse.py:123-125).
func dsMLAKindOf(width int) (string, bool) {
	switch width {
	case kvcache.DSEntryBytes:
		return string(kvcache.FP8DSMLA), true
	case kvcache.M1EntryBytes:
		return string(kvcache.FP8DSMLAModel1), true
	case kvcache.V41EntryBytes:
		// FlashMLA as vLLM vendors it (vllm 0.33.0
		// vllm/third_party/flashmla/flash_mla_interface.py:121: "584
		// (V4), 528 (V4.1)")
		return string(kvcache.FP8DSMLAV41), true
	}
	return "", false
}

// cacheDTypeOf names the kv_cache_dtype of an unquantized cache from its
// tensor's dtype: what an engine's "the model dtype" means for a capture.
func cacheDTypeOf(c *tensor.Tensor) (string, error) {
	switch c.DType {
	case tensor.BF16:
		return "bf16", nil
	case tensor.F16:
		return "fp16", nil
	}
	return "", fmt.Errorf("the cache tensor has dtype %s, not an unquantized cache's BF16 or F16", c.DType)
}

// vllmFP8Alias reads vLLM's kv_cache_dtype "fp8" and "fp8_ds_mla" by the
// cache's entry width: FLASHMLA_SPARSE lists "fp8" as an alias for
// fp8_ds_mla (vllm 0.33.0 vllm/v1/attention/backends/mla/flashmla_sparse.py:150-154,
// `"fp8",  # alias for fp8_ds_mla`), so a 656-byte entry is fp8_ds_mla;
// elsewhere "fp8" is per-tensor fp8_e4m3 (audit V2). vLLM spells
// DeepSeek-V4's cache fp8_ds_mla too (vllm/models/deepseek_v4/attention.py:94-123,
// "the canonical fp8_ds_mla string is written back onto cache_config"), and
// its entry is 584 bytes (flashmla_sparse.py:89-97): kcheck's
// fp8_ds_mla_model1.
func vllmFP8Alias(cache string) Fix {
	return Fix{Doc: `kv_cache_dtype "fp8" -> fp8_ds_mla (656-byte entries), fp8_ds_mla_model1 (584) or fp8_e4m3; "fp8_ds_mla" with 584-byte entries -> fp8_ds_mla_model1`, Apply: func(v *View) ([]string, error) {
		val, ok := v.Param("kv_cache_dtype")
		if !ok || val != "fp8" && val != "fp8_ds_mla" {
			return nil, nil
		}
		c := v.T(cache)
		width := -1
		if c != nil && len(c.Shape) == 3 {
			width = c.Shape[2]
		}
		kind, ds := dsMLAKindOf(width)
		switch {
		case val == "fp8" && !ds:
			kind = "fp8_e4m3"
		case val == "fp8_ds_mla" && !kvcache.Kind(kind).V4():
			return nil, nil // the 656-byte layout, or a misshapen cache the checker names
		}
		v.SetParam("kv_cache_dtype", kind)
		return []string{fmt.Sprintf(`kv_cache_dtype = %q read as %q (the %s entry width %d; vLLM spells both DeepSeek sparse caches fp8_ds_mla, and FLASHMLA_SPARSE's "fp8" is fp8_ds_mla)`, val, kind, cache, width)}, nil
	}}
}

// dsMLAScaleFromData names the ds_mla_scale convention of a vLLM
// fp8_ds_mla write from the tile scales the kernel stored, when the capture
// does not say. vLLM's writer changed convention (audit V5): the CUDA
// concat_and_cache_mla at vllm-project/vllm@00eb0c87
// csrc/libtorch_stable/cache_kernels.cu stores max(amax/448, FLT_MIN), and
// vLLM PR #49435 (merged) moved every fp8_ds_mla writer to
// 2^ceil(log2(max(amax/448, 1e-4))). A fixed default would turn one of the
// two into a false FAIL that looks like the planted scale-convention fault;
// the data tell them apart, since an amax scale is a power of two only when
// a tile's amax is 448 times one. The convention is read from the written
// slots' scales, and said in a note; a file that sets ds_mla_scale keeps it
// (so a declared convention the kernel did not follow still fails).
//
// A DeepSeek-V4 write (fp8_ds_mla_model1) stores E8M0 scales, powers of two
// either way; vLLM's V4 writer floors the amax, not the quotient, at 1e-4
// (vllm 0.33.0 vllm/models/deepseek_v4/common/ops/cache_utils.py:122-133),
// which the bytes show only for tiles of amax below 0.0448, so vLLM's
// convention is declared rather than read: pow2_amax_floor.
var dsMLAScaleFromData = Fix{Doc: "ds_mla_scale read from the written tile scales (amax or pow2); pow2_amax_floor for a DeepSeek-V4 cache", Apply: func(v *View) ([]string, error) {
	kind, _ := v.Param("kv_cache_dtype")
	if kind != "fp8_ds_mla" && !kvcache.Kind(kind).V4() {
		return nil, nil
	}
	if _, set := v.Param("ds_mla_scale"); set {
		return nil, nil
	}
	if kvcache.Kind(kind).V4() { // V4.1's writer floors the same way (deepseek_v41/common/ops/cache_utils.py:225-226)
		v.SetParam("ds_mla_scale", string(kvcache.ScalePow2AmaxFloor))
		return []string{"ds_mla_scale = pow2_amax_floor: vLLM's DeepSeek-V4 writers, 2^ceil(log2(max(amax, 1e-4)/448))"}, nil
	}
	after, slots := v.T("cache_after"), v.T("slot_mapping")
	if after == nil || slots == nil || len(after.Shape) != 3 || after.Shape[2] != kvcache.DSEntryBytes || len(after.Data) != after.Len() {
		return nil, nil // the checker names what is wrong with them
	}
	entries := after.Shape[0] * after.Shape[1]
	pow2, other := 0, 0
	for i := 0; i < slots.Len(); i++ {
		s := slots.Int64At(i)
		if s < 0 || s >= int64(entries) {
			continue
		}
		for tile := 0; tile < kvcache.DSTiles; tile++ {
			off := int(s)*kvcache.DSEntryBytes + kvcache.DSScaleOff + 4*tile
			sc := math.Float32frombits(binary.LittleEndian.Uint32(after.Data[off:]))
			if sc == math.SmallestNonzeroFloat32*(1<<23) {
				continue // FLT_MIN: the amax writer's all-zero tile, a power of two that says nothing
			}
			if f, _ := math.Frexp(float64(sc)); f == 0.5 {
				pow2++
			} else {
				other++
			}
		}
	}
	conv := "amax"
	switch {
	case pow2+other == 0:
		v.SetParam("ds_mla_scale", conv)
		return []string{"ds_mla_scale not set and no written tile says which: amax assumed"}, nil
	case other == 0:
		conv = "pow2"
	}
	v.SetParam("ds_mla_scale", conv)
	return []string{fmt.Sprintf("ds_mla_scale not set: %s, read from the written tile scales (%d of %d are powers of two; vLLM's writer moved from amax to pow2 in PR #49435: set ds_mla_scale to check against a declared one)", conv, pow2, pow2+other)}, nil
}}

// flashInferMLA assembles FlashInfer's split MLA operands into the contract:
// q = q_nope | q_pe, kv_cache = ckv_cache | kpe_cache, block_table and
// seq_lens from the page lists (kv_indptr, kv_indices, kv_len_arr), and the
// ragged [B*s_q, ...] outputs in [B, s_q, ...] order (lse [B*s_q, H] ->
// [B, H, s_q], a transposition when s_q > 1).
var flashInferMLA = Fix{Doc: "FlashInfer MLA operands assembled into q, kv_cache, block_table, seq_lens", Apply: func(v *View) ([]string, error) {
	var notes []string
	indptr := v.T("kv_indptr")
	b := 0
	switch {
	case indptr != nil:
		b = indptr.Len() - 1
	case v.T("kv_len_arr") != nil:
		b = v.T("kv_len_arr").Len()
	case v.T("seq_lens") != nil:
		b = v.T("seq_lens").Len()
	}
	// The query: split (q_nope, q_pe) or packed (q), [B*s_q, H, D] either way.
	var q *tensor.Tensor
	if qn, qp := v.T("q_nope"), v.T("q_pe"); qn != nil && qp != nil {
		c, err := concatLast(v.Prefix+"q_nope", qn, v.Prefix+"q_pe", qp)
		if err != nil {
			return nil, err
		}
		q = c
		v.Del("q_nope")
		v.Del("q_pe")
		notes = append(notes, fmt.Sprintf("q = q_nope %v | q_pe %v", qn.Shape, qp.Shape))
	} else if t := v.T("q"); t != nil && len(t.Shape) == 3 {
		q = t
	}
	if q != nil {
		if b < 1 {
			return nil, fmt.Errorf("FlashInfer's MLA query needs kv_indptr (or kv_len_arr) to know the batch size")
		}
		if len(q.Shape) != 3 || q.Shape[0]%b != 0 {
			return nil, fmt.Errorf("the query has shape %v; FlashInfer's MLA query is [B*s_q, H, D] with B = %d", q.Shape, b)
		}
		sq := q.Shape[0] / b
		if qo := v.T("qo_indptr"); qo != nil {
			off, err := ints(v.Prefix+"qo_indptr", qo)
			if err != nil {
				return nil, err
			}
			for i, o := range off {
				if o != int64(i*sq) {
					return nil, fmt.Errorf("qo_indptr[%d] = %d: the contract needs every request to have s_q = %d queries (want %d)", i, o, sq, i*sq)
				}
			}
			v.Del("qo_indptr")
		}
		r, err := reshape(v.Prefix+"q", q, b, sq, q.Shape[1], q.Shape[2])
		if err != nil {
			return nil, err
		}
		v.Set("q", r)
		notes = append(notes, fmt.Sprintf("q [B*s_q, H, D] %v read as %v", q.Shape, r.Shape))
		if o := v.T("out"); o != nil && len(o.Shape) == 3 {
			r, err := reshape(v.Prefix+"out", o, b, sq, o.Shape[1], o.Shape[2])
			if err != nil {
				return nil, err
			}
			v.Set("out", r)
			notes = append(notes, fmt.Sprintf("out %v read as %v", o.Shape, r.Shape))
		}
		if l := v.T("lse"); l != nil && len(l.Shape) == 2 {
			r, err := reshape(v.Prefix+"lse", l, b, sq, l.Shape[1])
			if err == nil {
				r, err = permute(v.Prefix+"lse", r, 0, 2, 1)
			}
			if err != nil {
				return nil, err
			}
			v.Set("lse", r)
			notes = append(notes, fmt.Sprintf("lse [B*s_q, H] %v read as [B, H, s_q] %v", l.Shape, r.Shape))
		}
	}
	if ckv, kpe := v.T("ckv_cache"), v.T("kpe_cache"); ckv != nil && kpe != nil {
		c, err := concatLast(v.Prefix+"ckv_cache", ckv, v.Prefix+"kpe_cache", kpe)
		if err != nil {
			return nil, err
		}
		v.Set("kv_cache", c)
		v.Del("ckv_cache")
		v.Del("kpe_cache")
		notes = append(notes, fmt.Sprintf("kv_cache = ckv_cache %v | kpe_cache %v", ckv.Shape, kpe.Shape))
	}
	if indptr != nil && v.T("kv_indices") != nil {
		ip, err := ints(v.Prefix+"kv_indptr", indptr)
		if err != nil {
			return nil, err
		}
		idx, err := ints(v.Prefix+"kv_indices", v.T("kv_indices"))
		if err != nil {
			return nil, err
		}
		bt, err := csrToBlockTable(ip, idx)
		if err != nil {
			return nil, err
		}
		v.Set("block_table", bt)
		if kl := v.T("kv_len_arr"); kl != nil {
			v.Set("seq_lens", kl)
			v.Del("kv_len_arr")
		} else if c := v.T("kv_cache"); c != nil && len(c.Shape) == 3 && c.Shape[1] == 1 {
			lens := make([]int64, len(ip)-1)
			for i := range lens {
				lens[i] = ip[i+1] - ip[i]
			}
			v.Set("seq_lens", tensor.FromInt64s(tensor.I32, []int{len(lens)}, lens))
		} else {
			return nil, fmt.Errorf("tensor kv_len_arr is missing: with pages of more than one token the page lists do not give the sequence lengths")
		}
		v.Del("kv_indptr")
		v.Del("kv_indices")
		notes = append(notes, fmt.Sprintf("block_table %v and seq_lens from kv_indptr/kv_indices", bt.Shape))
	}
	return notes, nil
}}

// flashInferMergeStates reads cascade merge_states operands as a split-K
// combine: v [T, S, H, D] -> partial_out [T*H, S, D], s [T, S, H] ->
// partial_lse [T*H, S], V [T, H, D] -> out [T*H, D], S [T, H] -> lse [T*H]
// (rows in the contract's (token, head) order).
var flashInferMergeStates = Fix{Doc: "merge_states [T, S, H, ...] read as rows (T*H) of S splits", Apply: func(v *View) ([]string, error) {
	var notes []string
	if po := v.T("partial_out"); po != nil && len(po.Shape) == 4 {
		p, err := permute(v.Prefix+"partial_out", po, 0, 2, 1, 3)
		if err == nil {
			p, err = reshape(v.Prefix+"partial_out", p, po.Shape[0]*po.Shape[2], po.Shape[1], po.Shape[3])
		}
		if err != nil {
			return nil, err
		}
		v.Set("partial_out", p)
		notes = append(notes, fmt.Sprintf("partial_out [T, S, H, D] %v read as [T*H, S, D] %v", po.Shape, p.Shape))
	}
	if pl := v.T("partial_lse"); pl != nil && len(pl.Shape) == 3 {
		p, err := permute(v.Prefix+"partial_lse", pl, 0, 2, 1)
		if err == nil {
			p, err = reshape(v.Prefix+"partial_lse", p, pl.Shape[0]*pl.Shape[2], pl.Shape[1])
		}
		if err != nil {
			return nil, err
		}
		v.Set("partial_lse", p)
		notes = append(notes, fmt.Sprintf("partial_lse [T, S, H] %v read as [T*H, S] %v", pl.Shape, p.Shape))
	}
	return append(notes, flattenRows(v)...), nil
}}

// flattenRows reads out [T, H, D] as [T*H, D] and lse [T, H] as [T*H].
func flattenRows(v *View) []string {
	var notes []string
	if o := v.T("out"); o != nil && len(o.Shape) == 3 {
		r := &tensor.Tensor{DType: o.DType, Shape: []int{o.Shape[0] * o.Shape[1], o.Shape[2]}, Data: o.Data}
		v.Set("out", r)
		notes = append(notes, fmt.Sprintf("out %v read as %v", o.Shape, r.Shape))
	}
	if l := v.T("lse"); l != nil && len(l.Shape) == 2 {
		r := &tensor.Tensor{DType: l.DType, Shape: []int{l.Len()}, Data: l.Data}
		v.Set("lse", r)
		notes = append(notes, fmt.Sprintf("lse %v read as %v", l.Shape, r.Shape))
	}
	return notes
}

// mergeTwoStates reads a two-state merge, merge_attn_states(output,
// prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse) in
// vLLM and merge_state(prefix_output, prefix_lse, suffix_output,
// suffix_lse) -> (output, output_lse) in SGLang, as a two-split combine:
// outputs [T, H, D] become partial_out [T*H, 2, D], the lse [H, T] (vLLM)
// or [T, H] (SGLang; the `lse_layout` parameter says which, `H,T` or
// `T,H`) become partial_lse [T*H, 2]. Both merges read a partial lse of
// +inf as an empty state (-inf): the contract's empty split is -inf, so
// +inf is rewritten, and said. vLLM's prefill_tokens_with_context, when
// set, makes every token at or past it a copy of the suffix (the kernel
// never reads the prefix there), so those tokens' prefix state is read
// as empty, and said: the combine of one state is that state, bit for
// bit.
var mergeTwoStates = Fix{Doc: "prefix/suffix states read as a two-split combine", Apply: func(v *View) ([]string, error) {
	po, so, pl, sl := v.T("prefix_output"), v.T("suffix_output"), v.T("prefix_lse"), v.T("suffix_lse")
	if po == nil || so == nil || pl == nil || sl == nil {
		return nil, nil
	}
	if v.T("output_scale") != nil {
		// vllm 0.33.0 vllm/v1/attention/ops/triton_merge_attn_states.py
		// :130-133, :211-214: out * (1 / output_scale), clamped to the fp8
		// range, stored as fp8 (audit V12). splitk_combine's out is a float.
		return nil, fmt.Errorf("tensor %soutput_scale: merge_attn_states with an output_scale quantizes the merged output to fp8 (out * (1/output_scale), clamped to ±448: vllm 0.33.0 triton_merge_attn_states.py:211-214), which has no kcheck contract: capture the merge without output_scale (its float output), or the fp8 output's consumer", v.Prefix)
	}
	layout, _ := v.Param("lse_layout")
	if layout != "H,T" && layout != "T,H" {
		return nil, fmt.Errorf("parameter lse_layout = %q: want H,T (vLLM's merge_attn_states) or T,H (SGLang's merge_state)", layout)
	}
	if len(po.Shape) != 3 {
		return nil, fmt.Errorf("tensor %sprefix_output has shape %v; a merge's states are [T, H, D]", v.Prefix, po.Shape)
	}
	t, h, d := po.Shape[0], po.Shape[1], po.Shape[2]
	out, err := stack(2, []string{v.Prefix + "prefix_output", v.Prefix + "suffix_output"}, []*tensor.Tensor{po, so})
	if err != nil {
		return nil, err
	}
	if out, err = reshape(v.Prefix+"partial_out", out, t*h, 2, d); err != nil {
		return nil, err
	}
	// lseTH reads one lse tensor in token-major order [T, H].
	lseTH := func(n string, l *tensor.Tensor) (*tensor.Tensor, error) {
		want := []int{h, t}
		if layout == "T,H" {
			want = []int{t, h}
		}
		if !sameInts(l.Shape, want) {
			return nil, fmt.Errorf("tensor %s%s has shape %v; with lse_layout = %s it is %v", v.Prefix, n, l.Shape, layout, want)
		}
		if layout == "T,H" {
			return l, checked(v.Prefix+n, l)
		}
		return permute(v.Prefix+n, l, 1, 0)
	}
	var lses []*tensor.Tensor
	for _, n := range []string{"prefix_lse", "suffix_lse"} {
		lt, err := lseTH(n, v.T(n))
		if err != nil {
			return nil, err
		}
		lses = append(lses, lt)
	}
	lse, err := stack(2, []string{v.Prefix + "prefix_lse", v.Prefix + "suffix_lse"}, lses)
	if err != nil {
		return nil, err
	}
	if lse, err = reshape(v.Prefix+"partial_lse", lse, t*h, 2); err != nil {
		return nil, err
	}
	notes := []string{fmt.Sprintf("prefix/suffix outputs [T, H, D] = %v and lse [%s] read as partial_out %v, partial_lse %v", po.Shape, layout, out.Shape, lse.Shape)}
	if lse.DType.IsFloat() {
		posInf := 0
		for i := 0; i < lse.Len(); i++ {
			if math.IsInf(lse.Float64At(i), 1) {
				lse.SetFloat64(i, math.Inf(-1))
				posInf++
			}
		}
		if posInf > 0 {
			notes = append(notes, fmt.Sprintf("%d partial lse of +inf read as -inf (the merge treats +inf as an empty state)", posInf))
		}
	}
	if s, ok := v.Param("prefill_tokens_with_context"); ok {
		ptc, err := strconv.Atoi(s)
		if err != nil || ptc < 0 {
			return nil, fmt.Errorf("parameter prefill_tokens_with_context = %q: want a token count, 0 or more", s)
		}
		if ptc < t {
			for r := ptc * h; r < t*h; r++ {
				lse.SetFloat64(2*r, math.Inf(-1))
			}
			notes = append(notes, fmt.Sprintf("tokens %d..%d (at or past prefill_tokens_with_context = %d) are copies of the suffix: their prefix state read as empty", ptc, t-1, ptc))
		}
	}
	v.Set("partial_out", out)
	v.Set("partial_lse", lse)
	for _, n := range []string{"prefix_output", "suffix_output", "prefix_lse", "suffix_lse"} {
		v.Del(n)
	}
	if o := v.T("out"); o != nil && len(o.Shape) == 3 {
		v.Set("out", &tensor.Tensor{DType: o.DType, Shape: []int{t * h, d}, Data: o.Data})
		notes = append(notes, fmt.Sprintf("out %v read as [%d, %d]", o.Shape, t*h, d))
	}
	if l := v.T("lse"); l != nil && len(l.Shape) == 2 {
		lt, err := lseTH("output_lse", l)
		if err != nil {
			return nil, err
		}
		v.Set("lse", &tensor.Tensor{DType: lt.DType, Shape: []int{lt.Len()}, Data: lt.Data})
		notes = append(notes, fmt.Sprintf("output_lse [%s] %v read as [T*H]", layout, l.Shape))
	}
	return notes, nil
}}

// cumulativeSeqLens turns vLLM's cu_seq_lens [B+1] into seq_lens [B]
// (seq_starts, a chunked gather's, the contract reads as it is).
var cumulativeSeqLens = Fix{Doc: "cu_seq_lens -> seq_lens", Apply: func(v *View) ([]string, error) {
	cu := v.T("cu_seq_lens")
	if cu == nil || v.T("seq_lens") != nil {
		return nil, nil
	}
	c, err := ints(v.Prefix+"cu_seq_lens", cu)
	if err != nil {
		return nil, err
	}
	lens, err := lensFromCumulative(v.Prefix+"cu_seq_lens", c)
	if err != nil {
		return nil, err
	}
	v.Set("seq_lens", lens)
	v.Del("cu_seq_lens")
	return []string{fmt.Sprintf("seq_lens from cu_seq_lens %v", cu.Shape)}, nil
}}

// int32Scales reads block scales stored as vLLM allocates them (int32, four
// E4M3 codes a word) as bytes.
func int32Scales(names ...string) Fix {
	return Fix{Doc: "int32-packed scales read as bytes", Apply: func(v *View) ([]string, error) {
		var notes []string
		for _, n := range names {
			t := v.T(n)
			if t == nil || (t.DType != tensor.I32 && t.DType != tensor.U32) {
				continue
			}
			b, err := bytesOf(v.Prefix+n, t, tensor.F8E4M3)
			if err != nil {
				return nil, err
			}
			v.Set(n, b)
			notes = append(notes, fmt.Sprintf("%s %s %v read as F8_E4M3 %v (four codes a word, as vLLM views it)", n, t.DType, t.Shape, b.Shape))
		}
		return notes, nil
	}}
}

// fp4Alpha reads cutlass_scaled_fp4_mm's single alpha (= 1/(a_gs·b_gs), or
// input_scale·weight_scale_2) as a_global = alpha, b_global = 1, both
// dequant: the reference forms the same fp32 product a_global·b_global for
// its epilogue, so the factorisation is exact.
var fp4Alpha = Fix{Doc: "alpha -> a_global = alpha, b_global = 1", Apply: func(v *View) ([]string, error) {
	a := v.T("alpha")
	if a == nil {
		return nil, nil
	}
	if v.T("a_global") != nil || v.T("b_global") != nil {
		return []string{"alpha ignored: a_global or b_global is present"}, nil
	}
	if a.DType != tensor.F32 || a.Len() != 1 {
		return nil, fmt.Errorf("tensor alpha is %s %v; cutlass_scaled_fp4_mm's alpha is one float32", a.DType, a.Shape)
	}
	v.Set("a_global", a)
	v.Set("b_global", tensor.FromFloat64s(tensor.F32, []int{1}, []float64{1}))
	v.Del("alpha")
	v.SetParam("a_global_kind", "dequant")
	v.SetParam("b_global_kind", "dequant")
	return []string{"alpha read as a_global (dequant) with b_global = 1"}, nil
}}

// tritonAttnLogits reads vLLM TRITON_MLA's split-K scratch, attn_logits
// [B, H, S, L+1] F32, as the contract's partials: stage 1 stores split s's
// normalized output in columns 0..L-1 and its lse (e_max + log(e_sum),
// base e) in column L (vllm 0.33.0 vllm/v1/attention/ops/
// triton_decode_attention.py, _fwd_grouped_kernel_stage1, lines 449-466;
// stage 2 reads the lse at `+ Lv`, line 604). partial_out [B, 1, H, S, L]
// and partial_lse [B, 1, H, S] are its two column ranges, byte for byte.
// A split the kernel skipped (split_kv_end <= split_kv_start) is not
// written, so a faithful capture holds whatever the buffer held there.
var tritonAttnLogits = Fix{Doc: "attn_logits [B, H, S, L+1] read as partial_out [B, 1, H, S, L] and partial_lse [B, 1, H, S]", Apply: func(v *View) ([]string, error) {
	al := v.T("attn_logits")
	if al == nil {
		return nil, nil
	}
	if v.T("partial_out") != nil || v.T("partial_lse") != nil {
		return nil, fmt.Errorf("tensor %sattn_logits and partial_out/partial_lse are both present: keep one", v.Prefix)
	}
	if err := checked(v.Prefix+"attn_logits", al); err != nil {
		return nil, err
	}
	if len(al.Shape) != 4 || al.Shape[3] < 2 {
		return nil, fmt.Errorf("tensor %sattn_logits has shape %v; TRITON_MLA's is [B, H, S, L+1]", v.Prefix, al.Shape)
	}
	if al.DType != tensor.F32 {
		return nil, fmt.Errorf("tensor %sattn_logits has dtype %s; TRITON_MLA allocates it F32", v.Prefix, al.DType)
	}
	b, h, s, l := al.Shape[0], al.Shape[1], al.Shape[2], al.Shape[3]-1
	es := al.DType.Size()
	po := tensor.New(al.DType, b, 1, h, s, l)
	pl := tensor.New(al.DType, b, 1, h, s)
	for r := 0; r < b*h*s; r++ {
		row := al.Data[r*(l+1)*es : (r+1)*(l+1)*es]
		copy(po.Data[r*l*es:(r+1)*l*es], row[:l*es])
		copy(pl.Data[r*es:(r+1)*es], row[l*es:])
	}
	v.Set("partial_out", po)
	v.Set("partial_lse", pl)
	v.Del("attn_logits")
	notes := []string{fmt.Sprintf("attn_logits %v read as partial_out %v (columns 0..%d) and partial_lse %v (column %d)", al.Shape, po.Shape, l-1, pl.Shape, l)}
	// vLLM's split k of a request of n tokens is [k·cdiv(n, S), min((k+1)·cdiv(n, S), n))
	// (triton_decode_attention.py lines 352-354), the contract's default split.
	lens, err := seqLensOf(v, b)
	if err != nil {
		return nil, err
	}
	bounds := make([]int, b*(s+1))
	for r, n := range lens {
		per := (n + s - 1) / s
		for k := 0; k <= s; k++ {
			bounds[r*(s+1)+k] = min(k*per, n)
		}
	}
	return append(notes, unwrittenSplits(v, "TRITON_MLA", bounds, b, h, s, l)...), nil
}}

// seqLensOf reads the contract's seq_lens [B] of a view.
func seqLensOf(v *View, b int) ([]int, error) {
	t := v.T("seq_lens")
	if t == nil {
		return nil, fmt.Errorf("tensor %sseq_lens is missing: the split-K partials' token ranges need it", v.Prefix)
	}
	raw, err := ints(v.Prefix+"seq_lens", t)
	if err != nil {
		return nil, err
	}
	if len(raw) != b {
		return nil, fmt.Errorf("tensor %sseq_lens has %d entries; the partials hold %d requests", v.Prefix, len(raw), b)
	}
	lens := make([]int, b)
	for i, n := range raw {
		if n < 0 || n > math.MaxInt32 {
			return nil, fmt.Errorf("%sseq_lens[%d] = %d is not a length", v.Prefix, i, n)
		}
		lens[i] = int(n)
	}
	return lens, nil
}

// unwrittenSplits marks the splits an engine's stage 1 never writes: vLLM's
// and SGLang's Triton decode store a split's partial only `if
// split_kv_end > split_kv_start`, into a torch.empty buffer (audit V13,
// S5), and their stage 2 skips such a split by the same bounds, so what its
// partial holds is not data. bounds [B, S+1] are the engine's token ranges
// (request r's split k is bounds[r, k] .. bounds[r, k+1]); the partials
// partial_out [B, 1, H, S, L] and partial_lse [B, 1, H, S] of every empty
// split are given the contract's empty split, out 0 and lse -inf
// (reference/CONTRACTS.md §3.6.1), whatever the buffer held, so they are
// not judged, and the note says how many. A split the bounds say holds
// tokens is judged as written: an engine that skips it fails there.
func unwrittenSplits(v *View, engine string, bounds []int, b, h, s, l int) []string {
	po, pl := v.T("partial_out"), v.T("partial_lse")
	empty := 0
	for r := 0; r < b; r++ {
		for k := 0; k < s; k++ {
			if bounds[r*(s+1)+k+1] > bounds[r*(s+1)+k] {
				continue
			}
			empty++
			for hh := 0; hh < h; hh++ {
				row := (r*h+hh)*s + k
				pl.SetFloat64(row, math.Inf(-1))
				for i := 0; i < l; i++ {
					po.SetFloat64(row*l+i, 0)
				}
			}
		}
	}
	if empty == 0 {
		return nil
	}
	return []string{fmt.Sprintf("%d of %d splits empty, not judged: %s never writes an empty split's partials (they are not data); out and lse, where captured, are judged", empty, b*s, engine)}
}

// sglangTritonDecode reads SGLang's Triton MLA decode,
// decode_attention_fwd(q, k_buffer, v_buffer, o, kv_indptr, kv_indices,
// attn_logits, attn_lse, num_kv_splits, max_kv_splits, sm_scale, ...)
// (sglang 0.5.23 sglang/kernels/ops/attention/decode_attention.py): the
// cache is a token pool, k_buffer [N, 1, D] (one KV head), read as N
// pages of one token; request b's tokens are kv_indices[kv_indptr[b] ..
// kv_indptr[b+1]] (lines 606-607), so the block table is that list and
// seq_lens its lengths. The split-K scratch is two tensors, attn_logits
// [B, H, S, Lv] and attn_lse [B, H, S] (S = max_kv_splits), read as
// partial_out [B, 1, H, S, L] and partial_lse [B, 1, H, S]. Request b
// uses num_kv_splits[b] splits of cdiv(cdiv(n, splits), 32)·32 tokens
// (MIN_BLOCK_KV = 32, lines 46 and 632-636), the rest of the S empty:
// split_bounds says so, and the empty splits, never written (line 649),
// are not judged. There is no final lse.
var sglangTritonDecode = Fix{Doc: "SGLang Triton decode: token pool, kv_indptr/kv_indices, attn_logits/attn_lse, per-request split counts", Apply: func(v *View) ([]string, error) {
	al, als, kb := v.T("attn_logits"), v.T("attn_lse"), v.T("k_buffer")
	indptr, indices, splits := v.T("kv_indptr"), v.T("kv_indices"), v.T("num_kv_splits")
	if al == nil && als == nil && kb == nil {
		return nil, nil
	}
	for _, n := range []struct {
		name string
		t    *tensor.Tensor
	}{{"k_buffer", kb}, {"kv_indptr", indptr}, {"kv_indices", indices}} {
		if n.t == nil {
			return nil, fmt.Errorf("tensor %s%s is missing: SGLang's Triton decode needs k_buffer, kv_indptr and kv_indices", v.Prefix, n.name)
		}
	}
	var notes []string
	if len(kb.Shape) != 3 || kb.Shape[1] != 1 {
		return nil, fmt.Errorf("tensor %sk_buffer has shape %v; SGLang's MLA token pool is [N, 1, D] (one KV head)", v.Prefix, kb.Shape)
	}
	v.Set("kv_cache", kb)
	v.Del("k_buffer")
	v.SetParam("page_size", "1")
	notes = append(notes, fmt.Sprintf("k_buffer %v read as kv_cache of %d one-token pages", kb.Shape, kb.Shape[0]))
	if _, ok := v.Param("kv_cache_dtype"); !ok && kb.DType == tensor.BF16 {
		v.SetParam("kv_cache_dtype", "bf16")
		notes = append(notes, "kv_cache_dtype = bf16 (k_buffer's dtype)")
	}
	ip, err := ints(v.Prefix+"kv_indptr", indptr)
	if err != nil {
		return nil, err
	}
	idx, err := ints(v.Prefix+"kv_indices", indices)
	if err != nil {
		return nil, err
	}
	bt, err := csrToBlockTable(ip, idx)
	if err != nil {
		return nil, err
	}
	b := len(ip) - 1
	lens := make([]int64, b)
	for i := range lens {
		lens[i] = ip[i+1] - ip[i]
	}
	v.Set("block_table", bt)
	v.Set("seq_lens", tensor.FromInt64s(tensor.I32, []int{b}, lens))
	v.Del("kv_indptr")
	v.Del("kv_indices")
	notes = append(notes, fmt.Sprintf("block_table %v and seq_lens from kv_indptr/kv_indices (one token a page)", bt.Shape))
	if al == nil && als == nil {
		return notes, nil
	}
	if al == nil || als == nil {
		return nil, fmt.Errorf("tensors %sattn_logits and attn_lse come together (SGLang's split-K partials): one is missing", v.Prefix)
	}
	if err := checked(v.Prefix+"attn_logits", al); err != nil {
		return nil, err
	}
	if err := checked(v.Prefix+"attn_lse", als); err != nil {
		return nil, err
	}
	if len(al.Shape) != 4 || al.Shape[0] != b || len(als.Shape) != 3 || !sameInts(als.Shape, al.Shape[:3]) {
		return nil, fmt.Errorf("tensors %sattn_logits %v and attn_lse %v: SGLang's are [B=%d, H, S, Lv] and [B, H, S]", v.Prefix, al.Shape, als.Shape, b)
	}
	h, s, l := al.Shape[1], al.Shape[2], al.Shape[3]
	// copies: the empty splits are rewritten below, and the capture's own
	// tensors are never changed
	po := &tensor.Tensor{DType: al.DType, Shape: []int{b, 1, h, s, l}, Data: append([]byte(nil), al.Data...)}
	pl := &tensor.Tensor{DType: als.DType, Shape: []int{b, 1, h, s}, Data: append([]byte(nil), als.Data...)}
	v.Set("partial_out", po)
	v.Set("partial_lse", pl)
	v.Del("attn_logits")
	v.Del("attn_lse")
	notes = append(notes, fmt.Sprintf("attn_logits %v and attn_lse %v read as partial_out %v and partial_lse %v", al.Shape, als.Shape, po.Shape, pl.Shape))
	if splits == nil {
		return nil, fmt.Errorf("tensor %snum_kv_splits is missing: SGLang's split bounds depend on each request's split count", v.Prefix)
	}
	per, err := ints(v.Prefix+"num_kv_splits", splits)
	if err != nil {
		return nil, err
	}
	if len(per) != b {
		return nil, fmt.Errorf("tensor %snum_kv_splits has %d entries; the batch has %d requests", v.Prefix, len(per), b)
	}
	const minBlockKV = 32 // _MIN_BLOCK_KV
	bounds := make([]int, b*(s+1))
	bv := make([]int64, b*(s+1))
	for r := 0; r < b; r++ {
		n, k := int(lens[r]), int(per[r])
		if k < 1 || k > s {
			return nil, fmt.Errorf("num_kv_splits[%d] = %d: want 1 to max_kv_splits = %d (attn_logits' dimension 2)", r, k, s)
		}
		size := ((n+k-1)/k + minBlockKV - 1) / minBlockKV * minBlockKV
		for j := 0; j <= s; j++ {
			bounds[r*(s+1)+j] = min(j*size, n)
			bv[r*(s+1)+j] = int64(bounds[r*(s+1)+j])
		}
	}
	v.Set("split_bounds", tensor.FromInt64s(tensor.I32, []int{b, s + 1}, bv))
	v.Del("num_kv_splits")
	notes = append(notes, fmt.Sprintf("split_bounds %v from num_kv_splits %v, splits rounded up to %d tokens", []int{b, s + 1}, per, minBlockKV))
	notes = append(notes, unwrittenSplits(v, "SGLang's Triton decode", bounds, b, h, s, l)...)
	// A request with no token has every split empty: stage 2 stores
	// `acc / e_sum * v_scale` with both still 0 (decode_attention.py lines
	// 981-983, 1014-1018), NaN.
	return append(notes, nanEmptyRows(v, "SGLang's Triton decode stage 2 stores acc / e_sum, 0/0 (decode_attention.py lines 981-983, 1014-1018)")...), nil
}}

// nanEmptyRows declares empty_row = nan for mla_decode, unless the file
// declares it: the engine's stage 2 divides an empty row's zero
// accumulator by its zero sum, so a row that sees no token holds NaN there
// (and its lse e_max + log(e_sum) = -inf, the contract's lse_empty).
func nanEmptyRows(v *View, why string) []string {
	if v.Declared("empty_row") {
		return nil
	}
	v.SetParam("empty_row", "nan")
	return []string{"empty_row = nan: " + why}
}

// fp4QuantLayout names the scale_layout of an NVFP4 quantize capture from
// the call's own arguments, when the file does not set scale_layout:
//   - vLLM scaled_fp4_quant(input, input_global_scale, is_sf_swizzled_layout
//     = True, backend = "none", padded_n = None): a "trtllm" backend with
//     m <= 32 rows writes the 8x4 layout, else is_sf_swizzled_layout picks
//     128x4 or linear (vllm 0.33.0 vllm/_custom_ops.py:1526-1601); the
//     swizzled scales are allocated int32, the linear ones uint8
//     (create_fp4_scale_tensor, :37-66);
//   - FlashInfer fp4_quantize(..., is_sf_swizzled_layout = True,
//     is_sf_8x4_layout = False) (flashinfer 0.7.2.post1
//     flashinfer/quantization/fp4_quantization.py:1053-1059, reshaped at
//     :1220-1224).
//
// Without those arguments the scale tensor's shape decides, except where
// rows % 128 == 0 and K/16 % 4 == 0 (rows % 8 for 8x4): there the linear
// and tiled layouts have the same shape and the same dtype (vLLM views both
// as float8_e4m3fn), so the capture is refused with a message asking which
// rather than read one way silently (audit V8, I8).
var fp4QuantLayout = Fix{Doc: "scale_layout from the quantize call's arguments, or the one layout block_scale's shape fits", Apply: fp4QuantLayoutFrom}

func fp4QuantLayoutFrom(v *View) ([]string, error) {
	// padded_n (vllm 0.33.0 vllm/_custom_ops.py:1549-1551, :84-86) allocates
	// output [m, padded_n/2] and its scales for padded_n columns, "so the
	// quantization kernel can write CUTLASS-compatible K padding directly":
	// what the padding holds is the compiled kernel's, unread here, so such
	// a capture is refused rather than judged on a guess (audit V8).
	x, packed := v.T("x"), v.T("packed")
	pn, hasPN := v.Param("padded_n")
	padded := hasPN && pn != "None" && pn != ""
	if n, err := strconv.Atoi(pn); padded && err == nil && x != nil && len(x.Shape) == 2 && n == x.Shape[1] {
		padded = false // padded_n = n pads nothing
	}
	if padded || x != nil && packed != nil && len(x.Shape) == 2 && len(packed.Shape) == 2 && packed.Shape[1]*2 > x.Shape[1] {
		return nil, fmt.Errorf("an NVFP4 quantize with K padded past the input (padded_n = %q, output %v for input %v): scaled_fp4_quant's padded_n (vllm 0.33.0 _custom_ops.py:1549-1551) writes K padding whose contents kcheck has no contract for; capture the call without padded_n", pn, shapeOf(packed), shapeOf(x))
	}
	if _, set := v.Param("scale_layout"); set {
		return nil, nil
	}
	x, sc := v.T("x"), v.T("block_scale")
	if x == nil || sc == nil || len(x.Shape) != 2 || x.Shape[1]%16 != 0 {
		return nil, nil // the checker names what is wrong with them
	}
	rows, kSF := x.Shape[0], x.Shape[1]/16
	swz, swzSet, err := v.Bool("is_sf_swizzled_layout")
	if err != nil {
		return nil, err
	}
	eight, eightSet, err := v.Bool("is_sf_8x4_layout")
	if err != nil {
		return nil, err
	}
	if b, ok := v.Param("backend"); ok && strings.Contains(b, "trtllm") && rows <= 32 {
		eight, eightSet = true, true
	}
	var lay nvfp4.Layout
	var why string
	switch {
	case swzSet && !swz:
		lay, why = nvfp4.Linear, "is_sf_swizzled_layout = false"
	case eightSet && eight:
		lay, why = nvfp4.Swizzled8x4, "an 8x4 call (is_sf_8x4_layout, or a trtllm backend with m <= 32)"
	case swzSet:
		lay, why = nvfp4.Swizzled128x4, "is_sf_swizzled_layout = true"
	case sc.DType == tensor.I32 || sc.DType == tensor.U32:
		lay, why = nvfp4.Swizzled128x4, "the int32 allocation vLLM makes only for swizzled scales"
	default:
		var fits []nvfp4.Layout
		for _, l := range []nvfp4.Layout{nvfp4.Linear, nvfp4.Swizzled128x4, nvfp4.Swizzled8x4} {
			if l.Fits(sc.Shape, rows, kSF) {
				fits = append(fits, l)
			}
		}
		switch len(fits) {
		case 0:
			return nil, nil // no layout fits: the checker's shape error says what each wants
		case 1:
			lay, why = fits[0], fmt.Sprintf("the only layout block_scale %v fits for x %v", sc.Shape, x.Shape)
		default:
			names := make([]string, len(fits))
			for i, l := range fits {
				names[i] = l.String()
			}
			return nil, fmt.Errorf("tensor block_scale %v fits scale_layout %s for x %v (rows a multiple of the tile, K/16 of 4): set scale_layout, or record the call's is_sf_swizzled_layout (and is_sf_8x4_layout or backend) in the metadata; kcheck does not guess",
				sc.Shape, strings.Join(names, " and "), x.Shape)
		}
	}
	v.SetParam("scale_layout", lay.String())
	return []string{fmt.Sprintf("scale_layout = %s, from %s", lay, why)}, nil
}

// flashInferFP4Modes refuses the fp4_quantize modes that are not NVFP4 as
// the contract defines it (flashinfer 0.7.2.post1
// flashinfer/quantization/fp4_quantization.py:1053-1064): MXFP4
// (sf_vec_size 32, sf_use_ue8m0 = True), a global scale given inverted
// (is_global_scale_inversed = True), and the 4over6 block-scale recipe
// (nvfp4_4over6, or FLASHINFER_NVFP4_4OVER6 in the environment, recorded as
// the capture's nvfp4_4over6). Read as 128x4 NVFP4 with a quant-direction
// global scale they would check against the wrong recipe (audit I8), so
// each is refused, naming it.
var flashInferFP4Modes = Fix{Doc: "non-NVFP4 fp4_quantize modes refused", Apply: func(v *View) ([]string, error) {
	off := func(val string) bool {
		switch strings.ToLower(val) {
		case "", "false", "0", "none":
			return true
		}
		return false
	}
	for _, m := range []struct {
		key    string
		accept func(string) bool
		why    string
	}{
		{"sf_vec_size", func(s string) bool { return s == "16" }, "MXFP4 (32-element blocks, E8M0 scales) has no kcheck contract"},
		{"sf_use_ue8m0", off, "UE8M0 block scales (MXFP4) have no kcheck contract"},
		{"is_global_scale_inversed", off, "an inverted global scale is not the quant-direction gs the contract reads; pass 1/gs as global_scale"},
		{"nvfp4_4over6", off, "the 4over6 block-scale recipe is not the contract's NVFP4 (e4m3(gs·amax/6) scales)"},
	} {
		if val, set := v.Param(m.key); set && !m.accept(val) {
			return nil, fmt.Errorf("parameter %s = %q: %s", m.key, val, m.why)
		}
	}
	return nil, nil
}}

// sglangPoolWrite reads SGLang's MLA pool write as kv_cache_write (sglang
// 0.5.23 MLATokenToKVPool.set_mla_kv_buffer, sglang/srt/mem_cache/
// memory_pool.py:5026-5047, which casts the tokens to the pool's dtype with
// PyTorch and no scale, :5012-5024, then scatters each row with
// set_mla_kv_buffer_triton, sglang/kernels/ops/kvcache/mla_buffer.py:290-309):
//   - cache_k_nope [T, 1, L] and cache_k_rope [T, 1, R] are the tokens;
//   - the pool is flat, kv_buffer [size + page_size, 1, D] (memory_pool.py
//     :4863-4869), one token a row: a cache of one-token pages (page_size 1
//     is the engine default);
//   - an fp8 pool has no scale: k_scale 1 when the capture has none;
//   - a loc equal to reserved_skip_index (0 unless the call says: slot 0 is
//     "used for writing dummy outputs from padded tokens", :4863) is not
//     written (mla_buffer.py:41-44, 80): read as the contract's skip, -1;
//   - kv_cache_dtype, when the capture leaves it out or says auto, is the
//     pool tensor's own: bf16, fp16, F8_E4M3 (fp8_e4m3), or 656-byte U8
//     entries (fp8_ds_mla, the DSA pool); other U8 pools are refused, since
//     SGLang also has fp8_e5m2 pools stored as the same bytes.
var sglangPoolWrite = Fix{Doc: "SGLang pool write: cache_k_nope/cache_k_rope [T, 1, *], flat kv_buffer, reserved_skip_index, no fp8 scale", Apply: func(v *View) ([]string, error) {
	var notes []string
	for _, n := range []string{"kv_c", "k_pe"} {
		note, err := dropUnitAxis(v, n, 3, 1, "SGLang's MLA pool writes one KV head (dimension 1 must be 1)")
		if err != nil {
			return nil, err
		}
		notes = append(notes, note...)
	}
	cache := v.T("cache_after")
	if kind, ok := v.Param("kv_cache_dtype"); (!ok || kind == "auto") && cache != nil && len(cache.Shape) == 3 {
		switch {
		case cache.DType == tensor.BF16 || cache.DType == tensor.F16:
			kind, _ = cacheDTypeOf(cache)
		case cache.DType == tensor.F8E4M3:
			kind = "fp8_e4m3"
		case cache.DType == tensor.U8 && cache.Shape[2] == kvcache.DSEntryBytes:
			kind = "fp8_ds_mla"
		default:
			return nil, fmt.Errorf("tensor %scache_after (kv_buffer) is a %s pool with %d-byte rows and the capture does not say its kv_cache_dtype: SGLang stores fp8_e4m3 and fp8_e5m2 pools as the same bytes, so set kv_cache_dtype (fp8_e4m3; e5m2 has no kcheck contract)", v.Prefix, cache.DType, cache.Shape[2])
		}
		v.SetParam("kv_cache_dtype", kind)
		notes = append(notes, fmt.Sprintf("kv_cache_dtype = %s (the pool tensor's dtype)", kind))
	}
	if kind, _ := v.Param("kv_cache_dtype"); kind == "fp8_e4m3" && v.T("k_scale") == nil {
		one := tensor.New(tensor.F32)
		one.SetFloat64(0, 1)
		v.Set("k_scale", one)
		notes = append(notes, "k_scale = 1: SGLang's pool casts to fp8 with no scale (memory_pool.py:5016)")
	}
	reserved := int64(0)
	if s, ok := v.Param("reserved_skip_index"); ok {
		r, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("parameter reserved_skip_index = %q: want an integer", s)
		}
		reserved = r
	}
	if sm := v.T("slot_mapping"); sm != nil && reserved >= 0 {
		var out *tensor.Tensor
		skipped := 0
		for i := 0; i < sm.Len(); i++ {
			if sm.Int64At(i) == reserved {
				if out == nil {
					out = sm.Clone()
				}
				out.SetInt64(i, -1)
				skipped++
			}
		}
		if out != nil {
			v.Set("slot_mapping", out)
			notes = append(notes, fmt.Sprintf("%d loc entries equal to reserved_skip_index %d read as -1 (not written, as set_mla_kv_buffer_kernel skips them)", skipped, reserved))
		}
	}
	return notes, nil
}}

// shapeOf is t's shape for a message, or "none" when the tensor is absent.
func shapeOf(t *tensor.Tensor) string {
	if t == nil {
		return "none"
	}
	return fmt.Sprint(t.Shape)
}

// tritonMLAPrecision declares the precision of vLLM's TRITON_MLA for a
// capture of its decode_attention_fwd, recognised by its split-K scratch
// attn_logits (vllm 0.33.0 vllm/v1/attention/ops/triton_decode_attention.py,
// _fwd_grouped_kernel_stage1), unless the capture declares it:
//   - an fp8 cache entry is `(k.to(tl.float32) * ks).to(q.dtype)` (lines
//     391-392, the rope part likewise at 402-403): kv_dequant_dtype is q's
//     dtype. With is_mla, V is that same block, `v = tl.trans(k)` (line
//     431; v_buffer and v_scale are never read, and vLLM passes v_scale =
//     layer._k_scale anyway, triton_mla.py:340-341), so P is rounded to
//     q's dtype for an fp8 cache and to the cache's own for a 16-bit one,
//     `tl.dot(p.to(v.dtype), v)` (line 437): p_dtype (audit V15: not V
//     and P in fp32, which the audit read in an older commit);
//   - the running max advances once per BLOCK = 32 tokens (line 505):
//     softmax_block = 32.
//
// A cache stored F8_E4M3 with no kv_cache_dtype is the kernel's fp8 path
// (the `k.dtype.is_fp8()` branch, with k_scale): fp8_e4m3. An F8_E5M2 one
// has no kcheck contract and is refused.
var tritonMLAPrecision = Fix{Doc: "TRITON_MLA's declared precision: K (and V, its transpose) dequantized to q's dtype, P in V's dtype, a running max per 32 tokens", Apply: func(v *View) ([]string, error) {
	if v.T("attn_logits") == nil {
		return nil, nil
	}
	q, c := v.T("q"), v.T("kv_cache")
	if q == nil || c == nil {
		return nil, nil // the checker names the missing tensor
	}
	var notes []string
	if !v.Declared("kv_cache_dtype") {
		switch c.DType {
		case tensor.F8E4M3:
			v.SetParam("kv_cache_dtype", "fp8_e4m3")
			notes = append(notes, "kv_cache_dtype = fp8_e4m3 (an F8_E4M3 k_buffer: decode_attention_fwd's is_fp8 path, scaled by k_scale)")
		case tensor.F8E5M2:
			return nil, fmt.Errorf("tensor %skv_cache is F8_E5M2: an e5m2 cache has no kcheck contract", v.Prefix)
		}
	}
	if v.T("v_scale") != nil {
		v.Del("v_scale")
		notes = append(notes, "v_scale not read: with is_mla V is K's transpose, dequantized with k_scale (triton_decode_attention.py line 431)")
	}
	name := map[tensor.DType]string{tensor.BF16: "bf16", tensor.F16: "f16", tensor.F32: "f32"}
	qd, ok := name[q.DType]
	if !ok {
		return notes, nil // the checker refuses q's dtype
	}
	kind, _ := v.Param("kv_cache_dtype")
	pd := qd
	if cd, ok := name[c.DType]; ok && kind != "fp8_e4m3" {
		pd = cd
	}
	var set []string
	for _, d := range []struct{ key, val string }{{"kv_dequant_dtype", qd}, {"p_dtype", pd}, {"softmax_block", "32"}} {
		if !v.Declared(d.key) {
			v.SetParam(d.key, d.val)
			set = append(set, d.key+" = "+d.val)
		}
	}
	if len(set) > 0 {
		notes = append(notes, "TRITON_MLA's precision (triton_decode_attention.py lines 391-437, 505): "+strings.Join(set, ", "))
	}
	return append(notes, nanEmptyRows(v, "TRITON_MLA's stage 2 stores acc / e_sum, 0/0 for a row with no token (triton_decode_attention.py lines 599-601, 626-633)")...), nil
}}

// flashMLAScaleRead declares how FlashMLA's sparse decode read an
// fp8_ds_mla cache's F32 tile scales (ds_mla_scale_read), from the GPU the
// capture records (kcheck.capture.device_capability, which the capture hook
// writes), when the file does not declare it. FlashMLA@9241ae3 picks its
// sparse decode by architecture (csrc/api/sparse_decode.h:363-380): on sm90
// (Decode_Sm90_Impl) each scale is rounded to bf16 before a bf16 multiply
// (csrc/sm90/decode/sparse_fp8/splitkv_mla.cuh:550, components/dequant.h:
// 22-27); on sm100 (the head64 kernel, run twice for 128 heads at d_qk 576:
// sparse_decode.h:126-148) it is converted to E8M0 rounding toward zero
// (csrc/sm100/decode/head64/kernel.cuh:708-709). Any other architecture has
// no FlashMLA sparse decode, and a capture without the capability keeps
// the stored-F32 reading, each said in a note (audit F15).
var flashMLAScaleRead = Fix{Doc: "ds_mla_scale_read from the capture's device capability (sm90 bf16, sm100 e8m0_rz)", Apply: func(v *View) ([]string, error) {
	if kind, _ := v.Param("kv_cache_dtype"); kind != string(kvcache.FP8DSMLA) {
		return nil, nil
	}
	if _, set := v.Param("ds_mla_scale_read"); set {
		return nil, nil
	}
	cc, ok := v.Meta["kcheck.capture.device_capability"]
	if !ok {
		return []string{"ds_mla_scale_read not declared and the capture records no device capability: the tile scales are read as the stored F32, which FlashMLA does on no GPU (sm90 rounds them to bf16, sm100 to E8M0 toward zero): declare ds_mla_scale_read = bf16 or e8m0_rz"}, nil
	}
	major, _, _ := strings.Cut(strings.TrimSpace(cc), ".")
	read := map[string]string{"9": string(kvcache.ScaleReadBF16), "10": string(kvcache.ScaleReadE8M0RZ)}[major]
	if read == "" {
		return []string{fmt.Sprintf("ds_mla_scale_read not declared; device capability %s has no FlashMLA sparse decode (sm90 and sm100 only: sparse_decode.h:363-380), so the tile scales are read as the stored F32", cc)}, nil
	}
	v.SetParam("ds_mla_scale_read", read)
	return []string{fmt.Sprintf("ds_mla_scale_read = %s: FlashMLA's sparse decode on device capability %s reads the tile scales so", read, cc)}, nil
}}
