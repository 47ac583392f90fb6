package mla

import (
	"context"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// fp8ScaledInputs is mlaInputs over an fp8_e4m3 cache of L = 256, R = 16
// (two 128-column scale tiles), random finite E4M3 codes, and the scales
// of FlashInfer's FP8 MLA as the contract names them.
func fp8ScaledInputs(t *testing.T) Inputs {
	t.Helper()
	rng := rand.New(rand.NewPCG(7, 11))
	in := mlaInputs(rng, []int{13, 0, 30}, 2, 3, 256, 16, 12)
	kv := in.Tensors["kv_cache"]
	c := tensor.New(tensor.F8E4M3, kv.Shape...)
	for i := range c.Data {
		c.Data[i] = byte(rng.IntN(0x7F)) | byte(rng.IntN(2)<<7) // any code but NaN (0x7F, 0xFF)
	}
	in.Tensors["kv_cache"] = c
	in.Params["kv_cache_dtype"] = "fp8_e4m3"
	in.Params["latent_dim"] = "256"
	in.Params["causal"] = "true"
	return in
}

// tilesOf is a [NB, P, 2] k_scale_tiles of distinct scales, NaN in the
// slots no request attends (a free page's memory).
func tilesOf(in Inputs) *tensor.Tensor {
	c := in.Tensors["kv_cache"]
	ts := tensor.New(tensor.F32, c.Shape[0], c.Shape[1], 2)
	for i := 0; i < ts.Len(); i++ {
		ts.SetFloat64(i, 0.003*float64(1+i%17)+0.0001*float64(i))
	}
	return ts
}

// dequantized is the bf16 cache the kernel's dequantization gives,
// computed here element by element from the formats alone: latent column
// j of slot s is bf16(code·latent(s, j)), rope column bf16(code·rope).
func dequantized(c *tensor.Tensor, l int, latent func(s, j int) float64, rope float64, bf16Scale bool) *tensor.Tensor {
	d := c.Shape[2]
	out := tensor.New(tensor.BF16, c.Shape...)
	for i := 0; i < c.Len(); i++ {
		s, j := i/d, i%d
		v := formats.E4M3FN.Decode(c.Data[i])
		var x float64
		switch {
		case j >= l:
			x = float64(formats.BF16Decode(formats.BF16FromFloat64(v * rope)))
		case bf16Scale:
			x = float64(formats.BF16Decode(formats.BF16FromFloat64(v * latent(s, j))))
		default: // the fp32 product, then bf16
			x = formats.RoundBF16(float64(float32(v) * float32(latent(s, j))))
		}
		out.SetFloat64(i, x)
	}
	return out
}

// TestMLADecodeFP8Scales: mla_decode over an fp8_e4m3 cache with
// k_scale_rope, k_scale_tiles and k_scale_dtype gives, as its expected
// answer, bit for bit the decode of the bf16 cache that FlashInfer's
// dequantization makes of it (dequantized: a scale held in bf16 times the
// code rounded once, or a tile's fp32 product rounded to bf16), and its
// exact answer is within the bf16 dequantization's reach of it. Planting
// the latent scale on the rope part, or the next tile's scale, breaks
// the bit equality.
func TestMLADecodeFP8Scales(t *testing.T) {
	const ks, kr = 0.0173, 0.0121
	bf := func(x float64) float64 { return float64(formats.BF16Decode(formats.BF16Encode(float32(x)))) }
	tileScale := func(ts *tensor.Tensor) func(s, j int) float64 {
		return func(s, j int) float64 { return ts.Float64At(s*2 + j/128) }
	}
	for _, tc := range []struct {
		name      string
		sdt       string
		tiles     bool
		latent    func(ts *tensor.Tensor) func(s, j int) float64
		rope      float64
		bf16Scale bool
	}{
		{"per-tensor, bf16 scales", "bf16", false, func(*tensor.Tensor) func(s, j int) float64 { return func(int, int) float64 { return bf(ks) } }, bf(kr), true},
		{"per-tensor, fp32 scales", "f32", false, func(*tensor.Tensor) func(s, j int) float64 { return func(int, int) float64 { return ks } }, kr, false},
		{"tiles, bf16 rope scale", "bf16", true, tileScale, bf(kr), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := fp8ScaledInputs(t)
			in.Params["k_scale_dtype"] = tc.sdt
			in.Tensors["k_scale_rope"] = F32Scalar(kr)
			var ts *tensor.Tensor
			if tc.tiles {
				ts = tilesOf(in)
				in.Tensors["k_scale_tiles"] = ts
			} else {
				in.Tensors["k_scale"] = F32Scalar(ks)
			}
			k, _ := Lookup("mla_decode")
			outs, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil)
			if err != nil {
				t.Fatal(err)
			}
			ref := Inputs{Tensors: map[string]*tensor.Tensor{}, Params: Params{}}
			for n, v := range in.Tensors {
				if !strings.HasPrefix(n, "k_scale") {
					ref.Tensors[n] = v
				}
			}
			for n, v := range in.Params {
				ref.Params[n] = v
			}
			ref.Params["kv_cache_dtype"] = "bf16"
			delete(ref.Params, "k_scale_dtype")
			if tc.rope != kr && tc.rope != bf(kr) {
				t.Fatal("bad table")
			}
			ropeF := tc.rope
			if tc.sdt == "f32" {
				ropeF = float64(float32(kr))
			}
			ref.Tensors["kv_cache"] = dequantized(in.Tensors["kv_cache"], 256, tc.latent(ts), ropeF, tc.bf16Scale)
			want, err := Evaluate(context.Background(), k, ref, DefaultPrecision(), nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, name := range []string{"out", "lse"} {
				g, w := outputNamed(t, outs, name), outputNamed(t, want, name)
				gx, wx := Float64s(g.Expected), Float64s(w.Expected)
				for i := range gx {
					if math.Float64bits(gx[i]) != math.Float64bits(wx[i]) {
						t.Fatalf("%s[%d]: expected %v, the bf16 cache's %v", name, i, gx[i], wx[i])
					}
				}
				// exact vs expected: a coarse sanity bound (the exact
				// dequantization itself is checked in reference/kvcache,
				// TestScalesExact)
				ex := Float64s(g.Exact)
				big := 0.0
				for _, v := range ex {
					if !math.IsInf(v, 0) {
						big = math.Max(big, math.Abs(v))
					}
				}
				for i := range ex {
					if ex[i] == gx[i] {
						continue // the empty request's -inf lse, and exact agreement
					}
					if d := math.Abs(ex[i] - gx[i]); !(d <= 0.05*big) {
						t.Fatalf("%s[%d]: exact %v and expected %v differ by %v (more than the dequantization can)", name, i, ex[i], gx[i], d)
					}
				}
			}
		})
	}
}

