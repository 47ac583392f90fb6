// Package cases is the case catalog: model presets (reference/CONTRACTS.md §6), the
// shapes, cache dtypes, page sizes and context lengths worth running, and the
// deterministic input generator that turns a case into contract tensors. The
// catalog is data (catalog.json, embedded); user case files in the same
// format are read with Load.
package cases

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/kcheck-dev/kcheck/internal/suggest"
)

// Preset is a model's attention geometry (reference/CONTRACTS.md §6).
type Preset struct {
	Name         string
	Heads        int // full query heads
	Latent       int // L
	Rope         int // R
	SoftmaxScale float64
	TopK         int // DSA top-k, 0 when the model has no sparse attention
	Note         string
}

// yarnScale is qk_head_dim^-0.5 · mscale², mscale = 0.1·ln(factor) + 1, as
// the engines pass it for DeepSeek-style yarn rope.
func yarnScale(qkHeadDim, factor float64) float64 {
	m := 0.1*math.Log(factor) + 1
	return math.Pow(qkHeadDim, -0.5) * m * m
}

// Presets are the models of reference/CONTRACTS.md §6.
var Presets = map[string]Preset{
	"deepseek-v3": {Name: "deepseek-v3", Heads: 128, Latent: 512, Rope: 64, SoftmaxScale: yarnScale(192, 40), Note: "yarn factor 40"},
	"kimi-k2":     {Name: "kimi-k2", Heads: 64, Latent: 512, Rope: 64, SoftmaxScale: yarnScale(192, 64), Note: "yarn factor 64 (K2-0905 config)"},
	"glm-5":       {Name: "glm-5", Heads: 64, Latent: 512, Rope: 64, SoftmaxScale: math.Pow(256, -0.5), TopK: 2048, Note: "qk_nope 192, v 256, DSA top-k 2048"},
	// DeepSeek-V4(-Flash): 64 query heads over one shared 512-dim KV head
	// (MQA), head_dim 512 of which qk_rope 64, an indexer of 64 heads x 128
	// picking 512 tokens (NVIDIA-NeMo/Automodel@6c7ad719
	// nemo_automodel/components/models/deepseek_v4/config.py,
	// DeepseekV4Config's defaults num_attention_heads 64, head_dim 512,
	// qk_rope_head_dim 64, index_n_heads 64, index_head_dim 128, index_topk
	// 512; vllm 0.33.0 vllm/models/deepseek_v4/attention.py:217-224 reads
	// the same keys, :962-964 the indexer's "# 64", "# 128"). The softmax
	// scale is head_dim^-0.5, no yarn mscale (attention.py:244
	// `self.scale = self.head_dim**-0.5`). L is the NoPE part, 512 - 64 =
	// 448 (attention.py:224), which the fp8_ds_mla_model1 cache quantizes;
	// the value is the whole 512-dim row (head_dim_v 512, reference/mla
	// Config.ValueDims), which the catalog's V4 cases declare. The scale is
	// written sqrt(2)/32, the correctly rounded 2^-4.5 that Python's
	// 512**-0.5 gives (0.04419417382415922); Go's math.Pow(512, -0.5) is an
	// ulp below it.
	"deepseek-v4": {Name: "deepseek-v4", Heads: 64, Latent: 448, Rope: 64, SoftmaxScale: math.Sqrt2 / 32, TopK: 512,
		Note: "MQA head_dim 512 (448 NoPE + 64 RoPE), V = the whole 512-dim row, indexer 64 x 128, DSA top-k 512"},
}

// PresetNames lists the presets, sorted.
func PresetNames() []string {
	var n []string
	for k := range Presets {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// LookupPreset returns the named preset.
func LookupPreset(name string) (Preset, error) {
	p, ok := Presets[name]
	if !ok {
		return Preset{}, fmt.Errorf("unknown preset %q%s (known: %s)", name, suggest.DidYouMean(name, PresetNames()), strings.Join(PresetNames(), ", "))
	}
	return p, nil
}

// HeadsFor returns the query heads one GPU holds under tensor parallelism tp.
func (p Preset) HeadsFor(tp int) (int, error) {
	if tp <= 0 || p.Heads%tp != 0 {
		return 0, fmt.Errorf("preset %s: tp = %d does not divide its %d heads", p.Name, tp, p.Heads)
	}
	return p.Heads / tp, nil
}
