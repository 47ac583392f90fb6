// Package formats holds the narrow number formats that inference kernels store
// tensors in (E2M1, E4M3FN, E5M2, E8M0, BF16, FP16), bit-exact, each described
// as data (exponent bits, mantissa bits, bias, special codes) rather than as a
// hand-written converter per format.
//
// Every conversion to a narrow format rounds to nearest, ties to even, as the
// CUDA intrinsics do (cuda_fp8.h __nv_cvt_float_to_fp8, cuda_bf16.h
// __float2bfloat16). Conversions report how they rounded (Accuracy), so a
// checker can tell a code that differs only at a rounding tie from one that is
// wrong.
package formats

import (
	"math"

	"github.com/x448/float16"
)

// Minifloat describes a sign-exponent-mantissa format of at most 8 bits, in the
// spirit of strconv's floatInfo: the format is data, one algorithm serves all.
type Minifloat struct {
	Name     string
	ExpBits  uint
	MantBits uint
	Bias     int
	// HasInf: the all-ones exponent with zero mantissa is infinity (E5M2).
	HasInf bool
	// IEEENaN: every all-ones-exponent code with nonzero mantissa is NaN
	// (E5M2). When false, only the all-ones code (S.1111.111 for E4M3FN) is
	// NaN, and the rest of the top binade holds finite values ("FN").
	IEEENaN bool
	// NoNaN: the format has no NaN at all (E2M1).
	NoNaN bool
}

// The OCP 8-bit floating point formats and the OCP MX FP4 element format.
var (
	E2M1   = &Minifloat{Name: "e2m1", ExpBits: 2, MantBits: 1, Bias: 1, NoNaN: true}
	E4M3FN = &Minifloat{Name: "e4m3fn", ExpBits: 4, MantBits: 3, Bias: 7}
	E5M2   = &Minifloat{Name: "e5m2", ExpBits: 5, MantBits: 2, Bias: 15, HasInf: true, IEEENaN: true}
)

// Bits is the total width of the format, sign included.
func (f *Minifloat) Bits() uint { return 1 + f.ExpBits + f.MantBits }

func (f *Minifloat) signBit() uint8 { return 1 << (f.ExpBits + f.MantBits) }

func (f *Minifloat) maxExpField() int { return 1<<f.ExpBits - 1 }

// IsNaN reports whether code is a NaN of f.
func (f *Minifloat) IsNaN(code uint8) bool {
	if f.NoNaN {
		return false
	}
	mag := code &^ f.signBit()
	e := int(mag >> f.MantBits)
	m := mag & (1<<f.MantBits - 1)
	if f.IEEENaN {
		return e == f.maxExpField() && m != 0
	}
	return e == f.maxExpField() && m == 1<<f.MantBits-1
}

// IsInf reports whether code is an infinity of f.
func (f *Minifloat) IsInf(code uint8) bool {
	mag := code &^ f.signBit()
	return f.HasInf && mag == uint8(f.maxExpField())<<f.MantBits
}

// Decode returns the exact value of code (its bits above Bits() are ignored).
func (f *Minifloat) Decode(code uint8) float64 {
	code &= 1<<f.Bits() - 1
	neg := code&f.signBit() != 0
	if f.IsNaN(code) {
		return math.NaN()
	}
	if f.IsInf(code) {
		if neg {
			return math.Inf(-1)
		}
		return math.Inf(1)
	}
	mag := code &^ f.signBit()
	e := int(mag >> f.MantBits)
	m := float64(mag & (1<<f.MantBits - 1))
	var v float64
	if e == 0 {
		v = math.Ldexp(m, 1-f.Bias-int(f.MantBits))
	} else {
		v = math.Ldexp(m+float64(int(1)<<f.MantBits), e-f.Bias-int(f.MantBits))
	}
	if neg {
		v = -v
	}
	return v
}

