package kvcache

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// TieRelTol is how far (relative) a kernel's fp32 quotient x/scale may sit
// from the exact one: a correctly rounded fp32 division is within 2^-24, a
// reciprocal-multiply (x * (1/s)) within about 2^-23, a tile scale rounded
// one or two ulps differently adds as much again. 2^-20 covers these with
// room and is still far below the E4M3 spacing (2^-4 relative), so only codes
// at a rounding midpoint are affected.
const TieRelTol = 0x1p-20

// Written is the result of a cache write: the cache a correct engine kernel
// leaves (After, Expected), the float64 one (Exact), which token each entry
// now holds, and what else would also be correct (Equivalent).
type Written struct {
	Layout Layout
	// After is cache_before with every token of slot >= 0 written as the
	// engines' kernels do it: x/scale as one fp32 division, then E4M3
	// round-to-nearest-even (vLLM scaled_convert: __nv_cvt_float_to_fp8(
	// float(x) / scale, __NV_SATFINITE, __NV_E4M3)).
	After *tensor.Tensor
	// Exact is the same write with x/scale divided in float64.
	Exact *tensor.Tensor
	// TokenAt[slot] is the token written at slot (block*P + offset), -1
	// where none was.
	TokenAt []int32

	before, kvc, kpe *tensor.Tensor
	kScale           float64
	// scales[t*DSTiles+tile] are the tile scales a correct fp8_ds_mla writer
	// of the declared convention may store for token t (first: the one
	// After holds).
	scales [][]float32
}

// Write returns the result of writing tokens kv_c [T', L] and k_pe [T', R]
// (any float dtype; the contract's are BF16) to the slots of slots (T <= T'
// entries: as vLLM V1, rows past len(slots) are CUDA-graph padding and are not
// written) into a copy of before. before is never modified. kScale is
// fp8_e4m3's per-tensor scale (ignored by the other layouts).
func Write(before, kvc, kpe *tensor.Tensor, slots []int64, l Layout, kScale float64) (*Written, error) {
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
			return nil, fmt.Errorf("tensor %s has dtype %s; want BF16", in.name, in.t.DType)
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
	nb := before.Shape[0]
	if err := CheckSlots(slots, nb, l.PageSize); err != nil {
		return nil, err
	}
	w := &Written{
		Layout: l, After: before.Clone(), Exact: before.Clone(),
		TokenAt: make([]int32, nb*l.PageSize),
		before:  before, kvc: kvc, kpe: kpe, kScale: kScale,
	}
	for i := range w.TokenAt {
		w.TokenAt[i] = -1
	}
	if l.Kind == FP8DSMLA {
		w.scales = make([][]float32, len(slots)*DSTiles)
	}
	for t, s := range slots {
		if s < 0 {
			continue
		}
		w.TokenAt[s] = int32(t)
		w.writeToken(t, int(s))
	}
	return w, nil
}

func (w *Written) overflow() formats.Overflow {
	if w.Layout.Saturate {
		return formats.Saturate
	}
	return formats.NoSaturate
}

// value returns token t's value at entry column j of the D values (kv_c then k_pe).
func (w *Written) value(t, j int) float64 {
	if j < w.Layout.L {
		return w.kvc.Float64At(t*w.Layout.L + j)
	}
	return w.kpe.Float64At(t*w.Layout.R + j - w.Layout.L)
}

// bf16Bits returns the BF16 bits of token t's value j: the input's own bits
// when it is BF16 (a copy keeps NaN payloads), else the rounded value.
func (w *Written) bf16Bits(t, j int) uint16 {
	src, k := w.kvc, t*w.Layout.L+j
	if j >= w.Layout.L {
		src, k = w.kpe, t*w.Layout.R+j-w.Layout.L
	}
	if src.DType == tensor.BF16 {
		return binary.LittleEndian.Uint16(src.Data[2*k:])
	}
	return formats.BF16FromFloat64(src.Float64At(k))
}

