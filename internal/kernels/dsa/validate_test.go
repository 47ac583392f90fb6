package dsa

import (
	"context"
	"testing"

	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// TestValidate: every shape, value and parameter check of dsa_indexer is
// Validate's (reference/dsa's Prepare included): kernel.Validate alone
// refuses each input with exactly the message Evaluate gives.
func TestValidate(t *testing.T) {
	k, err := Lookup("dsa_indexer")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		edit func(Inputs)
		want string
	}{
		{"k_cache rank", func(in Inputs) { in.Tensors["k_cache"] = tensor.New(tensor.BF16, 4, 2) }, "tensor k_cache has shape [4 2]; the contract wants [*, *, *]"},
		{"page_size", func(in Inputs) { in.Params["page_size"] = "4" }, "parameter page_size = 4 but tensor k_cache holds 2 tokens a block (shape [2 2 2])"},
		{"next_n 0", func(in Inputs) { in.Params["next_n"] = "0" }, "parameter next_n = 0: want at least 1 query a request"},
		{"per-row lengths", func(in Inputs) {
			in.Tensors["seq_lens"] = tensor.FromInt64s(tensor.I32, []int{1, 3}, []int64{1, 2, 3})
		}, "tensor seq_lens is I32 [1 3]: per-row lengths are an integer [B, next_n = 1]"},
		{"block outside", func(in Inputs) { in.Tensors["block_table"].SetInt64(1, 7) }, "block_table[0,1] = 7 is outside the cache (NB = 2); request 0 uses 2 blocks for seq_lens[0] = 4"},
		{"no topk", func(in Inputs) { delete(in.Params, "topk") }, "parameter topk is missing or not positive (-1), and no topk_indices tensor gives it"},
		{"cache kind", func(in Inputs) { in.Params["k_cache_dtype"] = "fp16" }, "tensor k_cache has dtype BF16; k_cache_dtype fp16 stores F16"},
		{"topk_index", func(in Inputs) { in.Params["topk_index"] = "slot" }, `parameter topk_index = "slot": want one of request, global_slot`},
		{"k_scale_fmt without scales", func(in Inputs) { in.Params["k_scale_fmt"] = "amax" }, "parameter k_scale_fmt = amax declares how an fp8 indexer cache's scales were written, but k_cache_dtype = bf16 has no scales"},
		// reference/dsa's own checks, made by Validate through Prepare
		{"weights shape", func(in Inputs) { in.Tensors["weights"] = tensor.New(tensor.F32, 1, 3) }, "tensor weights has shape [1 3] and dtype F32; want F32 [1, 2] (q is [B·next_n, Hi, Dk] = [1 2 2])"},
		{"rows", func(in Inputs) {
			in.Tensors["q"] = tensor.New(tensor.BF16, 2, 2, 2)
			in.Tensors["weights"] = tensor.New(tensor.F32, 2, 2)
		},
			"tensor seq_lens has 1 entries but q has 2 rows (next_n = 1: one query a request; an MTP step declares next_n)"},
		{"max_seq", func(in Inputs) { in.Params["max_seq"] = "3" }, "seq_lens[0] = 4 exceeds the scores tensor's 3 columns"},
	} {
		in := dsaInputs()
		c.edit(in)
		if _, err := Validate(k, in); err == nil || err.Error() != c.want {
			t.Errorf("%s: Validate: %v, want %q", c.name, err, c.want)
		}
		if _, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil); err == nil || err.Error() != c.want {
			t.Errorf("%s: Evaluate: %v, want Validate's %q", c.name, err, c.want)
		}
	}
}
