package tensor

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

type specialAt struct {
	i int
	s Special
}

// decodedSpecials is the oracle: what Float64At makes of each element.
func decodedSpecials(t *Tensor, lo, hi int) []specialAt {
	var out []specialAt
	for i := lo; i < hi; i++ {
		switch v := t.Float64At(i); {
		case math.IsNaN(v):
			out = append(out, specialAt{i, NaN})
		case math.IsInf(v, 1):
			out = append(out, specialAt{i, PosInf})
		case math.IsInf(v, -1):
			out = append(out, specialAt{i, NegInf})
		}
	}
	return out
}

// patterns is every code of a dtype of 1 or 2 bytes, and for the wider
// ones the edges of the special exponent (every NaN payload bit alone,
// both infinities, the largest finite values, zeros, subnormals) among
// random bits, a quarter of them forced into the special exponent.
func patterns(d DType) *Tensor {
	size := d.Size()
	var words []uint64
	switch size {
	case 1, 2:
		for c := 0; c < 1<<(8*size); c++ {
			words = append(words, uint64(c))
		}
	default:
		sb := specials[d]
		top := sb.sign
		for _, w := range []uint64{0, sb.sign, sb.mask, sb.mask | sb.sign, sb.mask - 1, sb.mask | sb.mantissa, sb.mask | sb.mantissa | sb.sign, 1, sb.sign | 1, sb.mantissa} {
			words = append(words, w)
		}
		for b := uint64(1); b <= sb.mantissa; b <<= 1 {
			words = append(words, sb.mask|b, sb.mask|b|sb.sign, (sb.mask-(sb.mantissa+1))|b)
		}
		r := rand.New(rand.NewPCG(1, 2))
		for k := 0; k < 4000; k++ {
			w := r.Uint64() & (top<<1 - 1)
			if k%4 == 0 {
				w |= sb.mask
			}
			words = append(words, w)
		}
	}
	t := New(d, len(words))
	for i, w := range words {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], w)
		copy(t.Data[i*size:], b[:size])
	}
	return t
}

// TestScanSpecialMatchesFloat64At: the bit scan finds exactly the NaN and
// infinities that decoding finds, in order, for every code of the narrow
// dtypes and the edges of the wide ones, over windows that start and end
// inside a word of 8 bytes and at its edges.
func TestScanSpecialMatchesFloat64At(t *testing.T) {
	for _, d := range []DType{F64, F32, F16, BF16, F8E4M3, F8E5M2, F8E8M0} {
		t.Run(string(d), func(t *testing.T) {
			tt := patterns(d)
			n := tt.Len()
			if len(decodedSpecials(tt, 0, n)) == 0 {
				t.Fatal("the patterns hold no special value: the test proves nothing")
			}
			for _, lo := range []int{0, 1, 3, 7, 8, 9} {
				for _, cut := range []int{0, 1, 5, 8, 13} {
					hi := n - cut
					var got []specialAt
					if !tt.ScanSpecial(lo, hi, func(i int, s Special) { got = append(got, specialAt{i, s}) }) {
						t.Fatalf("ScanSpecial refused float dtype %s", d)
					}
					if want := decodedSpecials(tt, lo, hi); !slices.Equal(got, want) {
						t.Fatalf("[%d, %d): scan found %d specials, decoding %d; first scan %v, first decoded %v",
							lo, hi, len(got), len(want), first(got), first(want))
					}
				}
			}
		})
	}
	if New(I32, 4).ScanSpecial(0, 4, func(int, Special) { t.Fatal("visited an integer element") }) {
		t.Error("ScanSpecial accepted I32")
	}
}

func first(s []specialAt) any {
	if len(s) == 0 {
		return "none"
	}
	return s[0]
}

// TestScanSpecialFindsALoneSpecial: among finite values, one special
// value at any position of the four-word blocks the scan passes over
// together, and of the words and the tail after them, is found, and
// nothing else is.
func TestScanSpecialFindsALoneSpecial(t *testing.T) {
	for _, d := range []DType{F64, F32, F16, BF16, F8E4M3, F8E5M2, F8E8M0} {
		sb := specials[d]
		const n = 77 // blocks, words and a tail for every size
		for p := 0; p < n; p++ {
			tt := New(d, n)
			for i := 0; i < n; i++ {
				tt.SetFloat64(i, 1)
			}
			var b [8]byte
			binary.LittleEndian.PutUint64(b[:], sb.mask|sb.sign) // -Inf or a NaN
			copy(tt.Data[p*sb.size:], b[:sb.size])
			var got []int
			tt.ScanSpecial(0, n, func(i int, _ Special) { got = append(got, i) })
			if len(got) != 1 || got[0] != p {
				t.Fatalf("%s: a special at %d: the scan found %v", d, p, got)
			}
		}
	}
}

// BenchmarkScanSpecial: a 64 MiB BF16 tensor without a special value, as
// the input scan meets a cache.
func BenchmarkScanSpecial(b *testing.B) {
	tt := New(BF16, 32<<20)
	for i := 0; i < tt.Len(); i++ {
		tt.SetFloat64(i, float64(i%1000)-500)
	}
	b.SetBytes(int64(len(tt.Data)))
	for b.Loop() {
		tt.ScanSpecial(0, tt.Len(), func(int, Special) { b.Fatal("a special value") })
	}
}
