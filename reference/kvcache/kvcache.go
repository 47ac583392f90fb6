// Package kvcache is the reference for MLA's paged latent cache: where a token
// lives (block = slot / P, offset = slot % P), how its D = L + R values are
// stored in each kv_cache_dtype (reference/CONTRACTS.md §3.4), how a writer fills it and how a
// reader dequantizes it (reference/CONTRACTS.md §3.5).
//
// Six layouts, as the engines store them:
//
//	bf16        BF16 [NB, P, D], each row [kv_c (L) | k_pe (R)]
//	fp16        F16 [NB, P, D], rows as bf16 (an fp16 model's cache: FlashMLA's
//	            dense decode, vLLM TRITON_MLA and vLLM --dtype half store it)
//	fp8_e4m3    U8 or F8_E4M3 [NB, P, D], written e4m3_sat(x / k_scale), read e4m3 * k_scale
//	            (or, with Scales, the latent and rope parts by scales of their
//	            own and the latent part per 128-column tile: scales.go)
//	fp8_ds_mla  U8 (or F8_E4M3) [NB, P, 656] (DeepSeek-V3.2, L = 512, R = 64):
//	            [0,512) kv_c as E4M3, [512,528) four F32 tile scales (one per
//	            128 latent values), [528,656) k_pe as 64 BF16, not quantized
//	fp8_ds_mla_model1
//	            U8 (or F8_E4M3) [NB, P, 584] (DeepSeek-V4, FlashMLA's MODEL1,
//	            L = 448, R = 64): a token's 584 bytes are [0,448) the NoPE part
//	            as E4M3, [448,576) k_pe as 64 BF16, [576,583) seven E8M0 scales
//	            (one per 64 NoPE values), 583 a pad byte; but a block is not
//	            stored token by token: it holds its P data rows of 576 bytes
//	            first and its P scale rows of 8 bytes after (model1.go)
//	fp8_ds_mla_v41
//	            U8 (or F8_E4M3) [NB, P, 528] (DeepSeek-V4.1, L = 448, R = 64):
//	            token by token, [0,512) all 512 dims as E4M3 (rope included),
//	            [512,528) sixteen E8M0 scales, one per 32 values: MXFP8 (model1.go)
//
// The row accessor (Cache.Row) is the inner loop of attention over long
// contexts, so it decodes through tables built once and allocates nothing.
package kvcache

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Kind is a kv_cache_dtype value.
type Kind string

// The kv_cache_dtype values of reference/CONTRACTS.md §3.4.
const (
	BF16     Kind = "bf16"
	FP16     Kind = "fp16"
	FP8E4M3  Kind = "fp8_e4m3"
	FP8DSMLA Kind = "fp8_ds_mla"
	// FP8DSMLAModel1 is DeepSeek-V4's sparse cache, which FlashMLA calls
	// MODEL1 (deepseek-ai/FlashMLA@9241ae3 tests/quant.py:6-15,
	// FP8KVCacheLayout.MODEL1_FP8Sparse; csrc/api/sparse_decode.h:318-325,
	// ModelType::MODEL1) and vLLM spells fp8_ds_mla as it does the 656-byte
	// one, telling them apart by the model (vllm 0.33.0
	// vllm/models/deepseek_v4/attention.py:94-123): the entry width is
	// what internal/engines reads.
	FP8DSMLAModel1 Kind = "fp8_ds_mla_model1"
	// FP8DSMLAV41 is DeepSeek-V4.1's, FlashMLA's ModelType::V41 (vllm
	// 0.33.0 vllm/models/deepseek_v41/common/ops/cache_utils.py:39-51; the
	// FlashMLA interface vLLM vendors, vllm/third_party/flashmla/
	// flash_mla_interface.py:121-127). vLLM spells it fp8_ds_mla too.
	FP8DSMLAV41 Kind = "fp8_ds_mla_v41"
)

// Kinds lists the kv_cache_dtype values, for parameter validation.
var Kinds = []string{string(BF16), string(FP16), string(FP8E4M3), string(FP8DSMLA), string(FP8DSMLAModel1), string(FP8DSMLAV41)}

// IsFloat reports whether the layout stores each value as a float of the
// cache's own dtype (bf16, fp16): a write rounds the token's value to it, a
// read is exact at every precision.
func (k Kind) IsFloat() bool { return k == BF16 || k == FP16 }

