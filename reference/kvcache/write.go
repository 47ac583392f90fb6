package kvcache

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/parallel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// TieRelTol is how far (relative) a kernel's fp32 quotient x/scale may sit
// from the exact one: a correctly rounded fp32 division is within 2^-24, a
// reciprocal-multiply (x * (1/s)) within about 2^-23, a tile scale rounded
// one or two ulps differently adds as much again. 2^-20 covers these with
// room and is still far below the E4M3 spacing (2^-4 relative), so only codes
// at a rounding midpoint are affected.
const TieRelTol = 0x1p-20

// Overlay is a cache write held as what it changes: cache_before, never
// copied and never modified, and the slots written with the token each now
// holds. A written entry's bytes are computed when asked for (EntryInto,
// Value), from the token's kv_c and k_pe, so an Overlay's memory grows with
// the tokens written (16 bytes each, 32 more for fp8_ds_mla's tile amaxes),
// not with the cache: a check of a 600 MB cache holds no copy of it.
//
// An entry is computed two ways: as the engines' kernels write it (the
// expected cache: x/scale as one fp32 division, then E4M3
// round-to-nearest-even, as vLLM's scaled_convert does
// __nv_cvt_float_to_fp8(float(x) / scale, __NV_SATFINITE, __NV_E4M3)), and
// exactly (x/scale divided in float64). BF16 and F16 entries and
// fp8_ds_mla's rope part are the token's value rounded to the cache's dtype
// (a copy when the token has that dtype), the same bytes both ways; the
// exact values of a float layout are the unrounded ones (ExactValue). An Overlay is read-only once built and
// safe for concurrent use.
type Overlay struct {
	Layout Layout
	// Before is cache_before.
	Before *tensor.Tensor
	// written lists the written entries by ascending slot.
	written []writtenEntry
	// amax[k*tiles+tile] is the largest magnitude in that tile of the
	// latent values of written[k]'s token (the scaled layouts only): the
	// tile scales a correct writer may store follow from it (TileScales).
	amax     []float64
	kvc, kpe *tensor.Tensor
	kScale   float64
}

type writtenEntry struct {
	slot  int64
	token int32
}

// NewOverlay returns the write of tokens kv_c [T', L] and k_pe [T', R] (any
// float dtype; the contract's are BF16, F16 and F32) to the slots of slots (T <= T'
// entries: as vLLM V1, rows past len(slots) are CUDA-graph padding and are
// not written; a negative slot skips its token) over before. kScale is
// fp8_e4m3's per-tensor scale (ignored by the other layouts). Errors name
// the tensor at fault.
func NewOverlay(before, kvc, kpe *tensor.Tensor, slots []int64, l Layout, kScale float64) (*Overlay, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	if err := l.checkCache("cache_before", before); err != nil {
		return nil, err
	}
	for _, in := range []struct {
		name string
		t    *tensor.Tensor
		dim  int
		what string
	}{{"kv_c", kvc, l.L, "L"}, {"k_pe", kpe, l.R, "R"}} {
		if err := in.t.Check(); err != nil {
			return nil, fmt.Errorf("tensor %s: %v", in.name, err)
		}
		if !in.t.DType.IsFloat() {
			return nil, fmt.Errorf("tensor %s has dtype %s; want BF16, F16 or F32", in.name, in.t.DType)
		}
		if len(in.t.Shape) != 2 || in.t.Shape[1] != in.dim {
			return nil, fmt.Errorf("tensor %s has shape %v; want [T, %d] (%s = %d)", in.name, in.t.Shape, in.dim, in.what, in.dim)
		}
	}
	if kvc.Shape[0] != kpe.Shape[0] {
		return nil, fmt.Errorf("tensor k_pe has %d tokens but kv_c has %d", kpe.Shape[0], kvc.Shape[0])
	}
	if len(slots) > kvc.Shape[0] {
		return nil, fmt.Errorf("tensor slot_mapping has %d tokens but kv_c has only %d rows", len(slots), kvc.Shape[0])
	}
	if l.Kind == FP8E4M3 {
		if err := CheckKScale(kScale); err != nil {
			return nil, err
		}
	}
	if err := CheckSlots(slots, before.Shape[0], l.PageSize); err != nil {
		return nil, err
	}
	o := &Overlay{Layout: l, Before: before, kvc: kvc, kpe: kpe, kScale: kScale}
	for t, s := range slots {
		if s >= 0 {
			o.written = append(o.written, writtenEntry{s, int32(t)})
		}
	}
	// CheckSlots has made the slots distinct, so the order is total.
	slices.SortFunc(o.written, func(a, b writtenEntry) int { return cmp.Compare(a.slot, b.slot) })
	if tiles, size := l.scaleTiles(); tiles > 0 {
		// Each entry's maxima are its own, so the entries are shared out
		// on every core (a block at a time), each token decoded a row at
		// a time: the serial element-by-element loop was a tenth of a
		// failing fp8_ds_mla write check of 262144 tokens (issue 17).
		o.amax = make([]float64, len(o.written)*tiles)
		const perUnit = 256
		_ = parallel.Each(context.Background(), (len(o.written)+perUnit-1)/perUnit, func(u int) {
			var scratch [tokenScratch]float64
			for k := u * perUnit; k < min((u+1)*perUnit, len(o.written)); k++ {
				vals := o.tokenValues(int(o.written[k].token), scratch[:])
				for tile := 0; tile < tiles; tile++ {
					amax := 0.0
					for _, v := range vals[tile*size : (tile+1)*size] {
						if a := math.Abs(v); a > amax { // NaN is skipped, as fmaxf does
							amax = a
						}
					}
					o.amax[k*tiles+tile] = amax
				}
			}
		})
	}
	return o, nil
}