// TestMLADecodeFP8ScaleErrors: every misuse of the scales is an error
// naming the input.
func TestMLADecodeFP8ScaleErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(in Inputs)
		want string
	}{
		{"tiles misshapen", func(in Inputs) {
			in.Tensors["k_scale_tiles"] = tensor.New(tensor.F32, 12, 4, 4)
			in.Tensors["k_scale_rope"] = F32Scalar(1)
		}, "tensor k_scale_tiles has shape [12 4 4]"},
		{"k_scale scales nothing", func(in Inputs) {
			in.Tensors["k_scale_tiles"] = tilesOf(in)
			in.Tensors["k_scale_rope"] = F32Scalar(1)
			in.Tensors["k_scale"] = F32Scalar(1)
		}, "it would scale nothing"},
		{"no latent scale", func(in Inputs) { in.Tensors["k_scale_rope"] = F32Scalar(1) }, "tensor k_scale is missing (kv_cache_dtype fp8_e4m3 scales the latent part by it)"},
		{"no rope scale with tiles", func(in Inputs) { in.Tensors["k_scale_tiles"] = tilesOf(in) }, "scales the rope part (k_scale_rope is not given) by it"},
		{"rope scale negative", func(in Inputs) {
			in.Tensors["k_scale"] = F32Scalar(1)
			in.Tensors["k_scale_rope"] = F32Scalar(-2)
		}, "tensor k_scale_rope = -2: want a positive finite scale"},
		{"rope scale not a scalar", func(in Inputs) {
			in.Tensors["k_scale"] = F32Scalar(1)
			in.Tensors["k_scale_rope"] = tensor.New(tensor.F32, 2)
		}, "tensor k_scale_rope: want a scalar"},
		{"tile scale NaN where read", func(in Inputs) {
			ts := tilesOf(in)
			bt := in.Tensors["block_table"]
			ts.SetFloat64(int(bt.Int64At(0))*4*2+1, math.NaN()) // request 0's first block, token 0, tile 1
			in.Tensors["k_scale_tiles"] = ts
			in.Tensors["k_scale_rope"] = F32Scalar(1)
		}, "is read and not finite"},
		{"bf16 scale dtype over a bf16 cache", func(in Inputs) {
			in.Tensors["kv_cache"] = tensor.New(tensor.BF16, in.Tensors["kv_cache"].Shape...)
			in.Params["kv_cache_dtype"] = "bf16"
			in.Params["k_scale_dtype"] = "bf16"
		}, "parameter k_scale_dtype = bf16: kv_cache_dtype bf16 has no per-tensor or per-tile scale"},
		{"rope scale over a bf16 cache", func(in Inputs) {
			in.Tensors["kv_cache"] = tensor.New(tensor.BF16, in.Tensors["kv_cache"].Shape...)
			in.Params["kv_cache_dtype"] = "bf16"
			in.Tensors["k_scale_rope"] = F32Scalar(1)
		}, "tensor k_scale_rope: kv_cache_dtype bf16 has no"},
		{"unknown scale dtype", func(in Inputs) {
			in.Tensors["k_scale"] = F32Scalar(1)
			in.Params["k_scale_dtype"] = "e8m0"
		}, `parameter k_scale_dtype = "e8m0": want one of f32, bf16`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := fp8ScaledInputs(t)
			tc.edit(in)
			k, _ := Lookup("mla_decode")
			_, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
	// A NaN tile scale of a slot no request attends is a free page's, not an error.
	in := fp8ScaledInputs(t)
	ts := tilesOf(in)
	used := map[int64]bool{}
	bt := in.Tensors["block_table"]
	for i := 0; i < bt.Len(); i++ {
		used[bt.Int64At(i)] = true
	}
	for blk := 0; blk < ts.Shape[0]; blk++ {
		if !used[int64(blk)] {
			for i := 0; i < 8; i++ {
				ts.SetFloat64(blk*8+i, math.NaN())
			}
		}
	}
	in.Tensors["k_scale_tiles"], in.Tensors["k_scale_rope"] = ts, F32Scalar(1)
	k, _ := Lookup("mla_decode")
	if _, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil); err != nil {
		t.Fatalf("NaN tile scales on free pages: %v", err)
	}
}