// ScaleConvention is how an fp8_ds_mla writer derives a tile scale from the
// tile's amax (the ds_mla_scale parameter). Readers multiply by the stored F32
// either way (unless their ScaleRead rounds it); only the writer's bytes differ.
type ScaleConvention string

const (
	// ScaleAmax is vLLM's concat_and_cache_ds_mla_kernel: the fp32 quotient
	// amax / 448.f, then fmaxf(s, FLT_MIN).
	ScaleAmax ScaleConvention = "amax"
	// ScalePow2 is FlashMLA's tests/quant.py: the fp32 quotient amax / 448,
	// clamped below at 1e-4, then 2^ceil(log2 s).
	ScalePow2 ScaleConvention = "pow2"
	// ScalePow2AmaxFloor is vLLM's DeepSeek-V4 writer, which clamps the
	// amax, not the quotient: 2^ceil(log2(max(amax, 1e-4) / 448)) (vllm
	// 0.33.0 vllm/models/deepseek_v4/common/ops/cache_utils.py:122-133,
	// "Match CUDA: fmaxf(amax, 1e-4)"). It differs from pow2 only for a
	// tile whose amax is below 448e-4 (pow2's floor is 2^-13, this one's
	// 2^-22).
	ScalePow2AmaxFloor ScaleConvention = "pow2_amax_floor"
)

// ScaleConventions lists the ds_mla_scale values.
var ScaleConventions = []string{string(ScaleAmax), string(ScalePow2), string(ScalePow2AmaxFloor)}

// Pow2 reports whether the convention stores powers of two only (an E8M0
// scale can hold nothing else).
func (c ScaleConvention) Pow2() bool { return c == ScalePow2 || c == ScalePow2AmaxFloor }

// ScaleRead is how an fp8_ds_mla reader turns a stored F32 tile scale into
// the factor it multiplies the tile's codes by (the ds_mla_scale_read
// parameter): a property of the reader, as ScaleConvention is of the
// writer. FlashMLA reads it two ways, neither the stored F32
// (deepseek-ai/FlashMLA@9241ae3):
//   - bf16, sm90: csrc/sm90/decode/sparse_fp8/splitkv_mla.cuh:550
//     `scales[i] = (bf16)scales_float[i]`, then a bf16 multiply of the
//     code by it (components/dequant.h:22-27: the code widened to bf16,
//     times scale_bf162);
//   - e8m0_rz, sm100: csrc/sm100/decode/head64/kernel.cuh:708-709
//     `__nv_cvt_float2_to_e8m0x2(..., __NV_NOSAT, cudaRoundZero)`, the
//     power of two at or below the scale, widened to bf16 (:788-789).
//
// With a power-of-two (pow2) writer all three read the same factor; with
// an amax writer bf16 moves it by up to 2^-9 relative and e8m0_rz by up to
// a factor 2.
type ScaleRead string

const (
	ScaleReadF32    ScaleRead = "f32"
	ScaleReadBF16   ScaleRead = "bf16"
	ScaleReadE8M0RZ ScaleRead = "e8m0_rz"
)

// ScaleReads lists the ds_mla_scale_read values.
var ScaleReads = []string{string(ScaleReadF32), string(ScaleReadBF16), string(ScaleReadE8M0RZ)}

// Factor is the factor a reader of convention r multiplies by for the
// stored scale s. E8M0 holds 2^-127 .. 2^127 and no zero: rounding toward
// zero takes a positive s to the power of two at or below it, clamped at
// 2^-127 (below it nothing is nearer zero); a non-finite or non-positive
// scale reads as NaN (E8M0's only special code, 0xFF).
func (r ScaleRead) Factor(s float32) float32 {
	switch r {
	case ScaleReadBF16:
		return formats.BF16Decode(formats.BF16Encode(s))
	case ScaleReadE8M0RZ:
		if !(s > 0) || math.IsInf(float64(s), 0) {
			return float32(math.NaN())
		}
		_, exp := math.Frexp(float64(s)) // s = frac · 2^exp, frac in [0.5, 1)
		return float32(math.Ldexp(1, max(exp-1, -127)))
	}
	return s
}