// scaleTiles is the number of scale tiles of a token's latent part and the
// values in each (0, 0 for the layouts without tile scales).
func (l Layout) scaleTiles() (tiles, size int) {
	switch l.Kind {
	case FP8DSMLA:
		return DSTiles, DSTile
	case FP8DSMLAModel1:
		return M1Tiles, M1Tile
	case FP8DSMLAV41:
		return V41Tiles, V41Tile // over all D values: the rope is quantized too
	}
	return 0, 0
}

// Written is the number of entries the write changes.
func (o *Overlay) Written() int { return len(o.written) }

// Find returns the index k (0 <= k < Written()) of the entry written at slot
// (block*P + offset), or -1 when no token was written there.
func (o *Overlay) Find(slot int) int {
	k, ok := slices.BinarySearchFunc(o.written, int64(slot), func(w writtenEntry, s int64) int { return cmp.Compare(w.slot, s) })
	if !ok {
		return -1
	}
	return k
}

// TokenAt returns the token written at slot, -1 where none was.
func (o *Overlay) TokenAt(slot int) int {
	if k := o.Find(slot); k >= 0 {
		return int(o.written[k].token)
	}
	return -1
}

// EntryBytes is the size in bytes of one cache entry.
func (o *Overlay) EntryBytes() int { return o.Layout.EntrySize() * o.Before.DType.Size() }

// EntryInto writes the bytes of written entry k (as Find numbers them) into
// dst[:EntryBytes()], in entry-column order (Layout.Offset places them in
// the cache): as a correct engine kernel writes them, or exactly.
func (o *Overlay) EntryInto(k int, exact bool, dst []byte) {
	l := &o.Layout
	t := int(o.written[k].token)
	dst = dst[:o.EntryBytes()]
	switch l.Kind {
	case BF16, FP16:
		for j := 0; j < l.D(); j++ {
			binary.LittleEndian.PutUint16(dst[2*j:], o.floatBits(t, j, o.Before.DType))
		}
	case FP8E4M3:
		ks32 := float32(o.kScale)
		var scratch [tokenScratch]float64
		vals := o.tokenValues(t, scratch[:])
		for j, v := range vals {
			dst[j] = o.quantize(v, ks32, exact)
		}
	case FP8DSMLA:
		var scratch [tokenScratch]float64
		vals := o.tokenValues(t, scratch[:])
		for tile := 0; tile < DSTiles; tile++ {
			// Both ways store the scale a correct writer stores; only the
			// division by it differs.
			s := TileScale(o.amax[k*DSTiles+tile], l.DSScale)
			binary.LittleEndian.PutUint32(dst[DSScaleOff+4*tile:], math.Float32bits(s))
			for j := tile * DSTile; j < (tile+1)*DSTile; j++ {
				dst[j] = o.quantize(vals[j], s, exact)
			}
		}
		for j := 0; j < DSRope; j++ {
			binary.LittleEndian.PutUint16(dst[DSRopeOff+2*j:], o.floatBits(t, DSLatent+j, tensor.BF16))
		}
	case FP8DSMLAModel1:
		var scratch [tokenScratch]float64
		vals := o.tokenValues(t, scratch[:])
		for tile := 0; tile < M1Tiles; tile++ {
			s := TileScale(o.amax[k*M1Tiles+tile], l.DSScale)
			dst[m1ScaleOff+tile] = formats.E8M0.Encode(float64(s)) // a power of two: exact
			for j := tile * M1Tile; j < (tile+1)*M1Tile; j++ {
				dst[j] = o.quantize(vals[j], s, exact)
			}
		}
		dst[m1PadCol] = 0 // as vLLM's writer (cache_utils.py:154-155); FlashMLA's leaves it unwritten
		for j := 0; j < M1Rope; j++ {
			binary.LittleEndian.PutUint16(dst[m1RopeOff+2*j:], o.floatBits(t, M1Nope+j, tensor.BF16))
		}
	case FP8DSMLAV41:
		var scratch [tokenScratch]float64
		vals := o.tokenValues(t, scratch[:])
		for tile := 0; tile < V41Tiles; tile++ {
			s := TileScale(o.amax[k*V41Tiles+tile], l.DSScale)
			dst[v41ScaleOff+tile] = formats.E8M0.Encode(float64(s))
			for j := tile * V41Tile; j < (tile+1)*V41Tile; j++ {
				dst[j] = o.quantize(vals[j], s, exact)
			}
		}
	}
}

