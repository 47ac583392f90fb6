package check

import (
	"github.com/kcheck-dev/kcheck/internal/evidence"
	"path/filepath"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/engines"
)

// engineNames are the tensor names the engines' adapters rename and
// re-lay (internal/engines), for FuzzEngines' rename mutation.
var engineNames = []string{"block_scale_a", "block_scale_b", "block_tables", "cache_seqlens", "ckv_cache", "cu_seq_lens",
	"dst", "input", "input_global_scale", "k_cache", "kpe_cache", "kv_c_and_k_pe_cache", "kv_cache_after", "kv_cache_before",
	"kv_cache_in", "kv_cache_out", "kv_indices", "kv_indptr", "kv_len_arr", "output", "output_lse", "output_scale",
	"prefix_lse", "prefix_output", "q_nope", "q_pe", "qo_indptr", "s", "s_merged", "scale", "seq_starts", "sf", "softmax_lse",
	"src_cache", "suffix_lse", "suffix_output", "tensor_fp4", "tensor_sf", "v", "v_merged", "x_q", "a", "b", "alpha",
	// the Blackwell MLA calls and vLLM's copy gathers
	"query", "page_table", "kv_len", "workspace_starts", "attn_logits", "bmm1_scale", "ckv_scale_arr", "host_row_ids"}

var engineParams = []string{"sm_scale", "is_fp8_kvcache", "kv_cache_dtype", "scale", "alpha",
	"bmm1_scale", "bmm2_scale", "kv_lora_rank", "backend", "return_lse_base", "batch_size", "num_kv_splits"}

// FuzzEngines is FuzzKernel through an engine's conventions (`kcheck check
// --from vllm|sglang|flashinfer|flashmla`): the adapters rename tensors and
// move their data into the contract's layouts (FlashMLA's [NB, P, 1, D]
// cache, FlashInfer's page lists and split q, lse permutations) from shapes
// the capture declares, so the mutations here also rename tensors to the
// engines' names and set the engines' parameters. Same invariants.
//
//	go test -run='^$' -fuzz='^FuzzEngines$' -fuzztime=10m -parallel 1 ./internal/check
func FuzzEngines(f *testing.F) {
	paths, err := filepath.Glob("../../fixtures/golden/*.safetensors")
	if err != nil || len(paths) == 0 {
		f.Fatalf("no golden fixtures: %v", err)
	}
	bases := make([]evidence.Capture, len(paths))
	for i, p := range paths {
		bases[i] = loadCapture(f, p)
	}
	names := engines.Names()
	for i := range bases {
		for e := range names {
			f.Add(encodeSeed(byte(e), byte(i)))
			f.Add(encodeSeed(byte(e), byte(i), 10, 0, 7)) // a tensor renamed to an engine's name
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &fuzzBytes{b: data}
		e, err := engines.Lookup(names[r.intn(len(names))])
		if err != nil {
			t.Fatal(err)
		}
		c := cloneCapture(bases[r.intn(len(bases))])
		for steps := 0; r.more() && steps < 12; steps++ {
			switch op := r.intn(13); {
			case op < 7:
				mutateTensors(&c, r, op)
			case op < 9:
				mutateMeta(&c, r, "")
			case op == 9:
				c.Metadata[engineParams[r.intn(len(engineParams))]] = paramValues[r.intn(len(paramValues))]
			case op == 10: // rename a tensor to an engine's name
				ns := sortedNames(c.Tensors)
				if len(ns) > 0 {
					n := ns[r.intn(len(ns))]
					c.Tensors[engineNames[r.intn(len(engineNames))]] = c.Tensors[n]
					delete(c.Tensors, n)
				}
			case op == 11:
				delete(c.Metadata, "kcheck.kernel") // the adapter identifies the kernel from names
			case op == 12:
				c.Metadata["kcheck.kernel"] = kernelNamesForFuzz[r.intn(len(kernelNamesForFuzz))]
			}
		}
		if estimateOps(c) > maxFuzzOps {
			return
		}
		checkInvariantsWith(t, c, Options{MaxMemory: fuzzMaxMemory, Conventions: e.Conventions(), Adapt: e.Adapt})
	})
}
