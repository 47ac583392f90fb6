package compare

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
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