// MaxFinite is the largest finite value of f (448 for E4M3FN, 57344 for E5M2, 6 for E2M1).
func (f *Minifloat) MaxFinite() float64 {
	e := f.maxExpField()
	m := 1<<f.MantBits - 1
	if f.HasInf || f.IEEENaN {
		e-- // the top binade is inf/NaN
	} else if !f.NoNaN {
		m-- // the all-ones code is NaN
	}
	return math.Ldexp(float64(m+1<<f.MantBits), e-f.Bias-int(f.MantBits))
}

// SmallestSubnormal is the least positive value of f (2^-9 for E4M3FN, 2^-16 for E5M2).
func (f *Minifloat) SmallestSubnormal() float64 {
	return math.Ldexp(1, 1-f.Bias-int(f.MantBits))
}

// quantum is the spacing of f's values in the binade that holds |x| (x > 0, finite).
func (f *Minifloat) quantum(ax float64) float64 {
	minNormalExp := 1 - f.Bias
	_, e := math.Frexp(ax) // ax = frac * 2^e, frac in [0.5, 1)
	exp := e - 1
	if exp < minNormalExp {
		exp = minNormalExp
	}
	return math.Ldexp(1, exp-int(f.MantBits))
}

// Accuracy says how a conversion rounded, as math/big's Accuracy does.
type Accuracy int8

// The possible accuracies: the stored value is below, equal to or above the input.
const (
	Below Accuracy = -1
	Exact Accuracy = 0
	Above Accuracy = +1
)

// Overflow selects what a conversion does with a value beyond the largest finite one.
type Overflow int

const (
	// Saturate clamps to ±MaxFinite (CUDA __NV_SATFINITE); NaN stays NaN.
	Saturate Overflow = iota
	// NoSaturate gives infinity where the format has one and NaN otherwise
	// (CUDA __NV_NOSAT, ml_dtypes, torch's float8_e5m2 and float8_e4m3fn
	// before it saturated; torch 2.15's float8_e4m3fn saturates). A value that rounds to
	// MaxFinite (for E4M3FN, up to and including 464) is still finite.
	NoSaturate
)

// Round returns the value of f nearest to x (ties to even) and how it compares with x.
func (f *Minifloat) Round(x float64, ov Overflow) (float64, Accuracy) {
	code, acc := f.Encode(x, ov)
	return f.Decode(code), acc
}

// Code is Encode's code alone, for the quantizers that store it and
// discard the Accuracy.
func (f *Minifloat) Code(x float64, ov Overflow) uint8 {
	if e := f.bits(); e != nil {
		return e.code(x, ov)
	}
	c, _ := f.encodeGeneral(x, ov)
	return c
}

// Encode converts x to the nearest code of f, ties to even. E2M1 has no NaN
// or infinity and always saturates; NaN input gives E2M1 code 0.
func (f *Minifloat) Encode(x float64, ov Overflow) (uint8, Accuracy) {
	if e := f.bits(); e != nil {
		return e.encode(x, ov)
	}
	return f.encodeGeneral(x, ov)
}

// bits is f's bit-level encoder, or nil for a Minifloat that has none
// (encodeGeneral serves it).
func (f *Minifloat) bits() *bitEncoder {
	switch f {
	case E2M1:
		return e2m1Bits
	case E4M3FN:
		return e4m3fnBits
	case E5M2:
		return e5m2Bits
	}
	return nil
}

// encodeGeneral is Encode for any Minifloat, by arithmetic on the value:
// the definition the bit-level encoders (bitEncoder) are tested against
// for every input that can tell them apart.
func (f *Minifloat) encodeGeneral(x float64, ov Overflow) (uint8, Accuracy) {
	var sign uint8
	if math.Signbit(x) {
		sign = f.signBit()
	}
	if math.IsNaN(x) {
		if f.NoNaN {
			return 0, Exact
		}
		return sign | f.nanCode(), Exact
	}
	ax := math.Abs(x)
	maxv := f.MaxFinite()
	var r float64
	if math.IsInf(ax, 0) {
		r = math.Inf(1)
	} else {
		q := f.quantum(ax)
		r = math.RoundToEven(ax/q) * q
	}
	if r > maxv {
		if ov == Saturate || f.NoNaN {
			r = maxv
		} else if f.HasInf {
			return sign | f.infCode(), accOf(math.Inf(1), ax, sign != 0)
		} else {
			return sign | f.nanCode(), Exact
		}
	}
	return sign | f.magCode(r), accOf(r, ax, sign != 0)
}