// TestMLADecodeSliceKeepsTiles: slicing a capture by request compacts
// k_scale_tiles with kv_cache, so the kept request's outputs are the ones
// it had in the whole batch, bit for bit. Dropping the tiles' compaction
// (withTiles) fails it: the tiles keep the whole cache's NB.
func TestMLADecodeSliceKeepsTiles(t *testing.T) {
	in := fp8ScaledInputs(t)
	in.Tensors["k_scale_tiles"], in.Tensors["k_scale_rope"] = tilesOf(in), F32Scalar(0.5)
	k, _ := Lookup("mla_decode")
	whole, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	meta := map[string]string{}
	for n, v := range in.Params {
		meta[n] = v
	}
	axes, ok := k.(Slicer).Axes(in.Tensors, meta)
	if !ok || len(axes) == 0 || axes[0].Name != "requests" {
		t.Fatalf("axes %v, %v: want the requests axis first", axes, ok)
	}
	repl, err := axes[0].Slice([]int{2}) // the request of 30 tokens
	if err != nil {
		t.Fatal(err)
	}
	ts := map[string]*tensor.Tensor{} // a slice returns the tensors it replaces
	for n, v := range in.Tensors {
		ts[n] = v
	}
	for n, v := range repl {
		ts[n] = v
	}
	if got, want := ts["k_scale_tiles"].Shape[0], ts["kv_cache"].Shape[0]; got != want {
		t.Fatalf("k_scale_tiles has %d blocks, kv_cache %d", got, want)
	}
	part, err := Evaluate(context.Background(), k, Inputs{Tensors: ts, Params: in.Params}, DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	w, p := Float64s(outputNamed(t, whole, "out").Expected), Float64s(outputNamed(t, part, "out").Expected)
	n := len(p) // request 2 is the last B-slice of out [B, s_q, H, L]
	for i := range p {
		if math.Float64bits(p[i]) != math.Float64bits(w[len(w)-n+i]) {
			t.Fatalf("sliced out[%d] = %v, the whole batch's %v", i, p[i], w[len(w)-n+i])
		}
	}
}
