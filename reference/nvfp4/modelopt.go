package nvfp4

import (
	"encoding/json"
	"fmt"
	"path"
	"sort"
	"strings"

	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Weight is one NVFP4 linear layer of a ModelOpt ("unified HF") checkpoint:
// the tensors <prefix>.weight, .weight_scale, .weight_scale_2 and, for W4A4
// layers, .input_scale.
type Weight struct {
	// Name is the layer prefix, e.g. model.layers.3.mlp.down_proj.
	Name string
	// N output features (rows), K input features.
	N, K int
	// Packed is <prefix>.weight: U8 [N, K/2], E2M1 codes low nibble first.
	// It aliases the checkpoint's tensor data.
	Packed []uint8
	// Scales is <prefix>.weight_scale: E4M3 [N, K/16], linear (ModelOpt
	// stores it unswizzled; engines swizzle it at load time).
	Scales []uint8
	// Global is <prefix>.weight_scale_2, a dequant-kind scale (amax/2688).
	Global float64
	// InputScale is <prefix>.input_scale, the activations' dequant-kind
	// global scale (amax/2688 from calibration); HasInputScale is false for
	// weight-only layers. vLLM quantizes activations with 1/InputScale.
	InputScale    float64
	HasInputScale bool
}

// Matrix returns the weight as a Matrix (dequant-kind global).
func (w *Weight) Matrix() *Matrix {
	return &Matrix{Rows: w.N, K: w.K, Packed: w.Packed, Scales: w.Scales, Global: w.Global, Kind: Dequant}
}

// QuantConfig is the part of a ModelOpt quantization config that decides
// whether a layer is NVFP4: hf_quant_config.json's "quantization" object, or
// config.json's "quantization_config".
type QuantConfig struct {
	QuantAlgo string `json:"quant_algo"`
	GroupSize *int   `json:"group_size"`
	// ExcludeModules (ModelOpt) and Ignore (newer exports) list module
	// names or fnmatch patterns left unquantized.
	ExcludeModules []string `json:"exclude_modules"`
	Ignore         []string `json:"ignore"`
	// QuantizedLayers is the per-layer table of MIXED_PRECISION exports.
	QuantizedLayers map[string]QuantConfig `json:"quantized_layers"`
}

// ParseQuantConfig reads hf_quant_config.json ({"quantization": {...}}),
// config.json ({"quantization_config": {...}}) or the bare section.
func ParseQuantConfig(b []byte) (*QuantConfig, error) {
	var wrap struct {
		Quantization       *QuantConfig `json:"quantization"`
		QuantizationConfig *QuantConfig `json:"quantization_config"`
	}
	if err := json.Unmarshal(b, &wrap); err != nil {
		return nil, fmt.Errorf("quantization config: %v", err)
	}
	switch {
	case wrap.Quantization != nil:
		return wrap.Quantization, nil
	case wrap.QuantizationConfig != nil:
		return wrap.QuantizationConfig, nil
	}
	var c QuantConfig
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("quantization config: %v", err)
	}
	if c.QuantAlgo == "" {
		return nil, fmt.Errorf("quantization config has no quant_algo (neither under \"quantization\" nor \"quantization_config\")")
	}
	return &c, nil
}

// CheckLayer returns an error unless the config makes layer an NVFP4 layer
// with 16-element groups.
func (c *QuantConfig) CheckLayer(layer string) error {
	for _, p := range append(append([]string(nil), c.ExcludeModules...), c.Ignore...) {
		if moduleMatches(p, layer) {
			return fmt.Errorf("layer %s is excluded from quantization (pattern %q)", layer, p)
		}
	}
	algo, group := c.QuantAlgo, c.GroupSize
	if strings.EqualFold(algo, "MIXED_PRECISION") {
		key := ""
		for k := range c.QuantizedLayers {
			if (layer == k || strings.HasPrefix(layer, k+".")) && len(k) > len(key) {
				key = k
			}
		}
		if key == "" {
			return fmt.Errorf("layer %s is not in the config's quantized_layers", layer)
		}
		algo, group = c.QuantizedLayers[key].QuantAlgo, c.QuantizedLayers[key].GroupSize
	}
	if !strings.EqualFold(algo, "NVFP4") {
		return fmt.Errorf("layer %s is quantized as %q, not NVFP4", layer, algo)
	}
	if group != nil && *group != BlockSize {
		return fmt.Errorf("layer %s has group_size %d; NVFP4 needs %d", layer, *group, BlockSize)
	}
	return nil
}

