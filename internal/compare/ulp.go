package compare

import (
	"math"

	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// binaryOf returns dtype d's format from reference/formats' one table of
// them.
func binaryOf(d tensor.DType) (formats.Binary, bool) {
	b, ok := formats.Binaries[string(d)]
	return b, ok
}

// Spacing returns the gap between |x| and the next larger value of dtype d
// in |x|'s binade: one ulp of d at x. Zero and subnormal x give the
// subnormal spacing 2^(MinExp-MantBits) (2^-133 for BF16, 2^-9 for E4M3FN).
// Integer dtypes have spacing 1. NaN, ±Inf and unknown dtypes give NaN.
func Spacing(d tensor.DType, x float64) float64 { return spacingOf(d)(x) }

// spacingOf returns Spacing(d, ·) with d's format looked up once: the
// three-way tolerance asks for a spacing per element of outputs that can
// hold hundreds of millions.
func spacingOf(d tensor.DType) func(x float64) float64 {
	if d.IsInt() {
		return func(x float64) float64 {
			if math.IsNaN(x) || math.IsInf(x, 0) {
				return math.NaN()
			}
			return 1
		}
	}
	fi, ok := binaryOf(d)
	if !ok {
		return func(float64) float64 { return math.NaN() }
	}
	minNormal := math.Ldexp(1, fi.MinExp)
	return func(x float64) float64 {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return math.NaN()
		}
		ax := math.Abs(x)
		exp := fi.MinExp
		if ax >= minNormal { // a normal float64 (minNormal >= 2^-1022): its exponent field
			exp = int(math.Float64bits(ax)>>52) - 1023
		}
		if e := exp - int(fi.MantBits); e >= -1022 {
			return math.Float64frombits(uint64(e+1023) << 52) // 2^e
		}
		return math.Ldexp(1, exp-int(fi.MantBits))
	}
}

// code returns the bit pattern of v in dtype d (rounded to nearest even when
// v is not representable, never saturating), or ok = false for NaN and for
// dtypes without a floating-point encoding.
func code(d tensor.DType, v float64) (c uint64, ok bool) {
	if math.IsNaN(v) {
		return 0, false
	}
	switch d {
	case tensor.F64:
		return math.Float64bits(v), true
	case tensor.F32:
		return uint64(math.Float32bits(float32(v))), true
	case tensor.F16:
		return uint64(formats.FP16Encode(float32(v))), true
	case tensor.BF16:
		return uint64(formats.BF16FromFloat64(v)), true
	case tensor.F8E4M3:
		b, _ := formats.E4M3FN.Encode(v, formats.NoSaturate)
		if formats.E4M3FN.IsNaN(b) {
			return 0, false // beyond 464: E4M3FN has no infinity
		}
		return uint64(b), true
	case tensor.F8E5M2:
		b, _ := formats.E5M2.Encode(v, formats.NoSaturate)
		return uint64(b), true
	case tensor.F8E8M0:
		if v <= 0 || math.IsInf(v, 0) {
			return 0, false
		}
		return uint64(formats.E8M0.Encode(v)), true
	}
	return 0, false
}

// ULPDistance returns how many steps of dtype d separate a and b: the
// number of representable values one passes going from one to the other
// (0 when equal, 1 for neighbours). The codes of a sign-magnitude format are
// ordered by magnitude within each sign, so the distance is the difference
// of magnitudes for equal signs and their sum across zero; +0 and -0 are the
// same value (distance 0), the least subnormals of opposite sign are 2
// apart, and the largest finite value is 1 from infinity where d has one.
// Integer dtypes count integers (|a-b|). ok is false when either value is
// NaN or d is not a numeric dtype; values not representable in d are first
// rounded to it.
func ULPDistance(d tensor.DType, a, b float64) (dist uint64, ok bool) {
	return ulpDistanceOf(d)(a, b)
}

// ulpDistanceOf returns ULPDistance(d, ·, ·) with d's format looked up once
// (a comparison asks for a distance per element), and, in the dtypes that
// encode every non-NaN value (F64, F32, F16, BF16), equal values settled
// without encoding them: 0 steps apart.
func ulpDistanceOf(d tensor.DType) func(a, b float64) (uint64, bool) {
	if d.IsInt() {
		return func(a, b float64) (uint64, bool) {
			if math.IsNaN(a) || math.IsNaN(b) {
				return 0, false
			}
			return uint64(math.Abs(math.Round(a) - math.Round(b))), true
		}
	}
	fi, known := binaryOf(d)
	if !known {
		return func(float64, float64) (uint64, bool) { return 0, false }
	}
	encodesAll := d == tensor.F64 || d == tensor.F32 || d == tensor.F16 || d == tensor.BF16
	return func(a, b float64) (uint64, bool) {
		if math.IsNaN(a) || math.IsNaN(b) {
			return 0, false
		}
		if a == b && encodesAll {
			return 0, true
		}
		return ulpDistance(d, fi, a, b)
	}
}

func ulpDistance(d tensor.DType, fi formats.Binary, a, b float64) (dist uint64, ok bool) {
	ca, oka := code(d, a)
	cb, okb := code(d, b)
	if !oka || !okb {
		return 0, false
	}
	if !fi.Signed {
		if ca > cb {
			return ca - cb, true
		}
		return cb - ca, true
	}
	sign := uint64(1) << (fi.Bits - 1)
	ma, mb := ca&^sign, cb&^sign
	if ma == 0 && mb == 0 {
		return 0, true // +0 and -0
	}
	if (ca&sign == 0) == (cb&sign == 0) || ma == 0 || mb == 0 {
		if ma > mb {
			return ma - mb, true
		}
		return mb - ma, true
	}
	return ma + mb, true
}
