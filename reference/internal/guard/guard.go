// Package guard puts NaN guard buffers around the slices the reference
// packages' twin tests hand to their assembly, as gonum's internal/asm
// tests do (newGuardedVector) and FlashMLA poisons unused cache pages. A
// slice sits between Len values either side that hold a NaN no arithmetic
// makes: an assembly loop that reads past its slice reads NaN into its
// results, which then differ from the plain-Go definition's, and one that
// writes past it changes a guard, which Overrun reports. Go code cannot do
// either (its bounds checks panic first; the slice's capacity ends at the
// trailing guard), so the guards are for the assembly.
package guard

import (
	"fmt"
	"math"
)

// Len is the number of guard values either side of a slice: more than
// any of the assembly loops' vector widths or unrolled strides.
const Len = 64

// The guards' NaN payloads: quiet NaNs that no float operation produces
// from ordinary inputs (a NaN an operation makes has the default payload).
const (
	Bits64 = 0x7ff8_dead_0000_beef
	Bits32 = 0x7fc0_beef
)

// Buffer is a slice of values between guards.
type Buffer[T float32 | float64] struct{ buf []T }

// New returns a copy of src between guards.
func New[T float32 | float64](src []T) Buffer[T] {
	var nan T
	switch p := any(&nan).(type) {
	case *float32:
		*p = math.Float32frombits(Bits32)
	case *float64:
		*p = math.Float64frombits(Bits64)
	}
	b := Buffer[T]{make([]T, len(src)+2*Len)}
	for i := range b.buf {
		b.buf[i] = nan
	}
	copy(b.buf[Len:], src)
	return b
}

// Zeros returns n zeros between guards.
func Zeros[T float32 | float64](n int) Buffer[T] { return New(make([]T, n)) }

// S is the guarded slice; its capacity ends where the trailing guard starts.
func (b Buffer[T]) S() []T {
	n := len(b.buf) - 2*Len
	return b.buf[Len : Len+n : Len+n]
}

// Overrun reports the first guard that no longer holds its NaN: a write
// out of the slice's bounds.
func (b Buffer[T]) Overrun() error {
	n := len(b.buf) - 2*Len
	for i, v := range b.buf {
		if i >= Len && i < Len+n {
			continue
		}
		var ok bool
		switch x := any(v).(type) {
		case float32:
			ok = math.Float32bits(x) == Bits32
		case float64:
			ok = math.Float64bits(x) == Bits64
		}
		if !ok {
			if i < Len {
				return fmt.Errorf("the value %d before the slice was written (%v): a write out of bounds", Len-i, v)
			}
			return fmt.Errorf("the value %d after the slice was written (%v): a write out of bounds", i-Len-n+1, v)
		}
	}
	return nil
}
