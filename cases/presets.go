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
