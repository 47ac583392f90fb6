package kernel

import (
	"context"
	"fmt"

	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Values is a read-only sequence of float64 values: an output's exact or
// expected reference. Most kernels compute theirs into memory (Dense), but
// an output the size of a KV cache (kv_cache_write's cache_after, a gather
// of a whole cache) would take 8 bytes a value twice over, many times the
// cache itself; such outputs compute their values on demand from the
// mapped, read-only inputs, so that a check holds little more than its
// inputs. Readers go through At, in any order; sequential order is the fast
// one for the on-demand implementations, which decode a cache entry or row
// at a time and keep the last one.
//
// An on-demand Values keeps that last entry in itself, so it is not safe for
// concurrent use; a reader that wants to share one across goroutines gives
// each its own (the adapters build a fresh one per Reference call).
type Values interface {
	// Len is the number of values.
	Len() int
	// At returns value i, 0 <= i < Len().
	At(i int) float64
}

// Forker is implemented by on-demand Values: Fork returns a reader of the
// same values with state of its own, for another goroutine.
type Forker interface {
	Fork() Values
}

// Forkable reports whether Fork gives a reader of v for another goroutine,
// without making one.
func Forkable(v Values) bool {
	switch v.(type) {
	case Dense, Forker:
		return true
	}
	return false
}

// Fork returns a reader of v's values that may be used concurrently with v
// and with other forks: v itself when it holds no state (Dense), its Fork
// when it has one, and ok = false when it is neither (the caller then reads
// v from one goroutine).
func Fork(v Values) (Values, bool) {
	switch f := v.(type) {
	case Dense:
		return f, true
	case Forker:
		return f.Fork(), true
	}
	return nil, false
}

// BlockReader is implemented by Values that read a run of consecutive
// values faster than one At call each (an on-demand cache decodes a whole
// entry or row at a time): ReadBlock fills dst with values lo ..
// lo+len(dst)-1, the same bits At returns. A Values without it is read by
// ReadBlock through At, which is always correct.
type BlockReader interface {
	ReadBlock(lo int, dst []float64)
}

// ReadBlock fills dst with v's values from lo on: in bulk where v can
// (Dense, Bytes, a BlockReader), else one At call a value.
func ReadBlock(v Values, lo int, dst []float64) {
	switch b := v.(type) {
	case Dense:
		copy(dst, b[lo:lo+len(dst)])
	case Bytes:
		for i, c := range b[lo : lo+len(dst)] {
			dst[i] = float64(c)
		}
	case TensorValues:
		b.T.RowInto(dst, lo, len(dst))
	case BlockReader:
		b.ReadBlock(lo, dst)
	default:
		for i := range dst {
			dst[i] = v.At(lo + i)
		}
	}
}

// Settler is implemented by on-demand Values that can vouch for a run of
// their values by the bytes that encode them: a check compares the actual
// output's bytes with those (one memory compare) instead of judging every
// element, and an element whose actual bytes equal them is, to the last
// bit, an element whose actual, expected and exact values agree. That is
// the bulk of a correct cache write (every entry no token was written to is
// cache_before's bytes) and of a gather of a 16-bit cache into its own
// dtype (every row is a copy).
//
// Settled describes the values from lo on, at most n of them (n >= 1): it
// returns m, 1 <= m <= n, the length of a run of values that are either
// all settled or all not. When settled, values lo .. lo+m-1 are the
// values b (m values of dtype d, len(b) = m·d.Size()) encodes as
// tensor.Float64At decodes them: bit for bit where that is a finite value,
// the same infinity, or a NaN (its payload may differ) where it is not, so
// a caller judges a run holding special values one element at a time.
// When not settled, b is nil and the caller reads the values (At,
// ReadBlock) as usual. b aliases the Values' read-only inputs, or a buffer
// of the Values' own that its next Settled, At or ReadBlock call may
// overwrite (At's state): callers never write to it, read it before
// calling the same Values again, and call it from one goroutine at a time,
// each goroutine its own fork (kernel.Fork), as they call At.
type Settler interface {
	Settled(lo, n int) (d tensor.DType, b []byte, m int)
}

// Dense is Values held in memory: what every kernel whose outputs are of
// the size of its work (not of a cache) returns.
type Dense []float64

// Len implements Values.
func (d Dense) Len() int { return len(d) }

// At implements Values.
func (d Dense) At(i int) float64 { return d[i] }

// Bytes is Values over raw bytes (packed codes), one value a byte: an
// eighth of Dense's memory for outputs the size of a weight matrix. It holds
// no state, so it forks to itself.
type Bytes []byte

// Len implements Values.
func (b Bytes) Len() int { return len(b) }

// At implements Values.
func (b Bytes) At(i int) float64 { return float64(b[i]) }

// Fork implements Forker.
func (b Bytes) Fork() Values { return b }

// TensorValues is Values over a tensor's elements, read as float64.
type TensorValues struct{ T *tensor.Tensor }

// Len implements Values.
func (v TensorValues) Len() int { return v.T.Len() }

// At implements Values.
func (v TensorValues) At(i int) float64 { return v.T.Float64At(i) }

// Materialize stores v in a new tensor of dtype d and shape shape, each
// value rounded as tensor.SetFloat64 rounds it (as tensor.FromFloat64s
// does), without a float64 copy of the whole output: the one copy is the
// tensor itself, in its own dtype.
func Materialize(d tensor.DType, shape []int, v Values) *tensor.Tensor {
	t, _ := MaterializeContext(context.Background(), d, shape, v)
	return t
}

// MaterializeContext is Materialize under ctx: an output computed on
// demand may be a whole KV cache, decoded an entry at a time, so the
// writing stops between strides of values once ctx is done and returns
// its error.
func MaterializeContext(ctx context.Context, d tensor.DType, shape []int, v Values) (*tensor.Tensor, error) {
	if dense, ok := v.(Dense); ok {
		return tensor.FromFloat64s(d, shape, dense), nil
	}
	t := tensor.New(d, shape...)
	if v.Len() != t.Len() {
		panic(fmt.Sprintf("kernel.Materialize: %d values for shape %v", v.Len(), shape))
	}
	// A run its Settler vouches for in d's own bytes is those bytes, copied:
	// each finite value re-encodes to its own code, so only a special
	// value (whose NaN payload SetFloat64 may not keep) is stored from At
	// as before. The rest is read a block at a time (ReadBlock: At's bits).
	settler, _ := v.(Settler)
	sz := d.Size()
	var block []float64
	for i, n := 0, t.Len(); i < n; {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		m := min(n-i, StopStride)
		if settler != nil {
			sd, b, sm := settler.Settled(i, m)
			m = sm
			if b != nil && sd == d && len(b) == m*sz {
				copy(t.Data[i*sz:(i+m)*sz], b)
				t.ScanSpecial(i, i+m, func(k int, _ tensor.Special) { t.SetFloat64(k, v.At(k)) })
				i += m
				continue
			}
		}
		if block == nil {
			block = make([]float64, min(n, StopStride))
		}
		ReadBlock(v, i, block[:m])
		for k, x := range block[:m] {
			t.SetFloat64(i+k, x)
		}
		i += m
	}
	return t, nil
}

// Float64s copies every value of v into a slice: for tests and outputs known
// to be small, never for an output that may be the size of a cache.
func Float64s(v Values) []float64 {
	if dense, ok := v.(Dense); ok {
		return append([]float64(nil), dense...)
	}
	out := make([]float64, v.Len())
	for i := range out {
		out[i] = v.At(i)
	}
	return out
}