// quantize is the E4M3 code of x/s: the fp32 quotient, or the exact one.
func (o *Overlay) quantize(x float64, s float32, exact bool) uint8 {
	q := x / float64(s)
	if !exact {
		q = float64(float32(x) / s)
	}
	return formats.E4M3FN.Code(q, o.overflow())
}

// Value returns flat element i of the cache after the write, as
// tensor.Float64At reads it (the byte for U8 caches): cache_before's where
// no token was written. It computes a whole entry to read one element;
// sequential readers should keep the entry (EntryInto) instead.
func (o *Overlay) Value(i int, exact bool) float64 {
	e := o.Layout.EntrySize()
	slot, col := o.Layout.Entry(i)
	k := o.Find(slot)
	if k < 0 {
		return o.Before.Float64At(i)
	}
	entry := &tensor.Tensor{DType: o.Before.DType, Shape: []int{e}, Data: make([]byte, o.EntryBytes())}
	o.EntryInto(k, exact, entry.Data)
	return entry.Float64At(col)
}

// Cache returns the whole cache after the write, as a new tensor: the
// expected one, or the exact one.
func (o *Overlay) Cache(exact bool) *tensor.Tensor {
	c := o.Before.Clone()
	eb := o.EntryBytes()
	if o.Layout.Kind.BlockSplit() { // a byte entry in two runs: data row, scale row
		buf := make([]byte, eb)
		for k, w := range o.written {
			o.EntryInto(k, exact, buf)
			copy(c.Data[o.Layout.Offset(int(w.slot), 0):], buf[:M1DataBytes])
			copy(c.Data[o.Layout.Offset(int(w.slot), m1ScaleOff):], buf[m1ScaleOff:])
		}
		return c
	}
	for k, w := range o.written {
		s := int(w.slot)
		o.EntryInto(k, exact, c.Data[s*eb:(s+1)*eb])
	}
	return c
}

// Written is a write with its caches materialized, for tests and small
// caches: the checker reads the Overlay, which holds no copy of the cache.
type Written struct {
	*Overlay
	// After is cache_before with every token of slot >= 0 written as the
	// engines' kernels write it; Exact is the same write with x/scale
	// divided in float64.
	After, Exact *tensor.Tensor
}

// Write is NewOverlay with both caches materialized into copies of before
// (which is never modified).
func Write(before, kvc, kpe *tensor.Tensor, slots []int64, l Layout, kScale float64) (*Written, error) {
	o, err := NewOverlay(before, kvc, kpe, slots, l, kScale)
	if err != nil {
		return nil, err
	}
	return &Written{Overlay: o, After: o.Cache(false), Exact: o.Cache(true)}, nil
}

func (o *Overlay) overflow() formats.Overflow {
	if o.Layout.Saturate {
		return formats.Saturate
	}
	return formats.NoSaturate
}

// value returns token t's value at entry column j of the D values (kv_c then k_pe).
// tokenScratch is the most values of a token tokenValues decodes into a
// caller's array on its stack (an entry's L + R: 576 for MLA's caches).
const tokenScratch = 1024

// tokenValues is token t's L + R values, value(t, j) for every j, decoded
// a row at a time into scratch (or a new slice where it is too short).
func (o *Overlay) tokenValues(t int, scratch []float64) []float64 {
	l, r := o.Layout.L, o.Layout.R
	if len(scratch) < l+r {
		scratch = make([]float64, l+r)
	}
	vals := scratch[:l+r]
	o.kvc.RowInto(vals[:l], t*l, l)
	o.kpe.RowInto(vals[l:], t*r, r)
	return vals
}

