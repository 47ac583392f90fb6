// Package tensor holds the contract tensor: a dtype, a shape and little-endian
// bytes, exactly as an evidence file (safetensors) stores them. References read
// elements through it without copying the whole tensor to float64, so a
// multi-GB capture can be checked in memory bounded by its own size.
package tensor

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"unsafe"

	"github.com/kcheck-dev/kcheck/reference/formats"
)

// DType is a safetensors dtype name.
type DType string

// The dtypes of the evidence file: the safetensors standard set plus the FP8
// kinds. Packed FP4 is stored as U8, two values a byte.
const (
	F64     DType = "F64"
	F32     DType = "F32"
	F16     DType = "F16"
	BF16    DType = "BF16"
	F8E4M3  DType = "F8_E4M3"
	F8E5M2  DType = "F8_E5M2"
	F8E8M0  DType = "F8_E8M0"
	I64     DType = "I64"
	I32     DType = "I32"
	I16     DType = "I16"
	I8      DType = "I8"
	U64     DType = "U64"
	U32     DType = "U32"
	U16     DType = "U16"
	U8      DType = "U8"
	Bool    DType = "BOOL"
	Invalid DType = ""
)

var sizes = map[DType]int{
	F64: 8, F32: 4, F16: 2, BF16: 2, F8E4M3: 1, F8E5M2: 1, F8E8M0: 1,
	I64: 8, I32: 4, I16: 2, I8: 1, U64: 8, U32: 4, U16: 2, U8: 1, Bool: 1,
}

// ParseDType returns the dtype named s, or an error naming s.
func ParseDType(s string) (DType, error) {
	d := DType(s)
	if _, ok := sizes[d]; !ok {
		return Invalid, fmt.Errorf("unknown dtype %q", s)
	}
	return d, nil
}

// Size is the width of one element in bytes.
func (d DType) Size() int { return sizes[d] }

// IsFloat reports whether d holds floating-point values.
func (d DType) IsFloat() bool {
	switch d {
	case F64, F32, F16, BF16, F8E4M3, F8E5M2, F8E8M0:
		return true
	}
	return false
}

// IsInt reports whether d holds integers (U8 included: packed FP4 and raw FP8 cache bytes).
func (d DType) IsInt() bool {
	switch d {
	case I64, I32, I16, I8, U64, U32, U16, U8, Bool:
		return true
	}
	return false
}

// UnitRoundoff is u = 2^-(p) for a float dtype with p-1 stored mantissa bits
// (half the spacing at 1): 2^-24 for F32, 2^-8 for BF16, 2^-11 for F16.
func (d DType) UnitRoundoff() float64 {
	switch d {
	case F64:
		return 0x1p-53
	case F32:
		return 0x1p-24
	case F16:
		return 0x1p-11
	case BF16:
		return 0x1p-8
	case F8E4M3:
		return 0x1p-4
	case F8E5M2:
		return 0x1p-3
	case F8E8M0:
		return 0.5
	}
	return 0
}

// Tensor is a contract tensor. Data is little-endian, row-major, and may be a
// view into a memory-mapped file: callers must not write into a tensor they
// did not create.
type Tensor struct {
	DType DType
	Shape []int
	Data  []byte
}

// NumElements is the product of the shape (1 for a scalar []).
func NumElements(shape []int) int {
	n := 1
	for _, s := range shape {
		n *= s
	}
	return n
}

// Len is the number of elements.
func (t *Tensor) Len() int { return NumElements(t.Shape) }

// New allocates a zeroed tensor.
func New(d DType, shape ...int) *Tensor {
	return &Tensor{DType: d, Shape: append([]int(nil), shape...), Data: make([]byte, NumElements(shape)*d.Size())}
}

// Clone copies t, data included.
func (t *Tensor) Clone() *Tensor {
	return &Tensor{DType: t.DType, Shape: append([]int(nil), t.Shape...), Data: append([]byte(nil), t.Data...)}
}

// Check verifies that the data length matches dtype and shape.
func (t *Tensor) Check() error {
	if t.DType.Size() == 0 {
		return fmt.Errorf("unknown dtype %q", t.DType)
	}
	for _, s := range t.Shape {
		if s < 0 {
			return fmt.Errorf("negative dimension in shape %v", t.Shape)
		}
	}
	want := t.Len() * t.DType.Size()
	if len(t.Data) != want {
		return fmt.Errorf("shape %v of %s needs %d bytes, has %d", t.Shape, t.DType, want, len(t.Data))
	}
	return nil
}

