package engines

import (
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// TRITON_MLA's declared precision follows q's and the cache's dtypes
// (triton_decode_attention.py lines 391-437, 505), a capture's own keys
// win, and only a capture holding TRITON_MLA's attn_logits gets it. The
// corpus (fixtures/engines/corpus/vllm/triton_mla_fp8_bf16q,
// triton_mla_fp16) holds the kernel's own outputs judged at it.
func TestTritonMLAPrecision(t *testing.T) {
	for _, tc := range []struct {
		name   string
		q, c   tensor.DType
		meta   map[string]string
		logits bool
		want   map[string]string
		error  string
	}{
		{"bf16 model, fp8 cache", tensor.BF16, tensor.U8, map[string]string{"kv_cache_dtype": "fp8_e4m3"}, true,
			map[string]string{"kv_dequant_dtype": "bf16", "p_dtype": "bf16", "softmax_block": "32"}, ""},
		{"fp16 model, fp8 cache typed F8_E4M3", tensor.F16, tensor.F8E4M3, map[string]string{}, true,
			map[string]string{"kv_cache_dtype": "fp8_e4m3", "kv_dequant_dtype": "f16", "p_dtype": "f16"}, ""},
		{"fp16 model and cache", tensor.F16, tensor.F16, map[string]string{}, true,
			map[string]string{"kv_dequant_dtype": "f16", "p_dtype": "f16", "softmax_block": "32"}, ""},
		{"bf16 query over an fp16 cache: P in V's dtype", tensor.BF16, tensor.F16, map[string]string{}, true,
			map[string]string{"p_dtype": "f16"}, ""},
		{"declared keys win", tensor.BF16, tensor.BF16, map[string]string{"p_dtype": "f32", "softmax_block": "64"}, true,
			map[string]string{"p_dtype": "f32", "softmax_block": "64", "kv_dequant_dtype": "bf16"}, ""},
		{"no attn_logits: not TRITON_MLA's", tensor.F16, tensor.F16, map[string]string{}, false,
			map[string]string{"p_dtype": "", "softmax_block": ""}, ""},
		{"e5m2", tensor.BF16, tensor.F8E5M2, map[string]string{}, true, nil, "F8_E5M2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := map[string]*tensor.Tensor{"q": tensor.New(tc.q, 1, 1, 2, 576), "kv_cache": tensor.New(tc.c, 2, 4, 576),
				"v_scale": tensor.New(tensor.F32, 1)}
			if tc.logits {
				ts["attn_logits"] = tensor.New(tensor.F32, 1, 2, 1, 513)
			}
			v := &View{Kernel: "mla_decode", Meta: tc.meta, Tensors: ts}
			notes, err := tritonMLAPrecision.Apply(v)
			if tc.error != "" {
				if err == nil || !strings.Contains(err.Error(), tc.error) {
					t.Fatalf("error %v, want one saying %q", err, tc.error)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for k, want := range tc.want {
				if got := tc.meta[k]; got != want {
					t.Errorf("%s = %q, want %q (notes %q)", k, got, want, notes)
				}
			}
			if tc.logits && ts["v_scale"] != nil {
				t.Errorf("v_scale kept: with is_mla it is never read, and the contract has no V scale")
			}
		})
	}
}