// SetScaleRead makes the cache's fp8_ds_mla reads use r's factor for each
// tile scale (f32 by default).
func (c *Cache) SetScaleRead(r ScaleRead) error {
	switch r {
	case ScaleReadF32, ScaleReadBF16, ScaleReadE8M0RZ:
	default:
		return fmt.Errorf("parameter ds_mla_scale_read = %q: want f32, bf16 or e8m0_rz", r)
	}
	if r != ScaleReadF32 && c.Layout.Kind == FP8DSMLAModel1 {
		return fmt.Errorf("parameter ds_mla_scale_read = %s rounds fp8_ds_mla's F32 tile scales; kv_cache_dtype = fp8_ds_mla_model1 stores E8M0 scales, which every reader reads exactly", r)
	}
	if r != ScaleReadF32 && c.Layout.Kind != FP8DSMLA {
		return fmt.Errorf("parameter ds_mla_scale_read = %s reads fp8_ds_mla tile scales, but kv_cache_dtype = %s has none", r, c.Layout.Kind)
	}
	c.scaleRead = r
	return nil
}

// The fixed fp8_ds_mla entry: 656 bytes a token.
const (
	DSLatent     = 512                    // L
	DSRope       = 64                     // R
	DSTile       = 128                    // latent values per tile scale
	DSTiles      = DSLatent / DSTile      // 4
	DSScaleOff   = DSLatent               // byte offset of the four F32 scales
	DSRopeOff    = DSScaleOff + 4*DSTiles // byte offset of k_pe (528)
	DSEntryBytes = DSRopeOff + 2*DSRope   // 656
)

// e4m3Max is the largest finite E4M3FN value, the divisor of amax in both tile
// scale conventions.
const e4m3Max = 448

// Layout is how one cache stores its tokens.
type Layout struct {
	Kind     Kind
	L, R     int // latent and rope dims (fp8_ds_mla: 512 and 64)
	PageSize int // P, tokens per block
	// DSScale is the fp8_ds_mla tile-scale convention of the writer.
	DSScale ScaleConvention
	// Saturate: fp8 writes clamp to ±448 (__NV_SATFINITE); when false they
	// give NaN beyond 464, as __NV_NOSAT and older torch releases do (torch
	// 2.15's .to(float8_e4m3fn) saturates).
	Saturate bool
}

// NewLayout returns a validated layout with saturating fp8 writes and the
// layout's default tile-scale convention (DefaultScale); callers set
// DSScale and Saturate after.
func NewLayout(kind Kind, l, r, pageSize int) (Layout, error) {
	lay := Layout{Kind: kind, L: l, R: r, PageSize: pageSize, DSScale: DefaultScale(kind), Saturate: true}
	return lay, lay.Validate()
}

// DefaultScale is the ds_mla_scale a layout's writer uses unless told:
// amax for fp8_ds_mla (vLLM's original writer), pow2 for
// fp8_ds_mla_model1, whose E8M0 scales hold powers of two only (FlashMLA's
// tests/quant.py writer, the one both engines' readers are tested
// against), pow2_amax_floor for fp8_ds_mla_v41, whose only writer in
// reach is vLLM's (deepseek_v41/common/ops/cache_utils.py:225-226: the
// amax floored at 1e-4, then 2^ceil(log2(amax/448))).
func DefaultScale(kind Kind) ScaleConvention {
	switch kind {
	case FP8DSMLAModel1:
		return ScalePow2
	case FP8DSMLAV41:
		return ScalePow2AmaxFloor
	}
	return ScaleAmax
}

// Validate reports a layout that no engine stores.
func (l Layout) Validate() error {
	switch l.Kind {
	case BF16, FP16, FP8E4M3:
	case FP8DSMLA:
		if l.L != DSLatent || l.R != DSRope {
			return fmt.Errorf("kv_cache_dtype fp8_ds_mla stores L = %d and R = %d only; got L = %d, R = %d", DSLatent, DSRope, l.L, l.R)
		}
		if l.DSScale != ScaleAmax && !l.DSScale.Pow2() {
			return fmt.Errorf("parameter ds_mla_scale = %q: want amax, pow2 or pow2_amax_floor", l.DSScale)
		}
	case FP8DSMLAModel1, FP8DSMLAV41:
		if l.L != M1Nope || l.R != M1Rope {
			return fmt.Errorf("kv_cache_dtype %s stores L = %d and R = %d only; got L = %d, R = %d", l.Kind, M1Nope, M1Rope, l.L, l.R)
		}
		if !l.DSScale.Pow2() {
			return fmt.Errorf("parameter ds_mla_scale = %q: kv_cache_dtype %s stores E8M0 scales, powers of two only: want pow2 or pow2_amax_floor", l.DSScale, l.Kind)
		}
	default:
		return fmt.Errorf("parameter kv_cache_dtype = %q: want bf16, fp16, fp8_e4m3, fp8_ds_mla, fp8_ds_mla_model1 or fp8_ds_mla_v41", l.Kind)
	}
	if l.L < 0 || l.R < 0 || l.L+l.R == 0 {
		return fmt.Errorf("latent dim %d and rope dim %d: want L, R >= 0 and L+R > 0", l.L, l.R)
	}
	if l.PageSize <= 0 {
		return fmt.Errorf("parameter page_size = %d: want a positive page size", l.PageSize)
	}
	return nil
}

