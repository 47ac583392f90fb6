package mla

import (
	"math"
	"math/rand/v2"
	"testing"

	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/kernel/kerneltest"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// sparseInputs is mlaInputs' query and cache read by slot: 16 slots,
// topk 3.
func sparseInputs() Inputs {
	in := mlaInputs(rand.New(rand.NewPCG(9, 9)), []int{5, 0}, 1, 2, 12, 4, 4)
	return Inputs{Tensors: map[string]*tensor.Tensor{
		"q": in.Tensors["q"], "kv_cache": in.Tensors["kv_cache"],
		"indices": tensor.FromInt64s(tensor.I32, []int{2, 1, 3}, []int64{0, 5, -1, 3, 16, 2}),
	}, Params: in.Params}
}

// TestDecodeValidate: every shape, value and parameter check of
// mla_decode is Validate's, the split count's included.
func TestDecodeValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(*Inputs)
		want string
	}{
		{"q rank", func(in *Inputs) { in.Tensors["q"] = tensor.New(tensor.BF16, 2, 2, 16) }, "tensor q has shape [2 2 16]; the contract wants [*, *, *, *]"},
		{"cache rank", func(in *Inputs) { in.Tensors["kv_cache"] = tensor.New(tensor.BF16, 6, 64) }, "tensor kv_cache has shape [6 64]; the contract wants [NB, P, entry]"},
		{"q D differs", func(in *Inputs) { in.Tensors["q"] = tensor.New(tensor.BF16, 2, 1, 2, 15) }, "tensor q has D = 15 but tensor kv_cache rows hold 16 values (shape [6 4 16])"},
		{"latent_dim", func(in *Inputs) { in.Params["latent_dim"] = "17" }, "parameter latent_dim = 17: want 1 <= L <= D = 16"},
		{"no k_scale", func(in *Inputs) {
			in.Params["kv_cache_dtype"] = "fp8_e4m3"
			in.Tensors["kv_cache"] = tensor.New(tensor.U8, 6, 4, 16)
		}, "tensor k_scale is missing (the contract needs it) (kv_cache_dtype fp8_e4m3 divides by it)"},
		{"no softmax_scale", func(in *Inputs) { delete(in.Params, "softmax_scale") }, "parameter softmax_scale is missing (it has no default): the engines pass qk_head_dim^-0.5·mscale², 0.1352337788608801 for DeepSeek-V3"},
		{"softmax_scale inf", func(in *Inputs) { in.Params["softmax_scale"] = "inf" }, "parameter softmax_scale = +Inf: want a finite number"},
		{"causal", func(in *Inputs) { in.Params["causal"] = "yes" }, `parameter causal = "yes": want true or false`},
		{"empty_row", func(in *Inputs) { in.Params["empty_row"] = "one" }, `parameter empty_row = "one": want zero or nan`},
		{"block outside", func(in *Inputs) { in.Tensors["block_table"].SetInt64(1, 99) }, "block_table[0,1] = 99 is outside the cache (NB = 6); request 0 uses 2 blocks for seq_lens[0] = 5"},
		{"q B differs", func(in *Inputs) { in.Tensors["q"] = tensor.New(tensor.BF16, 3, 1, 2, 16) }, "tensor q has B = 3 requests but seq_lens has 2"},
		{"num_splits negative", func(in *Inputs) { in.Params["num_splits"] = "-1" }, "parameter num_splits = -1: want a positive split count"},
		{"num_splits disagrees", func(in *Inputs) {
			in.Params["num_splits"] = "3"
			in.Tensors["split_bounds"] = tensor.FromInt64s(tensor.I32, []int{2, 3}, []int64{0, 2, 5, 0, 0, 0})
		}, "parameter num_splits = 3 but tensor split_bounds has S+1 = 3 columns: they must give one split count S"},
		{"captured partials disagree", func(in *Inputs) {
			in.Params["num_splits"] = "3"
			in.OutputShapes = map[string][]int{"partial_lse": {2, 1, 2, 2}}
		}, "parameter num_splits = 3 but tensor partial_lse has S = 2 splits (shape [2 1 2 2]): they must give one split count S"},
	} {
		in := mlaInputs(rand.New(rand.NewPCG(9, 9)), []int{5, 0}, 1, 2, 12, 4, 6)
		c.edit(&in)
		kerneltest.RefusedByValidate(t, "mla_decode", c.name, in, c.want)
	}
}

// TestSparseValidate: every shape, value and parameter check of
// mla_decode_sparse is Validate's, FlashMLA's optional inputs' included.
func TestSparseValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(Inputs)
		want string
	}{
		{"indices shape", func(in Inputs) { in.Tensors["indices"] = tensor.New(tensor.I32, 2, 3) }, "tensor indices has shape [2 3]; the contract wants [2, 1, *]"},
		{"topk", func(in Inputs) { in.Params["topk"] = "7" }, "parameter topk = 7 but tensor indices has shape [2 1 3] (topk = 3)"},
		{"invalid_index", func(in Inputs) { in.Params["invalid_index"] = "any" }, `parameter invalid_index = "any": want one of outside, minus_one`},
		{"minus_one", func(in Inputs) { in.Params["invalid_index"] = "minus_one" }, "tensor indices[1,0,1] = 16 is outside the cache (16 slots) and not -1: with invalid_index = minus_one (FlashMLA's convention) only -1 is masked, and FlashMLA would read this slot out of bounds"},
		{"extra indices alone", func(in Inputs) { in.Tensors["extra_indices_in_kvcache"] = tensor.New(tensor.I32, 2, 1, 1) }, "tensor extra_indices_in_kvcache or extra_topk_length is present but extra_k_cache is not: FlashMLA refuses extra indices without their cache"},
		{"head_dim_v", func(in Inputs) { in.Params["head_dim_v"] = "17" }, "parameter head_dim_v = 17: the value is the first V columns of a cache row, want 1 <= V <= D = 16"},
		{"topk_length", func(in Inputs) { in.Tensors["topk_length"] = tensor.FromInt64s(tensor.I32, []int{2}, []int64{1, 4}) }, "tensor topk_length[1] = 4 is outside [0, topk = 3]"},
		{"attn_sink NaN", func(in Inputs) {
			in.Tensors["attn_sink"] = tensor.FromFloat64s(tensor.F32, []int{2}, []float64{0, math.NaN()})
		}, "tensor attn_sink[1] is NaN"},
		{"scale read", func(in Inputs) { in.Params["ds_mla_scale_read"] = "bf16" }, "parameter ds_mla_scale_read = bf16 reads fp8_ds_mla tile scales, but kv_cache_dtype = bf16 has none"},
	} {
		in := sparseInputs()
		c.edit(in)
		kerneltest.RefusedByValidate(t, "mla_decode_sparse", c.name, in, c.want)
	}
}
