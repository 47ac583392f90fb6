package kvcache

import (
	"encoding/json"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// fp8ScaleVectors is testdata/fp8_scale_dequant.json: every E4M3 code
// dequantized by torch the two ways FlashInfer's FP8 MLA kernels do
// (python/tests/gen_fp8_scale_vectors.py, testdata/README.md).
type fp8ScaleVectors struct {
	Cases []struct {
		Scale uint32   `json:"scale_f32_bits"`
		Mode  string   `json:"mode"`
		Bits  []uint16 `json:"bf16_bits"`
	} `json:"cases"`
}

// everyCode is a cache of one token whose L = 256 latent columns hold the
// 256 E4M3 codes in order and whose R = 64 rope columns hold codes 0x40 to
// 0x7F (the values 2 to 448 and NaN).
func everyCode(t *testing.T) (*tensor.Tensor, Layout) {
	t.Helper()
	lay, err := NewLayout(FP8E4M3, 256, 64, 1)
	if err != nil {
		t.Fatal(err)
	}
	ct := tensor.New(tensor.U8, 1, 1, 320)
	for i := 0; i < 256; i++ {
		ct.Data[i] = byte(i)
	}
	for i := 0; i < 64; i++ {
		ct.Data[256+i] = byte(0x40 + i)
	}
	return ct, lay
}

func sameValue(a, b float64) bool { return a == b || (math.IsNaN(a) && math.IsNaN(b)) }

// TestScalesAgainstTorch: the reader's bf16 dequantization equals torch's
// restatement of FlashInfer's two paths bit for bit, code by code: a
// per-tensor scale held in bf16 (ScaleDType BF16, FlashInfer's __hmul2),
// and a per-tile scale, whose fp32 product is rounded to bf16. The fp32
// per-tensor scale (FlashMLA's and vLLM's reader, NewNamed) equals the
// per-tile path, and the rope part is scaled by its own scale. Planting
// the bug (fillLUT taking the fp32 scale for BF16) fails every bf16_scale
// case whose scale is not a bf16 value.
func TestScalesAgainstTorch(t *testing.T) {
	b, err := os.ReadFile("testdata/fp8_scale_dequant.json")
	if err != nil {
		t.Fatal(err)
	}
	var v fp8ScaleVectors
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Cases) == 0 {
		t.Fatal("testdata/fp8_scale_dequant.json holds no cases")
	}
	ct, lay := everyCode(t)
	const ropeScale = 0.5 // a second scale, exact in bf16: the rope part must use it, not the latent one
	for _, c := range v.Cases {
		s := float64(math.Float32frombits(c.Scale))
		if len(c.Bits) != 256 {
			t.Fatalf("scale %v %s: %d codes, want 256", s, c.Mode, len(c.Bits))
		}
		var sc Scales
		switch c.Mode {
		case "bf16_scale":
			sc = Scales{Latent: s, Rope: ropeScale, ScaleDType: tensor.BF16}
		case "f32_product":
			sc = Scales{Tiles: []float32{float32(s), float32(s)}, Rope: ropeScale}
		default:
			t.Fatalf("unknown mode %q", c.Mode)
		}
		cache, err := NewScaled("kv_cache", ct, lay, sc)
		if err != nil {
			t.Fatal(err)
		}
		row := make([]float64, 320)
		cache.Row(0, 0, row, tensor.BF16)
		for code, w := range c.Bits {
			if want := float64(formats.BF16Decode(w)); !sameValue(row[code], want) {
				t.Errorf("scale %v (%s): code %#02x dequantizes to %v, torch %v", s, c.Mode, code, row[code], want)
			}
		}
		for j := 0; j < 64; j++ {
			want := formats.E4M3FN.Decode(byte(0x40+j)) * ropeScale
			if !sameValue(row[256+j], want) {
				t.Errorf("scale %v (%s): rope column %d is %v, want code %#02x times the rope scale %v = %v", s, c.Mode, j, row[256+j], 0x40+j, ropeScale, want)
			}
		}
		if c.Mode == "f32_product" {
			plain, err := NewNamed("kv_cache", ct, lay, s)
			if err != nil {
				t.Fatal(err)
			}
			pr := make([]float64, 320)
			plain.Row(0, 0, pr, tensor.BF16)
			for code := 0; code < 256; code++ {
				if !sameValue(pr[code], row[code]) {
					t.Errorf("scale %v: k_scale's reader gives code %#02x %v, the tile reader %v", s, code, pr[code], row[code])
				}
			}
		}
	}
}

