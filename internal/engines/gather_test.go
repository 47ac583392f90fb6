package engines

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/evidence"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// gatherCall lays a contract-named gather capture out as vLLM calls its
// copy gathers (vllm 0.33.0 vllm/_custom_ops.py:3098-3145,
// vllm/model_executor/layers/attention/mla_attention.py:2994-3036):
// src_cache, dst, block_table, batch_size, and either cu_seq_lens
// (cp_gather_cache) or workspace_starts (cp_gather_and_upconvert_fp8_kv_cache,
// given a chunk's cu_seq_lens as vLLM does: B+1 entries). Neither call
// passes kv_cache_dtype.
func gatherCall(ts map[string]*tensor.Tensor, starts string) (map[string]string, map[string]*tensor.Tensor) {
	sl := ts["seq_lens"]
	cu := []int64{0}
	for i := 0; i < sl.Len(); i++ {
		cu = append(cu, cu[i]+sl.Int64At(i))
	}
	fm := map[string]string{"kcheck.format": "1", "kcheck.kernel": "kv_cache_gather", "batch_size": fmt.Sprint(sl.Len())}
	ft := map[string]*tensor.Tensor{"src_cache": ts["cache"], "dst": ts["gathered"], "block_table": ts["block_table"],
		starts: tensor.FromInt64s(tensor.I32, []int{len(cu)}, cu)}
	return fm, ft
}

// cp_gather_cache of a bf16 cache and cp_gather_and_upconvert_fp8_kv_cache
// of an fp8_ds_mla one check exactly as the contract-named gather of the
// same run, a planted error included (audit V7).
func TestVLLMCopyGathers(t *testing.T) {
	for _, tc := range []struct {
		name, kind, starts, note string
	}{
		{"cp_gather_cache bf16", "bf16", "cu_seq_lens", "cp_gather_cache's byte copy"},
		{"cp_gather_and_upconvert_fp8_kv_cache", "fp8_ds_mla", "workspace_starts", "seq_lens [5 17] from workspace_starts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cases.Case{Name: "g", Kernel: "kv_cache_gather", Preset: "deepseek-v3", SeqLens: []int{5, 17}, PageSize: 8,
				KVCacheDType: tc.kind, Seed: 3}
			meta, ts := capture(t, c, nil, "gathered", 600)
			want := mustFail(t, check.Run(t.Context(), evidence.Capture{Name: "contract", Metadata: meta, Tensors: ts}, check.Options{}))
			fm, ft := gatherCall(ts, tc.starts)
			got := check.Run(t.Context(), evidence.Capture{Name: "vllm", Metadata: fm, Tensors: ft}, fromOpts(t, "vllm"))
			if g, w := checksJSON(t, got), checksJSON(t, want); g != w {
				t.Fatalf("vLLM-named gather checks differently:\n got %s\nwant %s\nnotes %q", g, w, got.Notes)
			}
			wantNotes(t, got.Notes, tc.note)
		})
	}
}

// What the copy gathers do that kv_cache_gather does not model is refused
// with the input named.
func TestVLLMCopyGathersRefuse(t *testing.T) {
	c := cases.Case{Name: "g", Kernel: "kv_cache_gather", Preset: "deepseek-v3", SeqLens: []int{5, 17}, PageSize: 8, KVCacheDType: "fp8_ds_mla", Seed: 3}
	_, ds := capture(t, c, nil, "", 0)
	c.KVCacheDType = "fp8_e4m3"
	_, e4 := capture(t, c, nil, "", 0)
	for _, tc := range []struct {
		name   string
		ts     map[string]*tensor.Tensor
		starts string
		edit   func(fm map[string]string, ft map[string]*tensor.Tensor)
		error  string
	}{
		{"fp8 byte copy of the wrong width", e4, "cu_seq_lens", func(fm map[string]string, ft map[string]*tensor.Tensor) {
			ft["dst"] = tensor.New(tensor.U8, 22, 512)
		}, "dst must be [T, 576]"},
		{"offloaded rows", ds, "workspace_starts", func(fm map[string]string, ft map[string]*tensor.Tensor) {
			ft["host_row_ids"] = tensor.New(tensor.I32, 3)
		}, "tensor host_row_ids"},
		{"starts not at row 0", ds, "workspace_starts", func(fm map[string]string, ft map[string]*tensor.Tensor) {
			ft["workspace_starts"] = tensor.FromInt64s(tensor.I32, []int{2}, []int64{1, 6})
		}, "must start at row 0"},
		{"starts past dst", ds, "workspace_starts", func(fm map[string]string, ft map[string]*tensor.Tensor) {
			ft["workspace_starts"] = tensor.FromInt64s(tensor.I32, []int{2}, []int64{0, 40})
		}, "stay within dst's 22 rows"},
		{"not a 656-byte cache", e4, "workspace_starts", nil, "reads the fp8_ds_mla cache"},
		{"batch_size", ds, "workspace_starts", func(fm map[string]string, ft map[string]*tensor.Tensor) { fm["batch_size"] = "7" }, "batch_size = \"7\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fm, ft := gatherCall(tc.ts, tc.starts)
			if tc.edit != nil {
				tc.edit(fm, ft)
			}
			r := check.Run(t.Context(), evidence.Capture{Name: "vllm", Metadata: fm, Tensors: ft}, fromOpts(t, "vllm"))
			if r.Verdict != check.Error || r.Error == nil || !strings.Contains(*r.Error, tc.error) {
				t.Fatalf("verdict %s, error %v; want an error saying %q (notes %q)", r.Verdict, r.Error, tc.error, r.Notes)
			}
		})
	}
}