// moduleMatches reports whether a module name or fnmatch pattern covers
// layer: an exact or wildcard match, or layer lying inside that module.
func moduleMatches(pattern, layer string) bool {
	if ok, err := path.Match(pattern, layer); err == nil && ok {
		return true
	}
	return strings.HasPrefix(layer, pattern+".")
}

// LoadModelOptLayer reads layer prefix from a checkpoint shard's tensors
// (as a safetensors reader returns them; the data is aliased, not copied).
// quantConfig, when not nil, is the checkpoint's hf_quant_config.json (or
// config.json); a layer it does not declare NVFP4 with group size 16 is
// rejected.
func LoadModelOptLayer(tensors map[string]*tensor.Tensor, prefix string, quantConfig []byte) (*Weight, error) {
	if quantConfig != nil {
		c, err := ParseQuantConfig(quantConfig)
		if err != nil {
			return nil, err
		}
		if err := c.CheckLayer(prefix); err != nil {
			return nil, err
		}
	}
	get := func(suffix string, optional bool, dtypes ...tensor.DType) (*tensor.Tensor, error) {
		name := prefix + "." + suffix
		t, ok := tensors[name]
		if !ok {
			if optional {
				return nil, nil
			}
			return nil, fmt.Errorf("tensor %s is missing (%s)", name, nearbyNames(tensors, prefix))
		}
		if err := t.Check(); err != nil {
			return nil, fmt.Errorf("tensor %s: %v", name, err)
		}
		for _, d := range dtypes {
			if t.DType == d {
				return t, nil
			}
		}
		return nil, fmt.Errorf("tensor %s has dtype %s; an NVFP4 checkpoint stores it as %v", name, t.DType, dtypes)
	}
	scalar := func(t *tensor.Tensor, suffix string) (float64, error) {
		v, err := t.Scalar()
		if err != nil {
			return 0, fmt.Errorf("tensor %s.%s: %v", prefix, suffix, err)
		}
		return v, nil
	}
	wt, err := get("weight", false, tensor.U8)
	if err != nil {
		return nil, err
	}
	st, err := get("weight_scale", false, tensor.F8E4M3, tensor.U8)
	if err != nil {
		return nil, err
	}
	gt, err := get("weight_scale_2", false, tensor.F32, tensor.BF16, tensor.F16)
	if err != nil {
		return nil, err
	}
	it, err := get("input_scale", true, tensor.F32, tensor.BF16, tensor.F16)
	if err != nil {
		return nil, err
	}
	if len(wt.Shape) != 2 {
		return nil, fmt.Errorf("tensor %s.weight has shape %v; NVFP4 packs [N, K/2]", prefix, wt.Shape)
	}
	n, k := wt.Shape[0], 2*wt.Shape[1]
	if k%BlockSize != 0 {
		return nil, fmt.Errorf("tensor %s.weight has K = %d, not a multiple of %d", prefix, k, BlockSize)
	}
	if len(st.Shape) != 2 || st.Shape[0] != n || st.Shape[1] != k/BlockSize {
		return nil, fmt.Errorf("tensor %s.weight_scale has shape %v; weight [%d, %d] (K = %d) needs [%d, %d]",
			prefix, st.Shape, n, k/2, k, n, k/BlockSize)
	}
	w := &Weight{Name: prefix, N: n, K: k, Packed: wt.Data, Scales: st.Data}
	if w.Global, err = scalar(gt, "weight_scale_2"); err != nil {
		return nil, err
	}
	if it != nil {
		if w.InputScale, err = scalar(it, "input_scale"); err != nil {
			return nil, err
		}
		w.HasInputScale = true
	}
	return w, nil
}

// nearbyNames lists the tensors under prefix, to make a missing-tensor
// error useful (a wrong prefix is the common mistake).
func nearbyNames(tensors map[string]*tensor.Tensor, prefix string) string {
	var names []string
	for n := range tensors {
		if strings.HasPrefix(n, prefix+".") {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return "no tensor starts with " + prefix + "."
	}
	sort.Strings(names)
	return "present: " + strings.Join(names, ", ")
}