// bitEncoder is Encode for one Minifloat by integer arithmetic on x's
// float64 bits and a table of its values, the way a hardware converter
// rounds: about a tenth of encodeGeneral's Frexp, Ldexp and divisions,
// which were half the nvfp4_quantize check's time (issue 17). It gives the
// same code and Accuracy as encodeGeneral for every float64
// (formats_test.go: every float32 of the formats' ranges, every midpoint
// and its neighbours).
type bitEncoder struct {
	f         *Minifloat
	minNormal float64 // 2^(1-Bias): below it the code is a count of the smallest subnormal
	subScale  float64 // 1 / the smallest subnormal, a power of two
	shift     uint    // float64 mantissa bits dropped
	rebias    uint64  // float64's exponent bias over f's, as a code offset
	maxCode   uint64  // the largest finite magnitude code
	// topMidpoint is the midpoint between the largest value and the next
	// step of its binade, as nearTieGeneral computes it
	topMidpoint float64
	values      [128]float64
}

var (
	e2m1Bits   = newBitEncoder(E2M1)
	e4m3fnBits = newBitEncoder(E4M3FN)
	e5m2Bits   = newBitEncoder(E5M2)
)

func newBitEncoder(f *Minifloat) *bitEncoder {
	e := &bitEncoder{
		f:         f,
		minNormal: math.Ldexp(1, 1-f.Bias),
		subScale:  1 / f.SmallestSubnormal(),
		shift:     52 - f.MantBits,
		rebias:    uint64(1023-f.Bias) << f.MantBits,
		maxCode:   uint64(f.magCode(f.MaxFinite())),
	}
	e.topMidpoint = f.MaxFinite() + f.quantum(f.MaxFinite())/2
	for c := range e.maxCode + 1 {
		e.values[c] = f.Decode(uint8(c))
	}
	return e
}

// code is encode's code alone: what a quantizer stores, without the
// Accuracy it would discard.
func (e *bitEncoder) code(x float64, ov Overflow) uint8 {
	f := e.f
	bits := math.Float64bits(x)
	sign := uint8(bits>>63) << (f.ExpBits + f.MantBits) // no branch: a weight's sign is a coin toss
	abits := bits &^ (1 << 63)
	ax := math.Float64frombits(abits)
	if abits > 0x7FF<<52 { // NaN
		if f.NoNaN {
			return 0
		}
		return sign | f.nanCode()
	}
	var code uint64
	if ax < e.minNormal {
		// a subnormal of f (or 0, or the least normal when it rounds up):
		// the scaling by a power of two is exact, and so is RoundToEven
		// code = RoundToEven(ax * subScale), a count below 2^MantBits:
		// adding 2^52, whose ulp is 1, rounds it to even in the
		// mantissa, without RoundToEven's call
		code = math.Float64bits(ax*e.subScale+0x1p52) - math.Float64bits(0x1p52)
	} else {
		// round the float64 mantissa to f's, nearest even; a carry out of
		// it steps the exponent, as it should, and past the largest
		// binade (or from an infinity) lands above maxCode
		half := uint64(1)<<(e.shift-1) - 1
		code = (abits+half+(abits>>e.shift)&1)>>e.shift - e.rebias
	}
	if code > e.maxCode {
		switch {
		case ov == Saturate || f.NoNaN:
			code = e.maxCode
		case f.HasInf:
			return sign | f.infCode()
		default:
			return sign | f.nanCode()
		}
	}
	return sign | uint8(code)
}