// TestScalesExact: the exact answer multiplies by the scale the kernel
// holds (bf16(s) with ScaleDType BF16, the stored fp32 tile scale), so that
// a kernel that skips the bf16 rounding of its scale is measured against
// the one it was given.
func TestScalesExact(t *testing.T) {
	ct, lay := everyCode(t)
	const s = 1 + 3.0/512 // rounds up to 1 + 2^-7 in bf16
	for _, tc := range []struct {
		name  string
		sc    Scales
		scale float64
	}{
		{"bf16 scale", Scales{Latent: s, Rope: 1, ScaleDType: tensor.BF16}, 1 + 1.0/128},
		{"f32 scale", Scales{Latent: s, Rope: 1, ScaleDType: tensor.F32}, float64(float32(s))},
		{"tiles", Scales{Tiles: []float32{s, 2 * s}, Rope: 1, ScaleDType: tensor.BF16}, float64(float32(s))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewScaled("kv_cache", ct, lay, tc.sc)
			if err != nil {
				t.Fatal(err)
			}
			row := make([]float64, 320)
			c.Row(0, 0, row, tensor.F64)
			for code := 0; code < 256; code++ {
				want := formats.E4M3FN.Decode(byte(code)) * tc.scale
				if tc.sc.Tiles != nil && code >= ScaleTile {
					want *= 2 // the second tile's scale
				}
				if !sameValue(row[code], want) {
					t.Fatalf("code %#02x: exact %v, want %v", code, row[code], want)
				}
			}
		})
	}
}

// TestScalesTileIndex: latent column j of slot s is scaled by
// k_scale_tiles[s / P, s % P, j / 128], over a cache of 2 blocks of 3
// tokens whose tiles all hold distinct powers of two (so every product is
// exact and any other index shows). Planting an off-by-one tile
// (ts[t+1]) or a slot off by one fails it.
func TestScalesTileIndex(t *testing.T) {
	const nb, p, l, r = 2, 3, 256, 64
	lay, err := NewLayout(FP8E4M3, l, r, p)
	if err != nil {
		t.Fatal(err)
	}
	ct := tensor.New(tensor.U8, nb, p, l+r)
	for i := range ct.Data {
		ct.Data[i] = 0x38 // 1.0
	}
	nt := l / ScaleTile
	tiles := make([]float32, nb*p*nt)
	for i := range tiles {
		tiles[i] = float32(math.Ldexp(1, i-4))
	}
	c, err := NewScaled("kv_cache", ct, lay, Scales{Tiles: tiles, Rope: 0.25})
	if err != nil {
		t.Fatal(err)
	}
	row := make([]float64, l+r)
	for slot := 0; slot < nb*p; slot++ {
		c.Row(slot/p, slot%p, row, tensor.BF16)
		for j := 0; j < l+r; j++ {
			want := 0.25
			if j < l {
				want = float64(tiles[slot*nt+j/ScaleTile])
			}
			if row[j] != want {
				t.Fatalf("slot %d column %d: %v, want %v", slot, j, row[j], want)
			}
		}
	}
}

// TestScalesErrors: each unusable scale is an error naming it.
func TestScalesErrors(t *testing.T) {
	ct, lay := everyCode(t)
	bf, err := NewLayout(BF16, 256, 64, 1)
	if err != nil {
		t.Fatal(err)
	}
	odd, err := NewLayout(FP8E4M3, 200, 120, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		lay  Layout
		sc   Scales
		want string
	}{
		{"bf16 cache", bf, Scales{Latent: 1, Rope: 1}, "kv_cache_dtype bf16 has no"},
		{"no latent scale", lay, Scales{Rope: 1}, "tensor k_scale = 0"},
		{"negative rope scale", lay, Scales{Latent: 1, Rope: -1}, "rope part's scale"},
		{"infinite rope scale", lay, Scales{Latent: 1, Rope: math.Inf(1)}, "rope part's scale"},
		{"tiles too short", lay, Scales{Tiles: []float32{1}, Rope: 1}, "k_scale_tiles has 1 scales; [NB=1, P=1, L/128=2] needs 2"},
		{"latent not tiled", odd, Scales{Tiles: []float32{1}, Rope: 1}, "L = 200 is not a multiple of 128"},
		{"scale dtype", lay, Scales{Latent: 1, Rope: 1, ScaleDType: tensor.F16}, "k_scale_dtype"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewScaled("kv_cache", ct, tc.lay, tc.sc)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
	tiles := []float32{1, float32(math.NaN()), 1, 1}
	if err := CheckTileScales(tiles, 1, 2, func(s int) bool { return s == 1 }); err != nil {
		t.Fatalf("a NaN scale of a slot not read: %v", err)
	}
	if err := CheckTileScales(tiles, 1, 2, nil); err == nil || !strings.Contains(err.Error(), "k_scale_tiles[0,0,1] = NaN") {
		t.Fatalf("a NaN scale read: error %v", err)
	}
}