func (o *Overlay) value(t, j int) float64 {
	if j < o.Layout.L {
		return o.kvc.Float64At(t*o.Layout.L + j)
	}
	return o.kpe.Float64At(t*o.Layout.R + j - o.Layout.L)
}

// floatBits returns the bits of token t's value j stored as d (BF16 or
// F16): the input's own bits when it is of that dtype (a copy keeps NaN
// payloads), else the value rounded to nearest even (a bf16 value past
// fp16's 65504 rounds to inf, as a cast does: Compare names it an overflow).
// The contract's inputs (BF16, F16, F32) are float32 values, so the one
// rounding of FP16Encode is the only one.
func (o *Overlay) floatBits(t, j int, d tensor.DType) uint16 {
	src, k := o.kvc, t*o.Layout.L+j
	if j >= o.Layout.L {
		src, k = o.kpe, t*o.Layout.R+j-o.Layout.L
	}
	if src.DType == d {
		return binary.LittleEndian.Uint16(src.Data[2*k:])
	}
	if d == tensor.F16 {
		return formats.FP16Encode(float32(src.Float64At(k)))
	}
	return formats.BF16FromFloat64(src.Float64At(k))
}

// ExactValue is element col of written entry k (as Find numbers them) for
// the float layouts (bf16, fp16): the token's value before the cache's
// rounding, which is what the exact reference of a write holds (a value an
// fp16 cache rounds to inf stays finite there). ok is false for the fp8
// layouts, whose exact entry is bytes (EntryInto).
func (o *Overlay) ExactValue(k, col int) (v float64, ok bool) {
	if !o.Layout.Kind.IsFloat() {
		return 0, false
	}
	return o.value(int(o.written[k].token), col), true
}

// TileScale is the F32 tile scale a writer of convention conv stores for a
// tile whose largest magnitude is amax (a BF16 value, so exact in fp32).
//
//   - amax (vLLM concat_and_cache_ds_mla_kernel): tile_scale = max_abs / 448.f
//     (one IEEE fp32 division), then fmaxf(tile_scale, FLT_MIN).
//   - pow2 (FlashMLA tests/quant.py, _cast_scale_inv_to_ue8m0): the fp32
//     quotient amax.float() / 448.0, clamp_min(1e-4), then
//     pow(2, ceil(log2(s))), computed here exactly from the fp32 quotient.
//   - pow2_amax_floor (vLLM's DeepSeek-V4 writer): max(amax, 1e-4) / 448
//     in fp32, then 2^ceil(log2 s).
func TileScale(amax float64, conv ScaleConvention) float32 {
	if conv == ScalePow2AmaxFloor {
		return ceilPow2(max(float32(amax), float32(1e-4)) / e4m3Max)
	}
	s := float32(amax) / e4m3Max
	if conv == ScalePow2 {
		if s < float32(1e-4) {
			s = float32(1e-4)
		}
		return ceilPow2(s)
	}
	if s < 0x1p-126 { // FLT_MIN
		s = 0x1p-126
	}
	return s
}

// ceilPow2 is 2^ceil(log2 s) for s > 0, exactly.
func ceilPow2(s float32) float32 {
	frac, e := math.Frexp(float64(s)) // s = frac * 2^e, frac in [0.5, 1)
	if frac == 0.5 {
		return s
	}
	return float32(math.Ldexp(1, e))
}

// TileScales is TileScale followed by every other scale a correct writer of
// that convention may store: within two fp32 ulps for amax (a reciprocal or
// approximate division), and for pow2 the neighbouring power of two when the
// quotient lies within TieRelTol of a power of two (fp32 log2 rounding).
func TileScales(amax float64, conv ScaleConvention) []float32 {
	s := TileScale(amax, conv)
	out := []float32{s}
	if conv == ScaleAmax {
		lo, hi := s, s
		for k := 0; k < 2; k++ {
			lo = math.Nextafter32(lo, 0)
			hi = math.Nextafter32(hi, float32(math.Inf(1)))
			if lo >= 0x1p-126 {
				out = append(out, lo)
			}
			out = append(out, hi)
		}
		return out
	}
	q := math.Max(amax/e4m3Max, 1e-4)
	if conv == ScalePow2AmaxFloor {
		q = math.Max(amax, float64(float32(1e-4))) / e4m3Max
	}
	if half := float64(s) / 2; q <= half*(1+TieRelTol) {
		out = append(out, float32(half))
	}
	if q >= float64(s)*(1-TieRelTol) {
		out = append(out, 2*s)
	}
	return out
}