// nearTie is NearTie without its Frexp and Ldexp calls, which the nvfp4
// quantizer paid for every element (issue 17). In f's normal range the
// midpoint nearest |x| is |x|'s bits with those below f's mantissa
// replaced by a half: |x| - mid is then exact, and equal to the general
// definition's MidpointDistance times the binade's spacing. Below f's
// least normal and above its largest value it computes what the general
// definition does, with the spacing and the top midpoint precomputed. The
// two agree for every float64 (encode_bits_test.go).
func (e *bitEncoder) nearTie(x, relTol float64) bool {
	abits := math.Float64bits(x) &^ (1 << 63)
	ax := math.Float64frombits(abits)
	switch {
	case abits >= 0x7FF<<52: // infinity, NaN
		return false
	case ax > e.values[e.maxCode]:
		return math.Abs(ax-e.topMidpoint) <= relTol*ax
	case ax < e.minNormal:
		q := 1 / e.subScale // the smallest subnormal, exactly
		frac := ax/q - math.Floor(ax/q)
		return math.Abs(frac-0.5)*q <= relTol*ax
	}
	mid := math.Float64frombits(abits>>e.shift<<e.shift | 1<<(e.shift-1))
	return math.Abs(ax-mid) <= relTol*ax
}

// encode is code and how the code's value compares with x.
func (e *bitEncoder) encode(x float64, ov Overflow) (uint8, Accuracy) {
	c := e.code(x, ov)
	bits := math.Float64bits(x)
	ax := math.Float64frombits(bits &^ (1 << 63))
	mag := c &^ e.f.signBit()
	switch {
	case ax != ax: // NaN
		return c, Exact
	case uint64(mag) <= e.maxCode:
		return c, accOfBits(e.values[mag], ax, bits>>63)
	case e.f.HasInf && mag == e.f.infCode():
		return c, accOf(math.Inf(1), ax, bits>>63 != 0)
	}
	return c, Exact // an overflow to NaN
}

// accOfBits is accOf without branches, for the bit-level encoders: whether
// the stored value lies below or above the input is as unpredictable as
// the input's sign.
func accOfBits(stored, input float64, sign uint64) Accuracy {
	a := int8(b2i(stored > input)) - int8(b2i(stored < input))
	return Accuracy(a * (1 - 2*int8(sign)))
}