// D is the number of values a token holds (L + R).
func (l Layout) D() int { return l.L + l.R }

// EntrySize is the cache tensor's last dimension: D elements, 656 bytes
// for fp8_ds_mla, 584 for fp8_ds_mla_model1.
func (l Layout) EntrySize() int {
	switch l.Kind {
	case FP8DSMLA:
		return DSEntryBytes
	case FP8DSMLAModel1:
		return M1EntryBytes
	case FP8DSMLAV41:
		return V41EntryBytes
	}
	return l.D()
}

// CacheDTypes are the dtypes a cache of this layout may be stored as.
func (l Layout) CacheDTypes() []tensor.DType {
	switch l.Kind {
	case BF16:
		return []tensor.DType{tensor.BF16}
	case FP16:
		return []tensor.DType{tensor.F16}
	}
	// fp8_ds_mla is bytes; FlashMLA's tests allocate it as float8_e4m3fn,
	// so a capture may carry that dtype over the same bytes.
	return []tensor.DType{tensor.U8, tensor.F8E4M3}
}

// NeedsKScale reports whether the layout has a per-tensor k_scale.
func (l Layout) NeedsKScale() bool { return l.Kind == FP8E4M3 }

// Part names which region of a token's entry column col is in.
type Part int

// The regions of an entry (also the "part" signature coordinate).
const (
	PartLatent Part = 0
	PartScale  Part = 1
	PartRope   Part = 2
)

// PartOf returns the region of entry column col (an element index along the
// cache's last dimension; a byte index for fp8_ds_mla; for
// fp8_ds_mla_model1 a column of the token's 584-byte entry, Entry) and,
// for the scaled layouts' latent and scale columns, the scale tile it
// belongs to (-1 otherwise, and for model1's pad byte).
func (l Layout) PartOf(col int) (Part, int) {
	switch l.Kind {
	case FP8DSMLAModel1:
		return m1PartOf(col)
	case FP8DSMLAV41:
		return v41PartOf(col)
	}
	if l.Kind == FP8DSMLA {
		switch {
		case col < DSScaleOff:
			return PartLatent, col / DSTile
		case col < DSRopeOff:
			return PartScale, (col - DSScaleOff) / 4
		}
		return PartRope, -1
	}
	if col < l.L {
		return PartLatent, -1
	}
	return PartRope, -1
}

// checkCache reports a cache tensor whose dtype or shape the layout does not
// allow, naming it by name.
func (l Layout) checkCache(name string, t *tensor.Tensor) error {
	if err := t.Check(); err != nil {
		return fmt.Errorf("tensor %s: %v", name, err)
	}
	ok := false
	for _, d := range l.CacheDTypes() {
		ok = ok || t.DType == d
	}
	if !ok {
		return fmt.Errorf("tensor %s has dtype %s; kv_cache_dtype %s stores %v", name, t.DType, l.Kind, l.CacheDTypes())
	}
	if len(t.Shape) != 3 || t.Shape[1] != l.PageSize || t.Shape[2] != l.EntrySize() {
		return fmt.Errorf("tensor %s has shape %v; kv_cache_dtype %s with page_size %d wants [NB, %d, %d]",
			name, t.Shape, l.Kind, l.PageSize, l.PageSize, l.EntrySize())
	}
	return nil
}

// CheckKScale reports a k_scale that cannot be divided by.
func CheckKScale(k float64) error {
	if !(k > 0) || math.IsInf(k, 0) {
		return fmt.Errorf("tensor k_scale = %v: want a positive finite scale", k)
	}
	return nil
}