// Equivalent reports whether a value that differs from the expected cache at
// flat element i is still what a correct writer may leave there: an fp8
// code at an E4M3 rounding midpoint (within TieRelTol) rounded the other
// way, a code of equal value (±0, NaN payloads), or an fp8_ds_mla tile scale
// another correct writer of the declared convention stores (and the codes
// it gives). An entry no token was written to must be unchanged, so no
// difference there is ever equivalent: it is a stray write. actual is the
// element's value as tensor.Float64At reads it (the byte for U8 caches).
// It reads o and the inputs only, so several goroutines may call it at
// once (the comparison does: kernel.Output.EquivalentConcurrent).
func (o *Overlay) Equivalent(i int, actual float64) bool {
	l := &o.Layout
	if i < 0 || i >= o.Before.Len() {
		return false
	}
	d := o.Before.DType
	if (d == tensor.BF16 || d == tensor.F16 || d == tensor.F8E4M3) && math.IsNaN(actual) && math.IsNaN(o.Value(i, false)) {
		return true // NaN compares by position, never by payload
	}
	slot, col := l.Entry(i)
	k := o.Find(slot)
	if k < 0 {
		return false
	}
	t := int(o.written[k].token)
	switch l.Kind {
	case FP8E4M3:
		code, ok := o.codeOf(actual)
		return ok && o.fp8Accept(code, o.value(t, col), float64(float32(o.kScale)))
	case FP8DSMLA:
		part, tile := l.PartOf(col)
		code, ok := o.codeOf(actual)
		if !ok || part == PartRope {
			return false // k_pe is copied, never rounded
		}
		scales := TileScales(o.amax[k*DSTiles+tile], l.DSScale)
		switch part {
		case PartLatent:
			x := o.value(t, col)
			for _, s := range scales {
				if o.fp8Accept(code, x, float64(s)) {
					return true
				}
			}
		case PartScale:
			b := uint((col - DSScaleOff) % 4)
			for _, s := range scales {
				if uint8(math.Float32bits(s)>>(8*b)) == code {
					return true
				}
			}
		}
	case FP8DSMLAModel1:
		part, tile := l.PartOf(col)
		code, ok := o.codeOf(actual)
		if !ok || part == PartRope {
			return false // k_pe is copied, never rounded
		}
		if tile < 0 {
			return true // the pad byte: no reader reads it, and FlashMLA's writer leaves it as it was
		}
		for _, s := range TileScales(o.amax[k*M1Tiles+tile], l.DSScale) {
			if part == PartScale && formats.E8M0.Encode(float64(s)) == code ||
				part == PartLatent && o.fp8Accept(code, o.value(t, col), float64(s)) {
				return true
			}
		}
	case FP8DSMLAV41:
		part, tile := l.PartOf(col)
		code, ok := o.codeOf(actual)
		if !ok {
			return false
		}
		for _, s := range TileScales(o.amax[k*V41Tiles+tile], l.DSScale) {
			if part == PartScale && formats.E8M0.Encode(float64(s)) == code ||
				part != PartScale && o.fp8Accept(code, o.value(t, col), float64(s)) {
				return true
			}
		}
	}
	return false
}

// codeOf turns an element value back into its byte.
func (o *Overlay) codeOf(actual float64) (uint8, bool) {
	if o.Before.DType == tensor.F8E4M3 {
		if math.IsNaN(actual) {
			return 0x7F, true
		}
		c, acc := formats.E4M3FN.Encode(actual, formats.Saturate)
		return c, acc == formats.Exact
	}
	if actual < 0 || actual > 255 || actual != math.Trunc(actual) {
		return 0, false
	}
	return uint8(actual), true
}

// fp8Accept reports whether code is a correct E4M3 encoding of x/s for a
// writer whose quotient is within TieRelTol of the exact one.
func (o *Overlay) fp8Accept(code uint8, x, s float64) bool {
	q := x / s
	ov := o.overflow()
	got := formats.E4M3FN.Decode(code)
	for _, qq := range []float64{q, q * (1 - TieRelTol), q * (1 + TieRelTol)} {
		c, _ := formats.E4M3FN.Encode(qq, ov)
		v := formats.E4M3FN.Decode(c)
		if c == code || v == got || (math.IsNaN(v) && math.IsNaN(got)) {
			return true
		}
	}
	return false
}
