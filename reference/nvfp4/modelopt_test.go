package nvfp4

import (
	"context"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/tensor"
)

const layer = "model.layers.0.mlp.down_proj"

// shard builds the tensors of one NVFP4 layer with N = 2, K = 32:
// row 0 is codes 2 (1.0) then 7 (6.0) repeated, row 1 all code 9 (-0.5);
// scales 0x38 (1.0) and 0x40 (2.0) per row; weight_scale_2 = 0.25 ([] or
// [1] as scalarShape says); input_scale 0.5.
func shard(scalarShape []int) map[string]*tensor.Tensor {
	w := tensor.New(tensor.U8, 2, 16)
	for j := 0; j < 16; j++ {
		w.Data[j] = 0x72
		w.Data[16+j] = 0x99
	}
	s := tensor.New(tensor.F8E4M3, 2, 2)
	copy(s.Data, []uint8{0x38, 0x40, 0x38, 0x40})
	return map[string]*tensor.Tensor{
		layer + ".weight":                   w,
		layer + ".weight_scale":             s,
		layer + ".weight_scale_2":           tensor.FromFloat64s(tensor.F32, scalarShape, []float64{0.25}),
		layer + ".input_scale":              tensor.FromFloat64s(tensor.F32, scalarShape, []float64{0.5}),
		"model.layers.0.mlp.up_proj.weight": tensor.New(tensor.U8, 2, 16),
	}
}

func TestLoadModelOptLayer(t *testing.T) {
	for _, shape := range [][]int{{}, {1}} {
		w, err := LoadModelOptLayer(shard(shape), layer, []byte(`{"producer": {"name": "modelopt"},
			"quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": null, "group_size": 16, "exclude_modules": ["lm_head"]}}`))
		if err != nil {
			t.Fatal(err)
		}
		if w.N != 2 || w.K != 32 || w.Global != 0.25 || !w.HasInputScale || w.InputScale != 0.5 {
			t.Fatalf("scalar shape %v: got N %d K %d global %g input %g (%v)", shape, w.N, w.K, w.Global, w.InputScale, w.HasInputScale)
		}
		deq, err := Dequantize(context.Background(), w.Matrix())
		if err != nil {
			t.Fatal(err)
		}
		// Row 0, element 0: 1.0*1.0*0.25; element 1: 6*1*0.25 = 1.5;
		// element 16 (second block, scale 2): 1*2*0.25 = 0.5; element 17: 3.
		// Row 1, element 0: -0.5*1*0.25 = -0.125; element 16: -0.5*2*0.25 = -0.25.
		for _, tc := range []struct {
			i    int
			want float64
		}{{0, 0.25}, {1, 1.5}, {16, 0.5}, {17, 3}, {32, -0.125}, {48, -0.25}, {63, -0.25}} {
			if deq[tc.i] != tc.want {
				t.Errorf("dequantized[%d] = %g, want %g", tc.i, deq[tc.i], tc.want)
			}
		}
	}
	ts := shard(nil)
	delete(ts, layer+".input_scale")
	w, err := LoadModelOptLayer(ts, layer, nil)
	if err != nil || w.HasInputScale {
		t.Errorf("weight-only layer: %v, HasInputScale %v", err, w != nil && w.HasInputScale)
	}
}