func (w *Written) writeToken(t, slot int) {
	l := &w.Layout
	e := l.EntrySize()
	after, exact := w.After.Data, w.Exact.Data
	ov := w.overflow()
	switch l.Kind {
	case BF16:
		base := 2 * e * slot
		for j := 0; j < l.D(); j++ {
			b := w.bf16Bits(t, j)
			binary.LittleEndian.PutUint16(after[base+2*j:], b)
			binary.LittleEndian.PutUint16(exact[base+2*j:], b)
		}
	case FP8E4M3:
		base := e * slot
		ks32 := float32(w.kScale)
		for j := 0; j < l.D(); j++ {
			x := w.value(t, j)
			after[base+j], _ = formats.E4M3FN.Encode(float64(float32(x)/ks32), ov)
			exact[base+j], _ = formats.E4M3FN.Encode(x/float64(ks32), ov)
		}
	case FP8DSMLA:
		base := DSEntryBytes * slot
		for tile := 0; tile < DSTiles; tile++ {
			amax := 0.0
			for j := tile * DSTile; j < (tile+1)*DSTile; j++ {
				if a := math.Abs(w.value(t, j)); a > amax { // NaN is skipped, as fmaxf does
					amax = a
				}
			}
			ok := TileScales(amax, l.DSScale)
			s := ok[0]
			w.scales[t*DSTiles+tile] = ok
			binary.LittleEndian.PutUint32(after[base+DSScaleOff+4*tile:], math.Float32bits(s))
			binary.LittleEndian.PutUint32(exact[base+DSScaleOff+4*tile:], math.Float32bits(s))
			for j := tile * DSTile; j < (tile+1)*DSTile; j++ {
				x := w.value(t, j)
				after[base+j], _ = formats.E4M3FN.Encode(float64(float32(x)/s), ov)
				exact[base+j], _ = formats.E4M3FN.Encode(x/float64(s), ov)
			}
		}
		for j := 0; j < DSRope; j++ {
			b := w.bf16Bits(t, DSLatent+j)
			binary.LittleEndian.PutUint16(after[base+DSRopeOff+2*j:], b)
			binary.LittleEndian.PutUint16(exact[base+DSRopeOff+2*j:], b)
		}
	}
}

// TileScale is the F32 tile scale a writer of convention conv stores for a
// tile whose largest magnitude is amax (a BF16 value, so exact in fp32).
//
//   - amax (vLLM concat_and_cache_ds_mla_kernel): tile_scale = max_abs / 448.f
//     (one IEEE fp32 division), then fmaxf(tile_scale, FLT_MIN).
//   - pow2 (FlashMLA tests/quant.py, _cast_scale_inv_to_ue8m0): the fp32
//     quotient amax.float() / 448.0, clamp_min(1e-4), then
//     pow(2, ceil(log2(s))), computed here exactly from the fp32 quotient.
func TileScale(amax float64, conv ScaleConvention) float32 {
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
	if half := float64(s) / 2; q <= half*(1+TieRelTol) {
		out = append(out, float32(half))
	}
	if q >= float64(s)*(1-TieRelTol) {
		out = append(out, 2*s)
	}
	return out
}

// Equivalent reports whether a value that differs from After at flat element
// i of the cache is still what a correct writer may leave there: an fp8 code
// at an E4M3 rounding midpoint (within TieRelTol) rounded the other way, a
// code of equal value (±0, NaN payloads), or an fp8_ds_mla tile scale another
// correct writer of the declared convention stores (and the codes it gives).
// An entry no token was written to must be unchanged, so no difference there
// is ever equivalent: it is a stray write. actual is the element's value as
// tensor.Float64At reads it (the byte for U8 caches).
func (w *Written) Equivalent(i int, actual float64) bool {
	l := &w.Layout
	e := l.EntrySize()
	if i < 0 || i >= len(w.TokenAt)*e {
		return false
	}
	want := w.After.Float64At(i)
	fp8Typed := w.After.DType == tensor.F8E4M3
	if (w.After.DType == tensor.BF16 || fp8Typed) && math.IsNaN(want) && math.IsNaN(actual) {
		return true // NaN compares by position, never by payload
	}
	t := int(w.TokenAt[i/e])
	if t < 0 {
		return false
	}
	col := i % e
	switch l.Kind {
	case FP8E4M3:
		code, ok := w.codeOf(actual)
		return ok && w.fp8Accept(code, w.value(t, col), float64(float32(w.kScale)))
	case FP8DSMLA:
		part, tile := l.PartOf(col)
		code, ok := w.codeOf(actual)
		if !ok || part == PartRope {
			return false // k_pe is copied, never rounded
		}
		scales := w.scales[t*DSTiles+tile]
		switch part {
		case PartLatent:
			x := w.value(t, col)
			for _, s := range scales {
				if w.fp8Accept(code, x, float64(s)) {
					return true
				}
			}
		case PartScale:
			k := uint((col - DSScaleOff) % 4)
			for _, s := range scales {
				if uint8(math.Float32bits(s)>>(8*k)) == code {
					return true
				}
			}
		}
	}
	return false
}

// codeOf turns an element value back into its byte.
func (w *Written) codeOf(actual float64) (uint8, bool) {
	if w.After.DType == tensor.F8E4M3 {
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
func (w *Written) fp8Accept(code uint8, x, s float64) bool {
	q := x / s
	ov := w.overflow()
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