// cp_gather_cache over an fp8 cache copies each token's entry bytes into a
// U8 (or fp8-viewed) dst (vllm-project/vllm@00eb0c87
// csrc/libtorch_stable/cache_kernels.cu cp_gather_cache_page): read as
// kv_cache_gather's byte-copy answer and judged byte for byte. The expected
// dst is built here by an index loop over the block table, not by kcheck's
// gather; one flipped byte and two swapped rows must fail.
func TestVLLMByteCopyGather(t *testing.T) {
	for _, kind := range []string{"fp8_e4m3", "fp8_ds_mla"} {
		c := cases.Case{Name: "g", Kernel: "kv_cache_gather", Preset: "deepseek-v3", SeqLens: []int{5, 17}, PageSize: 8, KVCacheDType: kind, Seed: 3}
		_, ts := capture(t, c, nil, "", 0)
		cache, bt, sl := ts["cache"], ts["block_table"], ts["seq_lens"]
		p, entry := cache.Shape[1], cache.Shape[2]
		var dst []byte
		for b := 0; b < sl.Len(); b++ {
			for tk := 0; tk < int(sl.Int64At(b)); tk++ {
				blk := int(bt.Int64At(b*bt.Shape[1] + tk/p))
				at := (blk*p + tk%p) * entry
				dst = append(dst, cache.Data[at:at+entry]...)
			}
		}
		rowsN := len(dst) / entry
		for _, tc := range []struct {
			name  string
			dtype tensor.DType
			edit  func([]byte)
			want  compare.Verdict
		}{
			{"faithful", tensor.U8, nil, check.Pass},
			{"faithful, fp8 view", tensor.F8E4M3, nil, check.Pass},
			{"one byte flipped", tensor.U8, func(d []byte) { d[3*entry+7] ^= 0x10 }, check.Fail},
			{"rows 0 and 9 swapped", tensor.U8, func(d []byte) {
				r0, r9 := append([]byte(nil), d[:entry]...), append([]byte(nil), d[9*entry:10*entry]...)
				copy(d[:entry], r9)
				copy(d[9*entry:], r0)
			}, check.Fail},
		} {
			t.Run(kind+"/"+tc.name, func(t *testing.T) {
				d := append([]byte(nil), dst...)
				if tc.edit != nil {
					tc.edit(d)
				}
				fm, ft := gatherCall(ts, "cu_seq_lens")
				ft["dst"] = &tensor.Tensor{DType: tc.dtype, Shape: []int{rowsN, entry}, Data: d}
				r := check.Run(t.Context(), evidence.Capture{Name: "vllm", Metadata: fm, Tensors: ft}, fromOpts(t, "vllm"))
				if r.Verdict != tc.want {
					t.Fatalf("verdict %s, want %s (error %v, notes %q)", r.Verdict, tc.want, r.Error, r.Notes)
				}
				if n := r.Checks[0].Metrics.OverTol; tc.name == "one byte flipped" && n != 1 {
					t.Errorf("one flipped byte: %d elements over tolerance, want 1", n)
				}
			})
		}
	}
}
