package guard

import (
	"math"
	"strings"
	"testing"
	"unsafe"
)

// An overrun as an assembly loop makes one (a store through the slice's
// base pointer past its length, which no bounds check sees) is reported,
// on either side and in either width; a read past the slice reads the
// guards' NaN; writes inside the slice are not overruns.
func TestOverrunIsCaught(t *testing.T) {
	for _, tc := range []struct {
		name string
		at   int // element written, relative to the slice's start
		want string
	}{
		{"inside", 3, ""},
		{"last", 7, ""},
		{"one past the end", 8, "the value 1 after the slice"},
		{"a vector past the end", 15, "the value 8 after the slice"},
		{"one before the start", -1, "the value 1 before the slice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b64, b32 := Zeros[float64](8), Zeros[float32](8)
			s64, s32 := b64.S(), b32.S()
			*(*float64)(unsafe.Add(unsafe.Pointer(&s64[0]), tc.at*8)) = 1.5
			*(*float32)(unsafe.Add(unsafe.Pointer(&s32[0]), tc.at*4)) = 1.5
			for _, err := range []error{b64.Overrun(), b32.Overrun()} {
				switch {
				case tc.want == "" && err != nil:
					t.Errorf("a write inside the slice reported: %v", err)
				case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
					t.Errorf("error %v, want one saying %q", err, tc.want)
				}
			}
		})
	}
	b := New([]float64{1, 2, 3})
	s := b.S()
	if past := *(*float64)(unsafe.Add(unsafe.Pointer(&s[0]), 3*8)); !math.IsNaN(past) || cap(s) != 3 {
		t.Errorf("the value past the slice is %v (cap %d), want the guard's NaN and cap 3", past, cap(s))
	}
}