// Cache is a read-only view of a paged latent cache.
type Cache struct {
	Layout Layout
	NB     int // number of blocks
	KScale float64
	data   []byte
	// scaleRead is how fp8_ds_mla tile scales are read ("": f32).
	scaleRead ScaleRead
	// lut[q][code] is the dequantized value of an fp8_e4m3 code at
	// precision q (see deqIndex); for fp8_ds_mla only lut[exact] is used, as
	// the plain E4M3 decode table.
	lut [4][256]float64
	// With Scales (NewScaled, fp8_e4m3 only): scaled is set, lut holds the
	// latent part's per-tensor scale, ropeLUT the rope part's, plain the
	// unscaled E4M3 values and tiles the per-tile latent scales, if any.
	scaled  bool
	ropeLUT [4][256]float64
	plain   [256]float64
	tiles   []float32
}

// The dequantization precisions a reader may emulate, indexed as lut is.
const (
	deqExact = iota // float64: e4m3 * scale, exact (a 4-bit by 24-bit product)
	deqF32          // the product rounded to fp32 (vLLM's gather)
	deqBF16         // the fp32 product rounded to bf16 (FlashMLA)
	deqF16          // the fp32 product rounded to fp16
)

func deqIndex(d tensor.DType) int {
	switch d {
	case tensor.F64:
		return deqExact
	case tensor.F32:
		return deqF32
	case tensor.BF16:
		return deqBF16
	case tensor.F16:
		return deqF16
	}
	panic(fmt.Sprintf("kvcache: dequantization to %q is not a precision (want F64, F32, BF16 or F16)", d))
}

// New checks that t is a cache of layout l and returns a view of it. kScale
// is the per-tensor scale of fp8_e4m3 and is ignored otherwise.
func New(t *tensor.Tensor, l Layout, kScale float64) (*Cache, error) {
	return NewNamed("cache", t, l, kScale)
}

// NewNamed is New for a cache tensor the contract calls name (k_cache,
// kv_cache...), so that errors name it.
func NewNamed(name string, t *tensor.Tensor, l Layout, kScale float64) (*Cache, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	if err := l.checkCache(name, t); err != nil {
		return nil, err
	}
	c := &Cache{Layout: l, NB: t.Shape[0], KScale: kScale, data: t.Data}
	if l.Kind == FP8E4M3 {
		if err := CheckKScale(kScale); err != nil {
			return nil, err
		}
	}
	ks32 := float32(kScale)
	for code := 0; code < 256; code++ {
		v := formats.E4M3FN.Decode(uint8(code))
		if l.Kind != FP8E4M3 {
			c.lut[deqExact][code] = v
			continue
		}
		c.lut[deqExact][code] = v * float64(ks32)
		p := float32(v) * ks32
		c.lut[deqF32][code] = float64(p)
		c.lut[deqBF16][code] = float64(formats.BF16Decode(formats.BF16Encode(p)))
		c.lut[deqF16][code] = float64(formats.FP16Decode(formats.FP16Encode(p)))
	}
	return c, nil
}

// CodeValue is the value Row gives an fp8_e4m3 code at precision deq
// (F64, F32, BF16 or F16) where every column of an entry is its code times
// the one per-tensor scale, so that a code's value is the same in every
// entry; ok is false for the other layouts (16-bit, per-tile or per-part
// scales), whose values no code alone determines.
func (c *Cache) CodeValue(code byte, deq tensor.DType) (v float64, ok bool) {
	if c.Layout.Kind != FP8E4M3 || c.scaled {
		return 0, false
	}
	return c.lut[deqIndex(deq)][code], true
}

// Entries is the cache's bytes, [NB, P, entry bytes] row-major: what an
// fp8_e4m3 row's codes are read from (read-only).
func (c *Cache) Entries() []byte { return c.data }

// Slots is the number of token entries (NB * P).
func (c *Cache) Slots() int { return c.NB * c.Layout.PageSize }

// D is the number of values Row decodes.
func (c *Cache) D() int { return c.Layout.D() }