func b2i(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

func accOf(stored, input float64, neg bool) Accuracy {
	a := Exact
	switch {
	case stored < input:
		a = Below
	case stored > input:
		a = Above
	}
	if neg {
		a = -a
	}
	return a
}

func (f *Minifloat) nanCode() uint8 {
	if f.IEEENaN {
		return uint8(f.maxExpField())<<f.MantBits | (1<<f.MantBits - 1) // all-ones exponent and mantissa
	}
	return uint8(1<<(f.ExpBits+f.MantBits) - 1)
}

func (f *Minifloat) infCode() uint8 { return uint8(f.maxExpField()) << f.MantBits }

// magCode encodes a non-negative value already representable in f.
func (f *Minifloat) magCode(v float64) uint8 {
	if v == 0 {
		return 0
	}
	minNormal := math.Ldexp(1, 1-f.Bias)
	if v < minNormal {
		return uint8(v / f.SmallestSubnormal())
	}
	_, e := math.Frexp(v)
	exp := e - 1
	m := v/math.Ldexp(1, exp-int(f.MantBits)) - float64(int(1)<<f.MantBits)
	return uint8(exp+f.Bias)<<f.MantBits | uint8(m)
}

// MidpointDistance returns how far |x| lies from the nearest rounding midpoint
// of f (a value exactly halfway between two neighbouring codes), in units of
// that binade's spacing: 0 at a tie, 0.5 on a representable value. A kernel
// that divides with an approximate reciprocal may round the other way only
// when this is within a few fp32 ulps (relative 2^-22 or so) of 0.
func (f *Minifloat) MidpointDistance(x float64) float64 {
	ax := math.Abs(x)
	if math.IsNaN(ax) || math.IsInf(ax, 0) {
		return math.Inf(1)
	}
	q := f.quantum(ax)
	frac := ax/q - math.Floor(ax/q)
	return math.Abs(frac - 0.5)
}

// NearTie reports whether x lies within relTol (relative to |x|) of a rounding
// midpoint of f, so that either neighbouring code is a correct result for a
// kernel whose arithmetic carries that relative error.
func (f *Minifloat) NearTie(x float64, relTol float64) bool {
	if e := f.bits(); e != nil {
		return e.nearTie(x, relTol)
	}
	return f.nearTieGeneral(x, relTol)
}

// nearTieGeneral is NearTie for any Minifloat, by arithmetic on the value:
// the definition bitEncoder.nearTie is tested against.
func (f *Minifloat) nearTieGeneral(x float64, relTol float64) bool {
	ax := math.Abs(x)
	if ax == 0 || math.IsNaN(ax) || math.IsInf(ax, 0) {
		return false
	}
	if ax > f.MaxFinite() {
		// The midpoint between MaxFinite and the next binade step.
		q := f.quantum(f.MaxFinite())
		mid := f.MaxFinite() + q/2
		return math.Abs(ax-mid) <= relTol*ax
	}
	q := f.quantum(ax)
	return f.MidpointDistance(ax)*q <= relTol*ax
}

// E8M0 is the OCP MX shared-scale format: an 8-bit biased exponent, value
// 2^(code-127), with 0xFF as NaN. It has no sign, no zero and no mantissa.
type e8m0 struct{}

// E8M0 converts between float64 and the E8M0 scale format.
var E8M0 e8m0

// Decode returns 2^(code-127), or NaN for 0xFF.
func (e8m0) Decode(code uint8) float64 {
	if code == 0xFF {
		return math.NaN()
	}
	return math.Ldexp(1, int(code)-127)
}

// Encode rounds a positive x to the nearest power of two in [2^-127, 2^127]
// in linear space: the midpoint between 2^k and 2^(k+1) is 1.5·2^k, and x
// rounds up only above it (a tie rounds down). Finite values past 2^127
// saturate to 0xFE; NaN and infinities give 0xFF; 0 and negatives clamp to
// the smallest code, as MX writers do. torch 2.15 and ml_dtypes 0.7 differ
// from this in kind (internal/safetensors/torch_formats_test.go, e8m0Encode,
// checks each difference over every midpoint): both round a tie up and turn
// finite values from 1.5·2^127 up into NaN; ml_dtypes makes 0 and negatives
// NaN, torch drops the sign and rounds subnormals in (2^-127, 1.5·2^-127)
// up to 2^-126.
func (e8m0) Encode(x float64) uint8 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return 0xFF
	}
	if x <= 0 {
		return 0
	}
	frac, e := math.Frexp(x) // x = frac·2^e, frac in [0.5,1): between 2^(e-1) and 2^e
	k := e - 1
	if frac > 0.75 { // above the linear midpoint 1.5·2^(e-1)
		k++
	}
	k += 127
	if k < 0 {
		k = 0
	}
	if k > 254 {
		k = 254
	}
	return uint8(k)
}

// BF16 conversions. CUDA writes NaN as 0x7FFF, PyTorch as 0x7FC0: compare NaN
// by position, never by payload.

