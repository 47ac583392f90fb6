package cli

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/safetensors"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// A capture saved with FlashMLA's own names (k_cache [NB, P, 1, D],
// cache_seqlens, softmax_lse; no lse_empty) checks with --from flashmla,
// and is unusable input without it.
func TestCheckFromEngine(t *testing.T) {
	f, err := safetensors.Open(fx + "golden/mla_decode.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ts := map[string]*tensor.Tensor{}
	for name, v := range f.Tensors {
		switch name {
		case "kv_cache":
			name = "k_cache"
			v = &tensor.Tensor{DType: v.DType, Shape: []int{v.Shape[0], v.Shape[1], 1, v.Shape[2]}, Data: v.Data}
		case "seq_lens":
			name = "cache_seqlens"
		case "lse":
			name = "softmax_lse"
		}
		ts[name] = v
	}
	meta := map[string]string{}
	for k, v := range f.Metadata {
		if k != "lse_empty" && k != "lse_base" {
			meta[k] = v
		}
	}
	path := filepath.Join(t.TempDir(), "flashmla.safetensors")
	if err := safetensors.Write(path, meta, ts, safetensors.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	code, out, errs := run(t, "check", "--from", "flashmla", path)
	if code != ExitPass || !strings.Contains(out, "k_cache -> kv_cache") {
		t.Errorf("--from flashmla: exit %d\n%s\n%s", code, out, errs)
	}
	if code, out, _ := run(t, "check", path); code != ExitUsage || !strings.Contains(out, "kv_cache is missing") {
		t.Errorf("without --from: exit %d\n%s", code, out)
	}
	if code, _, errs := run(t, "check", "--from", "trtllm", path); code != ExitUsage || !strings.Contains(errs, "unknown engine") {
		t.Errorf("unknown engine: exit %d: %s", code, errs)
	}
}