// Row decodes the token at (block, offset) into dst[:D]. deq is the precision
// the reader dequantizes an fp8 value to: F64 for the exact value e4m3·scale,
// F32 for the fp32 product (vLLM's gather), BF16 for the fp32 product rounded
// to bf16 (FlashMLA, kv_dequant_dtype), F16 likewise. BF16 and F16 entries
// (the bf16 and fp16 layouts, fp8_ds_mla's rope part) are exact at every
// precision.
//
// Row does not check its arguments beyond what slice indexing does: callers
// validate the block table first (Pages), as a kernel trusts its inputs.
func (c *Cache) Row(block, offset int, dst []float64, deq tensor.DType) {
	c.RowSlot(block*c.Layout.PageSize+offset, dst, deq)
}

// RowSlot is Row for slot = block*P + offset (sparse attention's indices).
func (c *Cache) RowSlot(slot int, dst []float64, deq tensor.DType) {
	l := &c.Layout
	d := l.L + l.R
	dst = dst[:d]
	switch l.Kind {
	case BF16:
		widenBF16(dst, c.data[2*d*slot:2*d*(slot+1)])
	case FP16:
		widenFP16(dst, c.data[2*d*slot:2*d*(slot+1)])
	case FP8E4M3:
		b := c.data[d*slot : d*(slot+1)]
		if c.scaled {
			c.rowScaled(slot, b, dst, deqIndex(deq))
			return
		}
		lut := &c.lut[deqIndex(deq)]
		for j := range dst {
			dst[j] = lut[b[j]]
		}
	case FP8DSMLA:
		q := deqIndex(deq)
		b := c.data[DSEntryBytes*slot : DSEntryBytes*(slot+1)]
		for tile := 0; tile < DSTiles; tile++ {
			s := c.scaleRead.Factor(math.Float32frombits(binary.LittleEndian.Uint32(b[DSScaleOff+4*tile:])))
			c.deqTile(dst[tile*DSTile:(tile+1)*DSTile], b[tile*DSTile:(tile+1)*DSTile], s, q)
		}
		widenBF16(dst[DSLatent:DSLatent+DSRope], b[DSRopeOff:DSRopeOff+2*DSRope])
	case FP8DSMLAModel1:
		q := deqIndex(deq)
		data, scales := l.m1Rows(c.data, slot)
		for tile := 0; tile < M1Tiles; tile++ {
			c.deqTile(dst[tile*M1Tile:(tile+1)*M1Tile], data[tile*M1Tile:(tile+1)*M1Tile], float32(formats.E8M0.Decode(scales[tile])), q)
		}
		widenBF16(dst[M1Nope:M1Nope+M1Rope], data[M1Nope:M1DataBytes])
	case FP8DSMLAV41:
		q := deqIndex(deq)
		b := c.data[V41EntryBytes*slot : V41EntryBytes*(slot+1)]
		for tile := 0; tile < V41Tiles; tile++ {
			c.deqTile(dst[tile*V41Tile:(tile+1)*V41Tile], b[tile*V41Tile:(tile+1)*V41Tile], float32(formats.E8M0.Decode(b[v41ScaleOff+tile])), q)
		}
	}
}

// deqTile dequantizes one scale tile of E4M3 codes times its scale s at
// precision q (deqIndex): the exact product, or the fp32 product rounded to
// q's format.
func (c *Cache) deqTile(out []float64, lat []byte, s float32, q int) {
	deqTileTable(&c.lut[deqExact], out, lat, s, q)
}

// deqTileTable is deqTile with dec the plain E4M3 decode table.
func deqTileTable(dec *[256]float64, out []float64, lat []byte, s float32, q int) {
	switch q {
	case deqExact:
		s64 := float64(s)
		for j, code := range lat {
			out[j] = dec[code] * s64
		}
	case deqF32:
		for j, code := range lat {
			out[j] = float64(float32(dec[code]) * s)
		}
	case deqBF16:
		for j, code := range lat {
			out[j] = float64(formats.BF16Decode(formats.BF16Encode(float32(dec[code]) * s)))
		}
	default:
		for j, code := range lat {
			out[j] = float64(formats.FP16Decode(formats.FP16Encode(float32(dec[code]) * s)))
		}
	}
}

// TileScale returns the stored F32 scale of fp8_ds_mla tile (0..3) of a slot.
func (c *Cache) TileScale(slot, tile int) float32 {
	return math.Float32frombits(binary.LittleEndian.Uint32(c.data[DSEntryBytes*slot+DSScaleOff+4*tile:]))
}
