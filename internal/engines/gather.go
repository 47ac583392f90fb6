package engines

import (
	"fmt"
	"strconv"

	"github.com/kcheck-dev/kcheck/reference/kvcache"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// vllmCopyGathers reads vLLM's two other context gathers as
// kv_cache_gather (audit V7), both at vllm-project/vllm@00eb0c87
// csrc/libtorch_stable/cache_kernels.cu and vllm 0.33.0
// vllm/_custom_ops.py:3098-3145:
//   - cp_gather_and_upconvert_fp8_kv_cache(src_cache, dst, block_table,
//     workspace_starts, batch_size, seq_starts, ...): the fp8_ds_mla cache
//     [NB, P, 656] gathered into a BF16 dst [T, 576], each token's 512
//     e4m3 values times their tile's F32 scale and the 64 bf16 rope values
//     copied (gather_and_upconvert_fp8_token); request b's rows are
//     workspace_starts[b] up to the next start, the last up to dst's
//     rows (map_gather_page_task<false>), so the lengths are the starts'
//     differences. vLLM passes a chunk's cu_seq_lens there
//     (vllm/model_executor/layers/attention/mla_attention.py:2994-3001),
//     whose extra last entry the kernel does not read. kv_cache_dtype is
//     fp8_ds_mla (the only layout it reads). vllm 0.33.0's host_cache,
//     host_row_ids and device_row_ids (rows remapped to an offloaded host
//     copy) are refused: not modelled;
//   - cp_gather_cache(src_cache, dst, block_table, cu_seq_lens, batch_size,
//     seq_starts): a byte copy, src and dst of one dtype
//     (cp_gather_cache_page). Of a bf16 or fp16 cache it is the contract's
//     gather of that cache bit for bit (kv_cache_dtype auto, the cache's own
//     dtype, a note says so). Of an fp8 cache it copies the codes into a
//     U8/F8 dst: kv_cache_gather's byte-copy answer (a U8 gathered, judged
//     bit for bit), dst viewed as U8 and the layout named by entry width.
//
// Both are recognised by what gather_and_maybe_dequant_cache always passes
// and they never do: kv_cache_dtype.
var vllmCopyGathers = Fix{Doc: "cp_gather_and_upconvert_fp8_kv_cache (workspace_starts) and cp_gather_cache (byte copy) read as kv_cache_gather", Apply: func(v *View) ([]string, error) {
	c, g := v.T("cache"), v.T("gathered")
	if c == nil || g == nil || v.Declared("kv_cache_dtype") {
		return nil, nil
	}
	if ws := v.T("workspace_starts"); ws != nil {
		return upconvertGather(v, c, g, ws)
	}
	if v.T("cu_seq_lens") == nil {
		return nil, nil
	}
	fp8 := func(d tensor.DType) bool { return d == tensor.U8 || d == tensor.F8E4M3 || d == tensor.F8E5M2 }
	if fp8(c.DType) && fp8(g.DType) {
		return byteCopyGather(v, c, g)
	}
	kind, err := cacheDTypeOf(c)
	if err != nil || c.DType != g.DType {
		return nil, nil // gather_and_maybe_dequant_cache recorded without its kv_cache_dtype: the checker's default and errors apply
	}
	if err := batchSizeAgrees(v, v.T("cu_seq_lens").Len()-1); err != nil {
		return nil, err
	}
	v.SetParam("kv_cache_dtype", "auto")
	return []string{fmt.Sprintf("no kv_cache_dtype and dst of src_cache's dtype (%s): cp_gather_cache's byte copy, the contract's gather of a %s cache bit for bit (kv_cache_dtype = auto)", c.DType, kind)}, nil
}}

// batchSizeAgrees checks the call's batch_size against the requests
// cu_seq_lens holds (cp_gather_cache asserts it, cache_kernels.cu).
func batchSizeAgrees(v *View, b int) error {
	s, ok := v.Param("batch_size")
	if !ok {
		return nil
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return fmt.Errorf("parameter batch_size = %q is not a count", s)
	}
	if n != b {
		return fmt.Errorf("parameter batch_size = %d, but the gather's tensors hold %d requests", n, b)
	}
	return nil
}

func upconvertGather(v *View, c, g, ws *tensor.Tensor) ([]string, error) {
	const call = "cp_gather_and_upconvert_fp8_kv_cache"
	for _, n := range []string{"host_cache", "host_row_ids", "device_row_ids"} {
		if t := v.T(n); t != nil && t.Len() > 0 {
			return nil, fmt.Errorf("tensor %s%s of %s: rows remapped to an offloaded host cache are not modelled", v.Prefix, n, call)
		}
	}
	if len(c.Shape) != 3 || c.Shape[2] != kvcache.DSEntryBytes {
		return nil, fmt.Errorf("tensor %scache (src_cache) has shape %v; %s reads the fp8_ds_mla cache [NB, P, %d]", v.Prefix, c.Shape, call, kvcache.DSEntryBytes)
	}
	if len(g.Shape) != 2 || g.DType != tensor.BF16 {
		return nil, fmt.Errorf("tensor %sgathered (dst) is %s %v; %s writes BF16 [T, 576]", v.Prefix, g.DType, g.Shape, call)
	}
	starts, err := ints(v.Prefix+"workspace_starts", ws)
	if err != nil {
		return nil, err
	}
	b := len(starts)
	if s, ok := v.Param("batch_size"); ok {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > len(starts) {
			return nil, fmt.Errorf("parameter batch_size = %q: want 1 to workspace_starts' %d entries", s, len(starts))
		}
		b = n
	} else if bt := v.T("block_table"); bt != nil && len(bt.Shape) == 2 && bt.Shape[0] < b {
		b = bt.Shape[0] // a chunk's cu_seq_lens passed as the starts: B+1 entries
	}
	if b < 1 || starts[0] != 0 {
		return nil, fmt.Errorf("tensor %sworkspace_starts = %v: the first request's rows must start at row 0 of dst (the contract's rows follow each other from 0)", v.Prefix, starts)
	}
	lens := make([]int64, b)
	for i := range lens {
		end := int64(g.Shape[0])
		if i+1 < b {
			end = starts[i+1]
		}
		if end < starts[i] || end > int64(g.Shape[0]) {
			return nil, fmt.Errorf("workspace_starts[%d] = %d and the next start %d: starts must not decrease and stay within dst's %d rows", i, starts[i], end, g.Shape[0])
		}
		lens[i] = end - starts[i]
	}
	v.Set("seq_lens", tensor.FromInt64s(tensor.I32, []int{b}, lens))
	v.Del("workspace_starts")
	v.SetParam("kv_cache_dtype", "fp8_ds_mla")
	return []string{fmt.Sprintf("%s: seq_lens %v from workspace_starts (each request's rows up to the next start, the last to dst's %d rows), kv_cache_dtype = fp8_ds_mla", call, lens, g.Shape[0])}, nil
}

// byteCopyGather reads cp_gather_cache over an fp8 cache as kv_cache_gather
// with a U8 gathered, the entries' bytes: dst (U8 or an fp8 view of the same
// bytes) is read as U8, and kv_cache_dtype is named by the entry width
// (656 bytes fp8_ds_mla, DeepSeek-V4's widths as their kinds, which the
// gather refuses by name, else fp8_e4m3). The bytes are compared as they
// are, so the kind only names the coordinates (latent, scale, rope), and an
// fp8_e5m2 cache's copy is judged the same way.
func byteCopyGather(v *View, c, g *tensor.Tensor) ([]string, error) {
	if err := batchSizeAgrees(v, v.T("cu_seq_lens").Len()-1); err != nil {
		return nil, err
	}
	if len(c.Shape) != 3 || len(g.Shape) != 2 || g.Shape[1] != c.Shape[2] {
		return nil, fmt.Errorf("tensors %scache (src_cache) %v and gathered (dst) %v: cp_gather_cache copies whole entries, so dst must be [T, %d]", v.Prefix, c.Shape, g.Shape, lastDim(c))
	}
	var notes []string
	if g.DType != tensor.U8 {
		v.Set("gathered", &tensor.Tensor{DType: tensor.U8, Shape: g.Shape, Data: g.Data})
		notes = append(notes, fmt.Sprintf("gathered (dst) %s read as its bytes (U8)", g.DType))
	}
	kind, ds := dsMLAKindOf(c.Shape[2])
	if !ds {
		kind = string(kvcache.FP8E4M3)
	}
	v.SetParam("kv_cache_dtype", kind)
	return append(notes, fmt.Sprintf("no kv_cache_dtype and an fp8 dst: cp_gather_cache's byte copy, judged byte for byte (kv_cache_dtype = %s by the %d-byte entry, naming the coordinates only)", kind, c.Shape[2])), nil
}

func lastDim(t *tensor.Tensor) int {
	if len(t.Shape) == 0 {
		return 0
	}
	return t.Shape[len(t.Shape)-1]
}
