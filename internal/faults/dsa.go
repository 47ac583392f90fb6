package faults

import (
	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// The DSA lightning indexer (stage attn), DeepSeek-V3.2's token selector.

func init() {
	Register(&Fault{
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
		Trigger: &Trigger{Case: cases.Case{Name: "trigger/dsa_indexer", Kernel: "dsa_indexer", Preset: "glm-5", Heads: 8,
			SeqLens: []int{40, 70}, PageSize: 16, TopK: 16, Seed: 105}},
		NotSimulated: "the simulated decoder attends densely and runs no indexer; the trigger and the shipped example capture show this fault",
	})
}
