package tensor

import (
	"encoding/binary"
	"math"
)

// Special is what a float element is when it is not a finite number.
type Special uint8

// The special values: NaN (any payload, either sign) and the two infinities.
const (
	NaN Special = iota + 1
	PosInf
	NegInf
)

// Value is the special's float64 value (a NaN for NaN).
func (s Special) Value() float64 {
	switch s {
	case NaN:
		return math.NaN()
	case PosInf:
		return math.Inf(1)
	case NegInf:
		return math.Inf(-1)
	}
	return 0
}

// specialBits is how a float dtype marks its special values, as Float64At
// decodes them: an element whose bits under mask equal mask is special
// (the all-ones exponent of the IEEE formats, E4M3FN's S.1111.111, E8M0's
// 0xFF); among those, one with a zero mantissa is an infinity of the sign
// bit's sign, where the format has infinities.
type specialBits struct {
	size     int    // bytes per element
	mask     uint64 // exponent (and, without infinities, mantissa) bits
	mantissa uint64 // 0: the format has no infinity, every special is NaN
	sign     uint64
}

var specials = map[DType]specialBits{
	F64:    {8, 0x7FF0000000000000, 1<<52 - 1, 1 << 63},
	F32:    {4, 0x7F800000, 1<<23 - 1, 1 << 31},
	F16:    {2, 0x7C00, 0x3FF, 0x8000},
	BF16:   {2, 0x7F80, 0x7F, 0x8000},
	F8E4M3: {1, 0x7F, 0, 0x80},    // e4m3fn: only S.1111.111 is NaN, no infinity
	F8E5M2: {1, 0x7C, 0x03, 0x80}, // IEEE-like
	F8E8M0: {1, 0xFF, 0, 0},       // 0xFF is NaN; no sign, no infinity
}

// ScanSpecial calls visit(i, s) for each element i in [lo, hi) of t that
// is NaN or an infinity, in index order, reading the elements' bits and
// never decoding them: an input scan of a capture of a GB (its float
// inputs, for the notes on NaN and Inf) costs about one read of its bytes,
// where Float64At for every element cost tens of times that (issue 17).
// It reports false, and visits nothing, for a dtype that is not a float.
func (t *Tensor) ScanSpecial(lo, hi int, visit func(i int, s Special)) bool {
	sb, ok := specials[t.DType]
	if !ok {
		return false
	}
	b := t.Data[lo*sb.size : hi*sb.size]
	lanes := 8 / sb.size
	// A word of 8 bytes is tested whole, all its lanes at once: masked,
	// and XORed with the mask, a special lane is zero, which the classic
	// has-a-zero-lane test finds; it may flag a lane above a zero one
	// too (a borrow), never miss one, so a flagged word is looked at lane
	// by lane. A capture with no special value never gets that far.
	var laneMask, ones, highs uint64
	for l := 0; l < lanes; l++ {
		laneMask |= sb.mask << (8 * sb.size * l)
		ones |= 1 << (8 * sb.size * l)
		highs |= 1 << (8*sb.size*(l+1) - 1)
	}
	i := lo
	for len(b) >= 8 {
		w := binary.LittleEndian.Uint64(b)
		if y := w&laneMask ^ laneMask; (y-ones)&^y&highs != 0 {
			for l := 0; l < lanes; l++ {
				sb.visitLane(i+l, w>>(8*sb.size*l), visit)
			}
		}
		b, i = b[8:], i+lanes
	}
	for ; len(b) > 0; b, i = b[sb.size:], i+1 {
		var w uint64
		for k := sb.size - 1; k >= 0; k-- {
			w = w<<8 | uint64(b[k])
		}
		sb.visitLane(i, w, visit)
	}
	return true
}

// visitLane judges the element whose bits are the low size bytes of w.
func (sb specialBits) visitLane(i int, w uint64, visit func(int, Special)) {
	if w&sb.mask != sb.mask {
		return
	}
	switch {
	case sb.mantissa == 0 || w&sb.mantissa != 0:
		visit(i, NaN)
	case w&sb.sign != 0:
		visit(i, NegInf)
	default:
		visit(i, PosInf)
	}
}