// ByteSize multiplies out shape × elemSize, reporting overflow instead of
// wrapping: the nonzero dimensions must multiply out within 63 bits even
// when a zero dimension makes the tensor empty, so strides computed from
// the shape cannot overflow either. File readers call it before trusting a
// header's shape.
func ByteSize(shape []int, elemSize int) (uint64, bool) {
	n := uint64(elemSize)
	empty := false
	for _, d := range shape {
		if d < 0 {
			return 0, false
		}
		if d == 0 {
			empty = true
			continue
		}
		hi, lo := bits.Mul64(n, uint64(d))
		if hi != 0 || lo > math.MaxInt64 {
			return 0, false
		}
		n = lo
	}
	if empty {
		return 0, true
	}
	return n, true
}

// Strides returns the row-major element strides of shape.
func Strides(shape []int) []int {
	st := make([]int, len(shape))
	s := 1
	for i := len(shape) - 1; i >= 0; i-- {
		st[i] = s
		s *= shape[i]
	}
	return st
}

// Unravel turns a flat index into a multi-dimensional one.
func Unravel(i int, shape []int) []int {
	idx := make([]int, len(shape))
	UnravelInto(idx, i, shape)
	return idx
}

// UnravelInto is Unravel into idx (of len(shape)), for a loop over many
// elements that keeps no index.
func UnravelInto(idx []int, i int, shape []int) {
	for d := len(shape) - 1; d >= 0; d-- {
		if shape[d] > 0 {
			idx[d] = i % shape[d]
			i /= shape[d]
		} else {
			idx[d] = 0
		}
	}
}

// Float64At decodes element i exactly (every dtype here is exact in float64,
// except I64/U64 beyond 2^53).
func (t *Tensor) Float64At(i int) float64 {
	b := t.Data
	switch t.DType {
	case F64:
		return math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
	case F32:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
	case F16:
		return float64(formats.FP16Decode(binary.LittleEndian.Uint16(b[2*i:])))
	case BF16:
		return float64(formats.BF16Decode(binary.LittleEndian.Uint16(b[2*i:])))
	case F8E4M3:
		return formats.E4M3FN.Decode(b[i])
	case F8E5M2:
		return formats.E5M2.Decode(b[i])
	case F8E8M0:
		return formats.E8M0.Decode(b[i])
	case U8, Bool:
		return float64(b[i])
	case I8:
		return float64(int8(b[i]))
	case I16:
		return float64(int16(binary.LittleEndian.Uint16(b[2*i:])))
	case U16:
		return float64(binary.LittleEndian.Uint16(b[2*i:]))
	case I32:
		return float64(int32(binary.LittleEndian.Uint32(b[4*i:])))
	case U32:
		return float64(binary.LittleEndian.Uint32(b[4*i:]))
	case I64:
		return float64(int64(binary.LittleEndian.Uint64(b[8*i:])))
	case U64:
		return float64(binary.LittleEndian.Uint64(b[8*i:]))
	}
	panic(fmt.Sprintf("tensor: Float64At on dtype %q", t.DType))
}

// Int64At returns integer element i.
func (t *Tensor) Int64At(i int) int64 {
	b := t.Data
	switch t.DType {
	case I64:
		return int64(binary.LittleEndian.Uint64(b[8*i:]))
	case I32:
		return int64(int32(binary.LittleEndian.Uint32(b[4*i:])))
	case I16:
		return int64(int16(binary.LittleEndian.Uint16(b[2*i:])))
	case I8:
		return int64(int8(b[i]))
	case U64:
		return int64(binary.LittleEndian.Uint64(b[8*i:]))
	case U32:
		return int64(binary.LittleEndian.Uint32(b[4*i:]))
	case U16:
		return int64(binary.LittleEndian.Uint16(b[2*i:]))
	case U8, Bool:
		return int64(b[i])
	}
	return int64(t.Float64At(i))
}

// Float64s decodes every element (use for small tensors; references over big
// caches read rows through Float64At or RowInto).
func (t *Tensor) Float64s() []float64 {
	out := make([]float64, t.Len())
	for i := range out {
		out[i] = t.Float64At(i)
	}
	return out
}

