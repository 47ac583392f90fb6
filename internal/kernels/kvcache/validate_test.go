package kvcache

import (
	"context"
	"testing"

	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/kernel/kerneltest"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// TestWriteValidate: every shape, value and parameter check of
// kv_cache_write is Validate's, each naming the tensor and index.
func TestWriteValidate(t *testing.T) {
	base := func() Inputs {
		return writeInputs("fp8_e4m3", "", tensor.New(tensor.U8, 2, 4, 66), []float64{1, 2}, 2, []int64{3}, 1)
	}
	for _, c := range []struct {
		name string
		edit func(Inputs)
		want string
	}{
		{"kv_c rank", func(in Inputs) { in.Tensors["kv_c"] = tensor.New(tensor.BF16, 2) }, "tensor kv_c has shape [2]; the contract wants [*, *]"},
		{"k_pe rank", func(in Inputs) { in.Tensors["k_pe"] = tensor.New(tensor.BF16, 1, 2, 64) }, "tensor k_pe has shape [1 2 64]; the contract wants [*, *]"},
		{"slot_mapping rank", func(in Inputs) { in.Tensors["slot_mapping"] = tensor.New(tensor.I64, 1, 1) }, "tensor slot_mapping has shape [1 1]; the contract wants [*]"},
		{"bad kind", func(in Inputs) { in.Params["kv_cache_dtype"] = "fp8" }, `parameter kv_cache_dtype = "fp8": want one of bf16, fp16, fp8_e4m3, fp8_ds_mla, fp8_ds_mla_model1, fp8_ds_mla_v41, auto`},
		{"no k_scale", func(in Inputs) { delete(in.Tensors, "k_scale") }, "tensor k_scale is missing (the contract needs it) (kv_cache_dtype fp8_e4m3 divides by it)"},
		{"slot outside", func(in Inputs) { in.Tensors["slot_mapping"].SetInt64(0, 9) }, "slot_mapping[0] = 9 is outside the cache (NB*P = 2*4 = 8)"},
		{"slots past the tokens", func(in Inputs) {
			in.Tensors["slot_mapping"] = tensor.FromInt64s(tensor.I64, []int{2}, []int64{0, 1})
		}, "tensor slot_mapping has 2 tokens but kv_c has only 1 rows"},
		{"bad fp8_saturate", func(in Inputs) { in.Params["fp8_saturate"] = "maybe" }, `parameter fp8_saturate = "maybe": want true or false`},
	} {
		in := base()
		c.edit(in)
		kerneltest.RefusedByValidate(t, "kv_cache_write", c.name, in, c.want)
	}
}

// TestGatherValidate: kv_cache_gather's checks common to both readings are
// Validate's; those of one reading are reported by it (Dequant, ByteCopy)
// and by Reference for the output dtype that asks for it.
func TestGatherValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(Inputs)
		want string
	}{
		{"cache rank", func(in Inputs) { in.Tensors["cache"] = tensor.New(tensor.BF16, 6, 8) }, "tensor cache has shape [6 8]; the contract wants [NB, P, entry]"},
		{"bad kind", func(in Inputs) { in.Params["kv_cache_dtype"] = "int4" }, `parameter kv_cache_dtype = "int4": want one of bf16, fp16, fp8_e4m3, fp8_ds_mla, fp8_ds_mla_model1, fp8_ds_mla_v41, auto`},
		{"seq_starts unaligned", func(in Inputs) {
			in.Tensors["seq_starts"] = tensor.FromInt64s(tensor.I32, []int{2}, []int64{1, 0})
		}, "seq_starts[0] = 1 is not a multiple of page_size 2: vLLM's gather reads a chunk from block seq_starts/page_size on, so chunk starts are block-aligned (vllm/model_executor/layers/attention/mla_attention.py)"},
		{"DeepSeek-V4 cache", func(in Inputs) {
			in.Params["kv_cache_dtype"] = "fp8_ds_mla_model1"
			in.Tensors["cache"] = tensor.New(tensor.U8, 6, 2, 584)
		}, "kernel kv_cache_gather does not read kv_cache_dtype fp8_ds_mla_model1 (a DeepSeek-V4 sparse cache): of the readers only mla_decode_sparse does, as only FlashMLA's sparse decode reads that layout"},
	} {
		in := chunkedInputs(nil)
		c.edit(in)
		kerneltest.RefusedByValidate(t, "kv_cache_gather", c.name, in, c.want)
	}

	g, _ := Lookup("kv_cache_gather")
	// A block table both readings read is refused by Validate.
	for _, c := range []struct {
		name string
		edit func(Inputs)
		want string
	}{
		{"block outside", func(in Inputs) { in.Tensors["block_table"].SetInt64(1, 9) },
			"block_table[0,1] = 9 is outside the cache (NB = 6); request 0 uses 2 blocks for seq_lens[0] = 3"},
		{"seq_lens rows", func(in Inputs) { in.Tensors["seq_lens"] = tensor.FromInt64s(tensor.I32, []int{1}, []int64{1}) },
			"tensor seq_lens has 1 entries but block_table has 2 rows (one per request)"},
	} {
		in := chunkedInputs(nil)
		c.edit(in)
		kerneltest.RefusedByValidate(t, "kv_cache_gather", c.name, in, c.want)
	}

	// An fp8 cache without k_scale: the dequantizing reading has none, the
	// byte copy reads no scale.
	in := chunkedInputs(nil)
	in.Params["kv_cache_dtype"] = "fp8_e4m3"
	in.Tensors["cache"] = tensor.New(tensor.U8, 6, 2, 4)
	p, err := Validate(g, in)
	if err != nil {
		t.Fatal(err)
	}
	gp := p.(*GatherProblem)
	const noScale = "tensor k_scale is missing (the contract needs it) (kv_cache_dtype fp8_e4m3 divides by it)"
	if _, err := gp.Dequant(); err == nil || err.Error() != noScale {
		t.Errorf("Dequant without k_scale: %v, want %q", err, noScale)
	}
	if _, err := gp.ByteCopy(); err != nil {
		t.Errorf("ByteCopy without k_scale: %v, want none", err)
	}
	if _, err := g.Reference(context.Background(), p, DefaultPrecision(), OutDTypes{"gathered": tensor.BF16}); err == nil || err.Error() != noScale {
		t.Errorf("Reference to BF16 without k_scale: %v, want %q", err, noScale)
	}
	if _, err := g.Reference(context.Background(), p, DefaultPrecision(), OutDTypes{"gathered": tensor.U8}); err != nil {
		t.Errorf("Reference to U8 without k_scale: %v, want none", err)
	}
}
