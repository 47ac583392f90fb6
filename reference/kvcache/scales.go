package kvcache

import (
	"fmt"
	"math"

	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// ScaleTile is the latent columns one per-tile fp8_e4m3 scale covers
// (Scales.Tiles): FlashInfer's ckv_scale_arr holds HEAD_DIM_CKV / 128
// scales a token (flashinfer-python 0.7.2.post1
// flashinfer/data/include/flashinfer/attention/mla.cuh:341-342, index
// physical_row * (HEAD_DIM_CKV / 128) + col / (128 / 16), col counting
// 16-byte chunks of 16 E4M3 codes).
const ScaleTile = 128

// Scales are an fp8_e4m3 cache's dequantization scales when one k_scale
// for the whole entry is not what the kernel reads: FlashInfer's FP8 MLA
// (BatchMLAPagedAttentionWrapper with kv_data_type = float8_e4m3fn,
// flashinfer-python 0.7.2.post1) scales the latent part by ckv_scale or by
// ckv_scale_arr, a scale per ScaleTile latent columns of every token, and
// the rope part by kpe_scale (flashinfer/mla/_batch_mla/_backends/
// _fa_common.py:692-711, 745-755; its reference
// flashinfer/trace/templates/attention.py:2325-2339 multiplies kpe_cache
// alone by kpe_scale).
type Scales struct {
	// Latent scales columns [0, L) when Tiles is nil.
	Latent float64
	// Rope scales columns [L, D).
	Rope float64
	// Tiles, when set, holds the scales [NB, P, L/ScaleTile] of the
	// latent columns, tile t of slot s at Tiles[s*(L/ScaleTile) + t]; a
	// code of such a tile is dequantized as the fp32 product code·scale
	// rounded to the reader's precision (FlashInfer:
	// static_cast<DTypeQ>(static_cast<float>(conv[k]) * scale),
	// mla.cuh:343-346, mla_hopper.cuh:399-401).
	Tiles []float32
	// ScaleDType is the dtype the kernel holds a per-tensor scale (Latent,
	// Rope) in before multiplying: F32 (or empty), the fp32 product
	// rounded to the reader's precision, as FlashMLA and vLLM; or BF16,
	// the scale rounded to bf16 first and the exact product of the code
	// and that scale rounded once to the reader's precision, as
	// FlashInfer's __hmul2 on bf16 pairs (packed2_t
	// scale_packed{static_cast<DTypeQ>(ckv_scale), ...}, mla.cuh:348-352
	// and :364, :376-378; mla_hopper.cuh:380, :403-406, :417, :430-432).
	// The rounded scale is the one both answers use: it is what the
	// kernel is given to multiply by, as q is given in bf16, so a kernel
	// that multiplies by the fp32 scale instead errs by as much as the
	// rounding moved it (up to 2^-8 relative, the same way in every value).
	ScaleDType tensor.DType
}

// ScaleOf is the scale a kernel holding a per-tensor scale s in dtype d
// multiplies by: s itself for F32 (s is an fp32 value, as the contract's
// F32 k_scale is), bf16(s) for BF16, nearest even.
func ScaleOf(s float64, d tensor.DType) (float64, error) {
	switch d {
	case "", tensor.F32:
		return float64(float32(s)), nil
	case tensor.BF16:
		return float64(formats.BF16Decode(formats.BF16Encode(float32(s)))), nil
	}
	return 0, fmt.Errorf("parameter k_scale_dtype = %q: want f32 or bf16", d)
}

// NewScaled is NewNamed for an fp8_e4m3 cache read with Scales: a latent
// scale per tensor or per tile and a rope scale of its own. Errors name
// the contract's tensors (k_scale, k_scale_rope, k_scale_tiles).
func NewScaled(name string, t *tensor.Tensor, l Layout, s Scales) (*Cache, error) {
	if l.Kind != FP8E4M3 {
		return nil, fmt.Errorf("kv_cache_dtype %s has no per-tensor or per-tile fp8 scales (only fp8_e4m3 has)", l.Kind)
	}
	if s.Tiles == nil {
		if err := CheckKScale(s.Latent); err != nil {
			return nil, err
		}
	}
	if err := CheckKScale(s.Rope); err != nil && l.R > 0 {
		return nil, fmt.Errorf("%v (the rope part's scale)", err)
	}
	ks := s.Latent
	if s.Tiles != nil {
		ks = 1 // the tiles scale the latent part; NewNamed's table is replaced below
	}
	c, err := NewNamed(name, t, l, ks)
	if err != nil {
		return nil, err
	}
	if s.Tiles != nil {
		if l.L%ScaleTile != 0 {
			return nil, fmt.Errorf("tensor k_scale_tiles: latent dim L = %d is not a multiple of %d, the columns a tile scale covers", l.L, ScaleTile)
		}
		if want := c.Slots() * (l.L / ScaleTile); len(s.Tiles) != want {
			return nil, fmt.Errorf("tensor k_scale_tiles has %d scales; [NB=%d, P=%d, L/%d=%d] needs %d", len(s.Tiles), c.NB, l.PageSize, ScaleTile, l.L/ScaleTile, want)
		}
	}
	var lat, rope float64
	if lat, err = ScaleOf(s.Latent, s.ScaleDType); err != nil {
		return nil, err
	}
	if rope, err = ScaleOf(s.Rope, s.ScaleDType); err != nil {
		return nil, err
	}
	for code := 0; code < 256; code++ {
		c.plain[code] = formats.E4M3FN.Decode(uint8(code))
	}
	fillLUT(&c.lut, &c.plain, lat)
	fillLUT(&c.ropeLUT, &c.plain, rope)
	c.KScale = lat
	c.tiles = s.Tiles
	c.scaled = true
	return c, nil
}

// fillLUT fills lut[q][code] with code·s at each precision q: the exact
// float64 product (a 4-bit by at most 24-bit significand), and the fp32
// product rounded to fp32, bf16 and fp16, as a kernel forms it. For a bf16
// s the fp32 product (4 by 8 bits) is exact, so its bf16 entry is the one
// rounding of the exact product that __hmul2 makes; for an fp32 s it is
// the fp32 product rounded again, as FlashMLA and vLLM compute it.
func fillLUT(lut *[4][256]float64, plain *[256]float64, s float64) {
	s32 := float32(s)
	for code := 0; code < 256; code++ {
		v := plain[code]
		lut[deqExact][code] = v * s
		p := float32(v) * s32 // the fp32 product, as the kernel forms it
		lut[deqF32][code] = float64(p)
		lut[deqBF16][code] = float64(formats.BF16Decode(formats.BF16Encode(p)))
		lut[deqF16][code] = float64(formats.FP16Decode(formats.FP16Encode(p)))
	}
}

// rowScaled is RowSlot for an fp8_e4m3 cache built by NewScaled.
func (c *Cache) rowScaled(slot int, b []byte, dst []float64, q int) {
	L := c.Layout.L
	if c.tiles == nil {
		lut := &c.lut[q]
		for j, code := range b[:L] {
			dst[j] = lut[code]
		}
	} else {
		nt := L / ScaleTile
		ts := c.tiles[slot*nt : (slot+1)*nt]
		for t, s := range ts {
			deqTileTable(&c.plain, dst[t*ScaleTile:(t+1)*ScaleTile], b[t*ScaleTile:(t+1)*ScaleTile], s, q)
		}
	}
	rl := &c.ropeLUT[q]
	for j, code := range b[L:] {
		dst[L+j] = rl[code]
	}
}

// TileScaleOf returns the k_scale_tiles scale of latent column col of a
// slot, and whether the cache has per-tile scales.
func (c *Cache) TileScaleOf(slot, col int) (float32, bool) {
	if c.tiles == nil {
		return 0, false
	}
	nt := c.Layout.L / ScaleTile
	return c.tiles[slot*nt+col/ScaleTile], true
}

// CheckTileScales reports the first scale of k_scale_tiles [NB, P, nt]
// (p tokens a block) that a read slot uses and is not finite, naming it by
// index; slots read says are not read may hold anything (free pages).
func CheckTileScales(tiles []float32, p, nt int, read func(slot int) bool) error {
	for i, s := range tiles {
		slot := i / nt
		if read != nil && !read(slot) {
			continue
		}
		if f := float64(s); math.IsNaN(f) || math.IsInf(f, 0) {
			return fmt.Errorf("k_scale_tiles[%d,%d,%d] = %v (block %d, offset %d, latent columns %d-%d) is read and not finite: a scale must be a finite number",
				slot/p, slot%p, i%nt, f, slot/p, slot%p, (i%nt)*ScaleTile, (i%nt+1)*ScaleTile-1)
		}
	}
	return nil
}
