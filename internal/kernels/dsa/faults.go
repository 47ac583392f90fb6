package dsa

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/faults"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// The DSA lightning indexer (stage attn), DeepSeek-V3.2's token selector.

func init() {
	faults.Register(&faults.Fault{
		Name: "indexer_weights_ignored", Stage: kernel.StageAttn, Kernels: []string{"dsa_indexer"},
		BugClass: "lightning-indexer head weights not applied (engines fold the softmax scale and per-head gates into them): every indexer head votes equally and top-k selects other tokens",
		Doc:      "The indexer sums relu(q_h·k_t) over heads without the per-head weights w_h, as a kernel that expects weights already folded into q would.",
		Inputs: func(in map[string]*tensor.Tensor, _ kernel.Params) (map[string]*tensor.Tensor, error) {
			if w, ok := in["weights"]; ok {
				ones := tensor.New(w.DType, w.Shape...)
				for i := 0; i < ones.Len(); i++ {
					ones.SetFloat64(i, 1)
				}
				in["weights"] = ones
			}
			return in, nil
		},
		Trigger: &faults.Trigger{Case: cases.Case{Name: "trigger/dsa_indexer", Kernel: "dsa_indexer", Preset: "glm-5", Heads: 8,
			SeqLens: []int{40, 70}, PageSize: 16, TopK: 16, Seed: 105}},
		NotSimulated: "the simulated decoder attends densely and runs no indexer; the trigger and the shipped example capture show this fault",
		Signatures: []faults.Expect{
			{Tensor: "scores", Pattern: "uniform", Why: "every head's weight is wrong, so every score is"},
		},
	})
	faults.Register(&faults.Fault{
		Name: "indexer_fp8_cache_interleaved", Stage: kernel.StageAttn, Kernels: []string{"dsa_indexer"},
		Needs:    "k_cache_dtype = fp8_e4m3 (vLLM's block-split indexer cache)",
		BugClass: "vLLM's fp8 indexer cache read as if each token's 128 codes and its scale were interleaved ([Dk+4] bytes a token, as the [NB, P, 1, 132] view suggests) instead of block-split (every code of the block, then every scale)",
		Doc: "The indexer reads token t's codes at t·132 of its block and its scale at t·132+128. Only token 0 of a block reads its own codes; " +
			"every other token reads a mix of codes and scale bytes, and every scale is four code bytes read as an F32.",
		Inputs: func(in map[string]*tensor.Tensor, p kernel.Params) (map[string]*tensor.Tensor, error) {
			kc, q := in["k_cache"], in["q"]
			if p.String("k_cache_dtype", "bf16") != "fp8_e4m3" || kc == nil || q == nil || len(kc.Shape) != 3 || len(q.Shape) != 3 {
				return in, nil
			}
			nb, pg, dk := kc.Shape[0], kc.Shape[1], q.Shape[2]
			if kc.Shape[2] != dk+4 {
				return in, nil
			}
			out := kc.Clone()
			block := pg * (dk + 4)
			for blk := 0; blk < nb; blk++ {
				src, dst := kc.Data[blk*block:(blk+1)*block], out.Data[blk*block:(blk+1)*block]
				for t := 0; t < pg; t++ {
					copy(dst[t*dk:(t+1)*dk], src[t*(dk+4):t*(dk+4)+dk])
					binary.LittleEndian.PutUint32(dst[pg*dk+4*t:], binary.LittleEndian.Uint32(src[t*(dk+4)+dk:]))
				}
			}
			in["k_cache"] = out
			return in, nil
		},
		Trigger: &faults.Trigger{Case: cases.Case{Name: "trigger/dsa_indexer/fp8", Kernel: "dsa_indexer", Preset: "glm-5", Heads: 8,
			SeqLens: []int{40, 70}, PageSize: 16, TopK: 16, Seed: 106, Params: map[string]string{"k_cache_dtype": "fp8_e4m3"}}},
		NotSimulated: "the simulated decoder attends densely and runs no indexer; the trigger shows this fault",
		Signatures: []faults.Expect{
			{Tensor: "scores", Pattern: "non_finite", Why: "every scale is four code bytes read as an F32: those with a high exponent overflow the score to inf"},
		},
	})
	faults.Register(&faults.Fault{
		Name: "indexer_causal_ignored", Stage: kernel.StageAttn, Kernels: []string{"dsa_indexer"},
		Needs:    "next_n > 1 (an MTP step's query rows) and a request with tokens after its first query's position",
		BugClass: "the lightning indexer's next_n causal limit dropped: in an MTP (speculative) decode step each query row sees the whole context, the draft tokens after its own position included, so top-k picks tokens the query must not see",
		Doc: "Every query row n of a request scores all seq_len tokens instead of the t < seq_len - next_n + n + 1 it may see " +
			"(vLLM's mask k < context_len and k <= q_offset), as a kernel handed one context length a request and no per-row limit would.",
		Outputs: causalIgnoredOutputs,
		Trigger: &faults.Trigger{Case: cases.Case{Name: "trigger/dsa_indexer/next_n", Kernel: "dsa_indexer", Preset: "glm-5", Heads: 8,
			SeqLens: []int{40, 70}, PageSize: 16, TopK: 16, Seed: 107, Params: map[string]string{"next_n": "3"}}},
		NotSimulated: "the simulated decoder attends densely and runs no indexer; the trigger shows this fault",
		Signatures: []faults.Expect{
			{Tensor: "scores", Pattern: "future_tokens_visible", Why: "finite scores where the row's causal limit wants -inf, each the score of a future token"},
			{Tensor: "topk_indices", Pattern: "future_tokens_visible", Why: "the rows' top-k hold future tokens"},
		},
	})
}

// causalIgnoredOutputs recomputes an MTP step's indexer with every query
// row a request of its own that sees its request's whole context: the
// block-table row and the seq_len of its request, next_n = 1.
func causalIgnoredOutputs(ctx context.Context, in kernel.Inputs, out map[string]*tensor.Tensor) error {
	n, err := in.Params.Int("next_n", 1)
	if err != nil || n <= 1 {
		return err
	}
	bt, sl := in.Tensors["block_table"], in.Tensors["seq_lens"]
	if bt == nil || sl == nil || len(bt.Shape) != 2 {
		return fmt.Errorf("tensors block_table and seq_lens missing or misshapen")
	}
	lens, table, mb := faults.Ints(sl), faults.Ints(bt), bt.Shape[1]
	if len(sl.Shape) == 2 { // per-row lengths: the request's context is its longest row's
		req := make([]int64, sl.Shape[0])
		for i, v := range lens {
			req[i/n] = max(req[i/n], v)
		}
		lens = req
	}
	var rowLens, rowTable []int64
	for r := 0; r < len(lens)*n; r++ {
		b := r / n
		rowLens = append(rowLens, lens[b])
		rowTable = append(rowTable, table[b*mb:(b+1)*mb]...)
	}
	ts := map[string]*tensor.Tensor{}
	for name, t := range in.Tensors {
		ts[name] = t
	}
	ts["seq_lens"] = tensor.FromInt64s(sl.DType, []int{len(rowLens)}, rowLens)
	ts["block_table"] = tensor.FromInt64s(bt.DType, []int{len(rowLens), mb}, rowTable)
	params := faults.CloneParams(in.Params)
	params["next_n"] = "1"
	res, err := faults.Reproduce(ctx, "dsa_indexer", in.Params, kernel.Inputs{Tensors: ts, Params: params}, out)
	if err != nil {
		return err
	}
	for name := range out {
		if r, ok := res[name]; ok {
			out[name] = r
		}
	}
	return nil
}
