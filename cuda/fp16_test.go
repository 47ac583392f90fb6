//go:build cudaemu

package cuda

import (
	"errors"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// The CUDA kernels are bf16-only: an fp16 cache (kv_cache_dtype fp16, or
// auto over an F16 tensor), F16 tokens, an F16 query and F16/BF16 outputs
// the contract accepts are refused as unsupported, before any module is
// loaded or byte copied, never read as bf16 bits.
func TestF16Refused(t *testing.T) {
	f16 := func(shape ...int) *tensor.Tensor { return tensor.New(tensor.F16, shape...) }
	bf16 := func(shape ...int) *tensor.Tensor { return tensor.New(tensor.BF16, shape...) }
	idx := func(shape ...int) *tensor.Tensor { return tensor.New(tensor.I32, shape...) }
	write := func(cache, tok *tensor.Tensor, kind string) kernel.Inputs {
		return kernel.Inputs{Tensors: map[string]*tensor.Tensor{"kv_c": tok, "k_pe": tok, "slot_mapping": idx(1), "cache_before": cache},
			Params: kernel.Params{"kv_cache_dtype": kind}}
	}
	gather := kernel.Inputs{Tensors: map[string]*tensor.Tensor{"cache": f16(2, 16, 576), "block_table": idx(1, 1), "seq_lens": idx(1)},
		Params: kernel.Params{"kv_cache_dtype": "auto"}}
	mla := func(q, cache *tensor.Tensor, kind string) kernel.Inputs {
		return kernel.Inputs{Tensors: map[string]*tensor.Tensor{"q": q, "kv_cache": cache, "block_table": idx(1, 1), "seq_lens": idx(1)},
			Params: kernel.Params{"kv_cache_dtype": kind, "softmax_scale": "0.1"}}
	}
	for _, c := range []struct {
		name string
		run  func() (*Result, error)
		want string
	}{
		{"write into an fp16 cache", func() (*Result, error) {
			return runKVWrite(&Device{}, write(f16(2, 16, 576), bf16(1, 512), "fp16"), RunOptions{})
		}, "kv_cache_dtype fp16 (an F16 cache): the CUDA kernels are bf16-only"},
		{"write, auto over F16", func() (*Result, error) {
			return runKVWrite(&Device{}, write(f16(2, 16, 576), bf16(1, 512), "auto"), RunOptions{})
		}, "kv_cache_dtype auto (an F16 cache)"},
		{"write F16 tokens", func() (*Result, error) {
			return runKVWrite(&Device{}, write(bf16(2, 16, 576), f16(1, 512), "bf16"), RunOptions{})
		}, "tensor kv_c is F16; the CUDA cache writer reads bf16 tokens"},
		{"gather an fp16 cache", func() (*Result, error) { return runKVGather(&Device{}, gather, RunOptions{}) }, "kv_cache_dtype auto (an F16 cache)"},
		{"decode an F16 query", func() (*Result, error) {
			return runMLA(&Device{}, mla(f16(1, 1, 16, 576), bf16(2, 64, 576), "bf16"), RunOptions{}, false)
		}, "tensor q is F16; the CUDA MLA decode reads bf16 queries"},
		{"decode over an fp16 cache", func() (*Result, error) {
			return runMLA(&Device{}, mla(bf16(1, 1, 16, 576), f16(2, 64, 576), "fp16"), RunOptions{}, false)
		}, "kv_cache_dtype fp16 (an F16 cache)"},
		// DeepSeek-V4's caches have no CUDA kernel at all: unsupported too
		{"sparse decode over a DeepSeek-V4 cache", func() (*Result, error) {
			in := mla(bf16(1, 1, 64, 576), tensor.New(tensor.U8, 2, 64, 584), "fp8_ds_mla_model1") // a 512-wide q is refused before the cache
			in.Tensors["indices"] = idx(1, 1, 8)
			return runMLA(&Device{}, in, RunOptions{}, true)
		}, "kv_cache_dtype fp8_ds_mla_model1 (a DeepSeek-V4 sparse cache)"},
		{"write into a DeepSeek-V4.1 cache", func() (*Result, error) {
			return runKVWrite(&Device{}, write(tensor.New(tensor.U8, 2, 16, 528), bf16(1, 448), "fp8_ds_mla_v41"), RunOptions{})
		}, "kv_cache_dtype fp8_ds_mla_v41 (a DeepSeek-V4 sparse cache)"},
		{"lse in bf16", func() (*Result, error) {
			return runMLA(&Device{}, mla(bf16(1, 1, 16, 576), bf16(2, 64, 576), "bf16"), RunOptions{OutDTypes: map[string]tensor.DType{"lse": tensor.BF16}}, false)
		}, "output lse as BF16: the CUDA kernel writes [F32]"},
	} {
		_, err := c.run()
		var ue *UnsupportedError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an UnsupportedError containing %q", c.name, err, c.want)
		}
	}
}
