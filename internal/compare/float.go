package compare

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"

	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Float is a float64 that survives encoding/json whatever its value.
// encoding/json refuses NaN and ±Inf, yet they are legitimate metric values
// here: SQNR is +Inf when the error is zero, a ratio over a zero tolerance is
// +Inf, max_abs is NaN-free only when NaN positions agree. Finite values
// encode as JSON numbers (Go's shortest round-tripping form); the three
// non-finite values encode as the JSON strings "NaN", "+Inf" and "-Inf",
// which keep their meaning for a reader (jq, Python's json with a small
// hook) where null would lose it. UnmarshalJSON accepts both forms and null
// (as NaN).
type Float float64

// MarshalJSON implements json.Marshaler.
func (f Float) MarshalJSON() ([]byte, error) {
	v := float64(f)
	switch {
	case math.IsNaN(v):
		return []byte(`"NaN"`), nil
	case math.IsInf(v, 1):
		return []byte(`"+Inf"`), nil
	case math.IsInf(v, -1):
		return []byte(`"-Inf"`), nil
	}
	return strconv.AppendFloat(nil, v, 'g', -1, 64), nil
}

// UnmarshalJSON implements json.Unmarshaler.
func (f *Float) UnmarshalJSON(b []byte) error {
	s := string(b)
	switch s {
	case "null", `"NaN"`:
		*f = Float(math.NaN())
		return nil
	case `"+Inf"`, `"Inf"`:
		*f = Float(math.Inf(1))
		return nil
	case `"-Inf"`:
		*f = Float(math.Inf(-1))
		return nil
	}
	var v float64
	if err := json.Unmarshal(b, &v); err != nil {
		return fmt.Errorf("metric value %s is neither a number nor \"NaN\", \"+Inf\", \"-Inf\"", s)
	}
	*f = Float(v)
	return nil
}

// overflowed reports whether an element whose actual or expected value is
// an infinity is an overflow of the output dtype d: the exact answer xv is
// finite, every infinity among av and ev has its sign, and it lies within
// a factor of two of d's overflow threshold (for F16 65520, the midpoint
// of 65504 and 2^16, from which nearest-even rounding gives inf), so that
// rounding it to d, or a kernel's value within any tolerance of it, gives
// that infinity. A farther infinity is a wrong value, not a rounding; an
// infinite exact answer is one the kernel was given and faithfully carries.
func overflowed(d tensor.DType, av, ev, xv float64) bool {
	thr, ok := overflowThreshold[d]
	if !ok || math.IsInf(xv, 0) || math.IsNaN(xv) || math.Abs(xv) < thr/2 {
		return false
	}
	for _, v := range [2]float64{av, ev} {
		if math.IsInf(v, 0) && math.Signbit(v) != math.Signbit(xv) {
			return false
		}
	}
	return true
}

// overflowThreshold is, for each float dtype narrower than float64, the
// magnitude from which round to nearest even gives an infinity: the
// largest finite value plus half its ulp.
var overflowThreshold = map[tensor.DType]float64{
	tensor.F16:  65520,          // (2 - 2^-11)·2^15
	tensor.BF16: 0x1.ffp127,     // (2 - 2^-8)·2^127
	tensor.F32:  0x1.ffffffp127, // (2 - 2^-24)·2^127
}
