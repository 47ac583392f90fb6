package paged

import (
	"fmt"
	"math"

	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/kvcache"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// The fp8_e4m3 cache's scales beyond one k_scale (reference/CONTRACTS.md
// §3.6): k_scale_rope, a per-tensor scale of the rope part, and
// k_scale_tiles [NB, P, L/128], a scale per 128 latent columns of every
// slot, as FlashInfer's FP8 MLA takes them (kpe_scale, ckv_scale_arr:
// flashinfer-python 0.7.2.post1 flashinfer/mla/_batch_mla/_backends/
// _fa_common.py:692-711, 745-755), and k_scale_dtype, the dtype a kernel
// holds a per-tensor scale in (reference/kvcache.Scales).
var (
	KScaleRopeSpec   = TensorSpec{Name: "k_scale_rope", DTypes: []tensor.DType{tensor.F32}, Optional: true}
	KScaleTilesSpec  = TensorSpec{Name: "k_scale_tiles", DTypes: []tensor.DType{tensor.F32}, Optional: true, Read: tilesRead}
	KScaleDTypeParam = ParamSpec{Name: "k_scale_dtype", Kind: ParamEnum, Default: "f32", Allowed: []string{"f32", "bf16"},
		Doc: "the dtype an fp8_e4m3 kernel holds a per-tensor scale (k_scale, k_scale_rope) in: f32 (the fp32 product code·scale rounded to kv_dequant_dtype: FlashMLA, vLLM) or bf16 (the scale rounded to bf16, the product of code and that scale rounded once: FlashInfer's FP8 MLA, __hmul2); both answers multiply by the scale so held"}
)

// tilesRead is k_scale_tiles' Read: the scales of the slots the requests
// attend; a free page's may hold anything.
func tilesRead(in Inputs) (func(int) bool, error) {
	tt := in.Tensors["k_scale_tiles"]
	if tt == nil || len(tt.Shape) != 3 {
		return nil, fmt.Errorf("tensor k_scale_tiles missing or misshapen")
	}
	read, err := AttendedEntries(in, "kv_cache")
	if err != nil {
		return nil, err
	}
	return RowsRead(read, tt.Shape[2]), nil
}

// ScaledCache is the view of the cache tensor ct (the contract's kv_cache)
// that mla_decode reads: over one k_scale (KScale, kvcache.NewNamed) unless
// k_scale_rope, k_scale_tiles or k_scale_dtype = bf16 say otherwise, in
// which case the latent part is scaled by k_scale_tiles or else k_scale,
// and the rope part by k_scale_rope or else k_scale. read marks the slots
// the kernel reads (nil: all): only their tile scales must be finite.
func ScaledCache(in Inputs, ct *tensor.Tensor, lay kvcache.Layout, read []bool) (*kvcache.Cache, error) {
	rope, tiles := in.Tensors["k_scale_rope"], in.Tensors["k_scale_tiles"]
	sdt, err := in.Params.Enum("k_scale_dtype", "f32", "f32", "bf16")
	if err != nil {
		return nil, err
	}
	if rope == nil && tiles == nil && sdt == "f32" {
		ks, err := KScale(in, lay)
		if err != nil {
			return nil, err
		}
		return kvcache.NewNamed("kv_cache", ct, lay, ks)
	}
	if !lay.NeedsKScale() {
		what := "parameter k_scale_dtype = " + sdt
		switch {
		case tiles != nil:
			what = "tensor k_scale_tiles"
		case rope != nil:
			what = "tensor k_scale_rope"
		}
		return nil, fmt.Errorf("%s: kv_cache_dtype %s has no per-tensor or per-tile scale (only fp8_e4m3 has)", what, lay.Kind)
	}
	sc := kvcache.Scales{ScaleDType: tensor.F32}
	if sdt == "bf16" {
		sc.ScaleDType = tensor.BF16
	}
	ks, hasKS := in.Tensors["k_scale"]
	scalar := func(name string, t *tensor.Tensor) (float64, error) {
		v, err := t.Scalar()
		if err != nil {
			return 0, fmt.Errorf("tensor %s: %v", name, err)
		}
		if !(v > 0) || math.IsInf(v, 0) {
			return 0, fmt.Errorf("tensor %s = %v: want a positive finite scale", name, v)
		}
		return v, nil
	}
	if tiles != nil && rope != nil && hasKS {
		return nil, fmt.Errorf("tensor k_scale is given with k_scale_tiles (the latent part's scales) and k_scale_rope (the rope part's): it would scale nothing; leave it out")
	}
	if rope != nil && lay.R == 0 {
		return nil, fmt.Errorf("tensor k_scale_rope: the cache has no rope columns (D = L = %d)", lay.L)
	}
	needKS := tiles == nil || (rope == nil && lay.R > 0)
	if needKS {
		part := "the latent part"
		if tiles != nil {
			part = "the rope part (k_scale_rope is not given)"
		} else if rope == nil {
			part = "the latent and rope parts"
		}
		if !hasKS {
			return nil, fmt.Errorf("tensor k_scale is missing (kv_cache_dtype fp8_e4m3 scales %s by it)", part)
		}
		v, err := scalar("k_scale", ks)
		if err != nil {
			return nil, err
		}
		sc.Latent, sc.Rope = v, v
	}
	if rope != nil {
		if sc.Rope, err = scalar("k_scale_rope", rope); err != nil {
			return nil, err
		}
	}
	if tiles != nil {
		nb, p := ct.Shape[0], ct.Shape[1]
		if lay.L%kvcache.ScaleTile != 0 {
			return nil, fmt.Errorf("tensor k_scale_tiles: latent dim L = %d is not a multiple of %d, the latent columns one tile scale covers", lay.L, kvcache.ScaleTile)
		}
		nt := lay.L / kvcache.ScaleTile
		if err := CheckShape("k_scale_tiles", tiles, nb, p, nt); err != nil {
			return nil, fmt.Errorf("%v: a scale per %d latent columns (L = %d) of each of kv_cache's [NB, P] = [%d, %d] slots", err, kvcache.ScaleTile, lay.L, nb, p)
		}
		sc.Tiles = make([]float32, tiles.Len())
		for i := range sc.Tiles {
			sc.Tiles[i] = float32(tiles.Float64At(i))
		}
		var r func(int) bool
		if read != nil {
			r = func(s int) bool { return s < len(read) && read[s] }
		}
		if err := kvcache.CheckTileScales(sc.Tiles, p, nt, r); err != nil {
			return nil, err
		}
	}
	return kvcache.NewScaled("kv_cache", ct, lay, sc)
}