// Float32s returns an F32 tensor's values as float32: a view of its bytes
// where the host is little-endian (as the file formats are) and the data is
// 4-byte aligned, so that a mapped capture's fp32 tensor is read in place
// (never write through the view: the mapping is read-only), and otherwise a
// decoded copy. Other dtypes give nil.
func (t *Tensor) Float32s() []float32 {
	if t.DType != F32 {
		return nil
	}
	n := t.Len()
	if n == 0 {
		return []float32{}
	}
	if littleEndian && len(t.Data) >= 4*n && uintptr(unsafe.Pointer(&t.Data[0]))%4 == 0 {
		return unsafe.Slice((*float32)(unsafe.Pointer(&t.Data[0])), n)
	}
	out := make([]float32, n)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
	}
	return out
}

var littleEndian = func() bool { x := uint16(1); return *(*byte)(unsafe.Pointer(&x)) == 1 }()

// RowInto decodes n elements starting at flat index off into dst[:n].
func (t *Tensor) RowInto(dst []float64, off, n int) {
	switch t.DType {
	case BF16:
		b := t.Data[2*off:]
		for j := 0; j < n; j++ {
			dst[j] = float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[2*j:])) << 16))
		}
	case F32:
		b := t.Data[4*off:]
		for j := 0; j < n; j++ {
			dst[j] = float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*j:])))
		}
	default:
		for j := 0; j < n; j++ {
			dst[j] = t.Float64At(off + j)
		}
	}
}

// SetFloat64 stores v into element i, rounding to the dtype to nearest even
// (FP8 saturating, as __NV_SATFINITE; integers truncate toward zero).
func (t *Tensor) SetFloat64(i int, v float64) {
	b := t.Data
	switch t.DType {
	case F64:
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(v))
	case F32:
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(v)))
	case F16:
		binary.LittleEndian.PutUint16(b[2*i:], formats.FP16Encode(float32(v)))
	case BF16:
		binary.LittleEndian.PutUint16(b[2*i:], formats.BF16FromFloat64(v))
	case F8E4M3:
		b[i], _ = formats.E4M3FN.Encode(v, formats.Saturate)
	case F8E5M2:
		b[i], _ = formats.E5M2.Encode(v, formats.Saturate)
	case F8E8M0:
		b[i] = formats.E8M0.Encode(v)
	default:
		t.SetInt64(i, int64(v))
	}
}

// SetInt64 stores an integer element.
func (t *Tensor) SetInt64(i int, v int64) {
	b := t.Data
	switch t.DType {
	case I64, U64:
		binary.LittleEndian.PutUint64(b[8*i:], uint64(v))
	case I32, U32:
		binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
	case I16, U16:
		binary.LittleEndian.PutUint16(b[2*i:], uint16(v))
	case I8, U8, Bool:
		b[i] = byte(v)
	default:
		t.SetFloat64(i, float64(v))
	}
}

// FromFloat64s makes a tensor of dtype d holding vals rounded as SetFloat64 does.
func FromFloat64s(d DType, shape []int, vals []float64) *Tensor {
	t := New(d, shape...)
	if len(vals) != t.Len() {
		panic(fmt.Sprintf("tensor.FromFloat64s: %d values for shape %v", len(vals), shape))
	}
	switch d {
	case BF16:
		// SetFloat64's bf16 case without its dtype switch, a string
		// comparison an element: the generators make every token and
		// weight of the catalog through here (issue 17).
		b := t.Data[:2*len(vals)]
		for i, v := range vals {
			binary.LittleEndian.PutUint16(b[2*i:], formats.BF16FromFloat64(v))
		}
	default:
		for i, v := range vals {
			t.SetFloat64(i, v)
		}
	}
	return t
}

// FromInt64s makes an integer tensor.
func FromInt64s(d DType, shape []int, vals []int64) *Tensor {
	t := New(d, shape...)
	if len(vals) != t.Len() {
		panic(fmt.Sprintf("tensor.FromInt64s: %d values for shape %v", len(vals), shape))
	}
	for i, v := range vals {
		t.SetInt64(i, v)
	}
	return t
}

// Scalar returns the single value of a [] or [1] tensor.
func (t *Tensor) Scalar() (float64, error) {
	if t.Len() != 1 {
		return 0, fmt.Errorf("want a scalar ([] or [1]), got shape %v", t.Shape)
	}
	return t.Float64At(0), nil
}