func TestLoadModelOptLayerErrors(t *testing.T) {
	mod := func(f func(map[string]*tensor.Tensor)) map[string]*tensor.Tensor {
		ts := shard(nil)
		f(ts)
		return ts
	}
	nvfp4 := []byte(`{"quantization": {"quant_algo": "NVFP4", "group_size": 16}}`)
	tests := []struct {
		name    string
		tensors map[string]*tensor.Tensor
		prefix  string
		config  []byte
		want    string // a substring of the error
	}{
		{"missing scale", mod(func(ts map[string]*tensor.Tensor) { delete(ts, layer+".weight_scale") }), layer, nil,
			"tensor " + layer + ".weight_scale is missing"},
		{"wrong prefix", shard(nil), "model.layers.1.mlp.down_proj", nil, "no tensor starts with model.layers.1.mlp.down_proj."},
		{"bf16 weight", mod(func(ts map[string]*tensor.Tensor) { ts[layer+".weight"] = tensor.New(tensor.BF16, 2, 16) }), layer, nil,
			"tensor " + layer + ".weight has dtype BF16"},
		{"K not a multiple of 16", mod(func(ts map[string]*tensor.Tensor) {
			ts[layer+".weight"] = tensor.New(tensor.U8, 2, 20)
		}), layer, nil, "weight has K = 40, not a multiple of 16"},
		{"scale shape", mod(func(ts map[string]*tensor.Tensor) { ts[layer+".weight_scale"] = tensor.New(tensor.F8E4M3, 128, 4) }), layer, nil,
			"weight_scale has shape [128 4]; weight [2, 16] (K = 32) needs [2, 2]"},
		{"vector global", mod(func(ts map[string]*tensor.Tensor) { ts[layer+".weight_scale_2"] = tensor.New(tensor.F32, 2) }), layer, nil,
			"weight_scale_2: want a scalar"},
		{"truncated data", mod(func(ts map[string]*tensor.Tensor) { ts[layer+".weight"].Data = ts[layer+".weight"].Data[:5] }), layer, nil,
			"needs 32 bytes, has 5"},
		{"group size 32", shard(nil), layer, []byte(`{"quantization": {"quant_algo": "NVFP4", "group_size": 32}}`),
			"group_size 32; NVFP4 needs 16"},
		{"fp8 checkpoint", shard(nil), layer, []byte(`{"quantization": {"quant_algo": "FP8"}}`), `quantized as "FP8", not NVFP4`},
		{"excluded by wildcard", shard(nil), layer, []byte(`{"quantization": {"quant_algo": "NVFP4", "exclude_modules": ["model.layers.*.mlp.down_proj"]}}`),
			"excluded from quantization"},
		{"excluded parent module", shard(nil), layer, []byte(`{"quantization": {"quant_algo": "NVFP4", "ignore": ["model.layers.0"]}}`),
			"excluded from quantization"},
		{"mixed precision, layer absent", shard(nil), layer, []byte(`{"quantization": {"quant_algo": "MIXED_PRECISION",
			"quantized_layers": {"model.layers.0.self_attn.o_proj": {"quant_algo": "NVFP4", "group_size": 16}}}}`),
			"not in the config's quantized_layers"},
		{"mixed precision, fp8 layer", shard(nil), layer, []byte(`{"quantization_config": {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
			"quantized_layers": {"model.layers.0.mlp": {"quant_algo": "FP8"}}}}`), `quantized as "FP8"`},
		{"not json", shard(nil), layer, []byte(`{"quantization": `), "quantization config:"},
		{"no quant_algo", shard(nil), layer, []byte(`{"producer": {}}`), "has no quant_algo"},
	}
	for _, tc := range tests {
		_, err := LoadModelOptLayer(tc.tensors, tc.prefix, tc.config)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want it to contain %q", tc.name, err, tc.want)
		}
	}
	// Accepted configs: the bare section, config.json's form, and a mixed
	// precision table naming the layer's parent module.
	for _, cfg := range []string{
		`{"quant_algo": "NVFP4", "group_size": 16}`,
		`{"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}`,
		`{"quantization": {"quant_algo": "MIXED_PRECISION", "quantized_layers": {"model.layers.0.mlp": {"quant_algo": "NVFP4", "group_size": 16}}}}`,
		string(nvfp4),
	} {
		if _, err := LoadModelOptLayer(shard(nil), layer, []byte(cfg)); err != nil {
			t.Errorf("config %s: %v", cfg, err)
		}
	}
}
