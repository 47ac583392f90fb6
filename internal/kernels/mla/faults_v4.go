package mla

import (
	"context"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/faults"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/kvcache"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// DeepSeek-V4's sparse decode over its fp8_ds_mla_model1 cache: the two bugs
// a kernel or a port carried over from DeepSeek-V3.2 makes. A V3.2 kernel's
// entry is 656 bytes token by token with V = the 512 latent values; V4's is
// 584 bytes, block-split, with V = the whole 512-dim row (FlashMLA@9241ae3
// csrc/api/sparse_decode.h:288-298, tests/quant.py:55-62, tests/ref.py:90).

// v4SparseCase is a quick DeepSeek-V4 sparse decode: 64 heads (FlashMLA's
// sparse decode takes 64 or 128), pages of 16, two requests.
func v4SparseCase() cases.Case {
	return cases.Case{Name: "trigger/mla_decode_sparse/v4", Kernel: "mla_decode_sparse", Preset: "deepseek-v4",
		SeqLens: []int{37, 20}, PageSize: 16, KVCacheDType: string(kvcache.FP8DSMLAModel1), TopK: 16, Seed: 104,
		Params: map[string]string{"invalid_index": "minus_one"}}
}

func init() {
	faults.Register(&faults.Fault{
		Name: "model1_read_interleaved", Stage: kernel.StageAttn, Kernels: []string{"mla_decode_sparse"},
		Needs:    "a DeepSeek-V4 cache (kv_cache_dtype = fp8_ds_mla_model1) with pages of more than one token",
		BugClass: "DeepSeek-V4's block-split cache read token by token: entry s at bytes s*584 (the V3.2 656-byte layout's addressing), where FlashMLA stores a block's 576-byte data rows first and its 8-byte scale rows after",
		Doc: "The decode addresses slot s of the 584-byte cache as bytes [584s, 584s+584), data then scales, as a V3.2 " +
			"kernel widened to the new entry would. Only the first token of each block finds its own data (block " +
			"offset 0 is where both addressings agree), and its scales come from the next token's data bytes; every " +
			"other token reads a neighbour's data shifted by 8 bytes a slot and scales from data or scale rows.",
		// The kernel's view of the bytes: each slot's entry as the
		// interleaved reader finds it, rewritten where the correct reader
		// looks, so the reference reads what the buggy kernel reads.
		Inputs: func(in map[string]*tensor.Tensor, p kernel.Params) (map[string]*tensor.Tensor, error) {
			c, ok := in["kv_cache"]
			if !ok || p.String("kv_cache_dtype", "") != string(kvcache.FP8DSMLAModel1) || len(c.Shape) != 3 || c.Shape[2] != kvcache.M1EntryBytes {
				return in, nil
			}
			in["kv_cache"] = kvcache.ReadInterleaved(c)
			return in, nil
		},
		Trigger:      &faults.Trigger{Case: v4SparseCase()},
		NotSimulated: "the simulated decoder runs the dense decode over V3-shaped caches, which has no DeepSeek-V4 layout",
		Signatures: []faults.Expect{
			{Tensor: "out", Pattern: "block_split_read_interleaved", Why: "every row reads garbage, so no position shows it: the kernel's suspect (the decode over the cache read token by token) does"},
		},
	})
	faults.Register(&faults.Fault{
		Name: "model1_value_latent_only", Stage: kernel.StageAttn, Kernels: []string{"mla_decode_sparse"},
		Needs:    "a DeepSeek-V4 decode (kv_cache_dtype = fp8_ds_mla_model1 or fp8_ds_mla_v41, V = the whole 512-dim row)",
		BugClass: "DeepSeek-V4's value taken as the latent part only (V3.2's V = the first L dims): the 64 rope dims of each row left out of the PV product",
		Doc: "The kernel accumulates P·V over the 448 NoPE columns, as a V3.2 kernel does over its 512 latent ones, and " +
			"leaves out[..., 448:512] at zero: V4's one 512-dim row is key and value both (FlashMLA tests/ref.py:90, " +
			"gathered_kv[..., :d_v] with d_v = d_qk = 512).",
		Outputs: func(_ context.Context, in kernel.Inputs, out map[string]*tensor.Tensor) error {
			o, ok := out["out"]
			if !ok || !kvcache.Kind(in.Params.String("kv_cache_dtype", "")).V4() || len(o.Shape) != 4 || o.Shape[3] != kvcache.M1Nope+kvcache.M1Rope {
				return nil
			}
			r := o.Clone()
			v := o.Shape[3]
			for i := 0; i < r.Len(); i++ {
				if i%v >= kvcache.M1Nope {
					r.SetFloat64(i, 0)
				}
			}
			out["out"] = r
			return nil
		},
		Trigger:      &faults.Trigger{Case: v4SparseCase()},
		NotSimulated: "the simulated decoder runs the dense decode over V3-shaped caches, which has no DeepSeek-V4 layout",
		Signatures: []faults.Expect{
			{Tensor: "out", Pattern: "zeros", Why: "the rope columns 448..511 of out (part = rope) are left at zero"},
		},
	})
}