// BF16Decode returns the float32 value of a bfloat16 bit pattern.
func BF16Decode(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

// BF16Encode rounds f to bfloat16, nearest even; NaN stays NaN (quiet).
func BF16Encode(f float32) uint16 {
	u := math.Float32bits(f)
	if f != f {
		return uint16(u>>16) | 0x0040
	}
	lsb := (u >> 16) & 1
	u += 0x7FFF + lsb
	return uint16(u >> 16)
}

// RoundBF16 rounds x to the nearest bfloat16 value, as a kernel that stores
// its fp32 result in bf16 does (float64 → float32 first, as the kernel's value
// is an fp32 one).
func RoundBF16(x float64) float64 { return float64(BF16Decode(BF16Encode(float32(x)))) }

// BF16FromFloat64 rounds a float64 directly to bfloat16 with a single rounding
// (no intermediate fp32 step), for references that hold exact values.
func BF16FromFloat64(x float64) uint16 {
	if math.IsNaN(x) {
		return 0x7FC0
	}
	f32 := float32(x)
	// float64→float32 rounding can create a false tie; correct it by
	// deciding with the float64 value when the fp32 value lands on a bf16
	// midpoint.
	u := math.Float32bits(f32)
	if u&0xFFFF == 0x8000 && float64(f32) != x {
		lo := math.Float32frombits(u &^ 0xFFFF)
		hi := BF16Decode(uint16(u>>16) + 1)
		if math.Abs(x-float64(lo)) < math.Abs(x-float64(hi)) {
			return uint16(u >> 16)
		}
		return uint16(u>>16) + 1
	}
	return BF16Encode(f32)
}

// FP16Decode returns the float32 value of an IEEE binary16 bit pattern.
func FP16Decode(b uint16) float32 { return float16.Frombits(b).Float32() }

// FP16Encode rounds f to binary16, nearest even.
func FP16Encode(f float32) uint16 { return float16.Fromfloat32(f).Bits() }

// RoundFP16 rounds x (through float32) to the nearest binary16 value.
func RoundFP16(x float64) float64 { return float64(FP16Decode(FP16Encode(float32(x)))) }

// RoundF32 rounds x to float32.
func RoundF32(x float64) float64 { return float64(float32(x)) }

// Binary describes a binary floating-point format as data, in the spirit
// of strconv's floatInfo{23, 8, -127}: its width, its stored mantissa bits,
// the exponent of its smallest normal value and whether it has a sign bit.
// It is what the spacing of a format's values (one ulp) and the distance
// between two of its codes need; Binaries is the one table of them.
type Binary struct {
	// Name is the safetensors dtype name (F64, BF16, F8_E4M3...).
	Name     string
	Bits     uint // total width in bits
	MantBits uint // stored mantissa bits
	MinExp   int  // the smallest normal value is 2^MinExp
	Signed   bool // has a sign bit (E8M0 has none)
}

// minifloatBinary is f as a Binary: its smallest normal exponent is 1-Bias.
func minifloatBinary(name string, f *Minifloat) Binary {
	return Binary{Name: name, Bits: f.Bits(), MantBits: f.MantBits, MinExp: 1 - f.Bias, Signed: true}
}

// Binaries are the binary floating-point formats of tensors kcheck reads
// and writes, by safetensors dtype name: IEEE binary64, binary32 and
// binary16, bfloat16, the OCP FP8 formats (from their Minifloat
// descriptions, so the two cannot disagree) and E8M0, which holds powers
// of two only (no mantissa, no subnormals, no sign).
var Binaries = map[string]Binary{
	"F64":     {Name: "F64", Bits: 64, MantBits: 52, MinExp: -1022, Signed: true},
	"F32":     {Name: "F32", Bits: 32, MantBits: 23, MinExp: -126, Signed: true},
	"F16":     {Name: "F16", Bits: 16, MantBits: 10, MinExp: -14, Signed: true},
	"BF16":    {Name: "BF16", Bits: 16, MantBits: 7, MinExp: -126, Signed: true},
	"F8_E4M3": minifloatBinary("F8_E4M3", E4M3FN),
	"F8_E5M2": minifloatBinary("F8_E5M2", E5M2),
	"F8_E8M0": {Name: "F8_E8M0", Bits: 8, MantBits: 0, MinExp: -127, Signed: false},
}
