package compare

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// TestFinite16EveryCode: every BF16 and F16 code, at every position of a
// word, of a four-word block and of the tail, beside finite codes, is
// judged as its exponent field says (all ones: an infinity or a NaN).
// Under the race detector or -short, at one position of each loop of
// finite16's (and the four lanes of a word) only: every position is 5 M
// calls, seconds under the detector, which sees nothing here.
func TestFinite16EveryCode(t *testing.T) {
	positions := make([]int, 37)
	for k := range positions {
		positions[k] = k
	}
	if raceEnabled || testing.Short() {
		positions = []int{0, 1, 2, 3, 13, 31, 34, 36}
	}
	for _, tc := range []struct {
		name string
		exp  uint64
		mask uint16
	}{{"BF16", bf16Exponent, 0x7F80}, {"F16", f16Exponent, 0x7C00}} {
		// 37 codes: a block of 16, a word of 4 and a tail of 1, so that
		// every loop of finite16 holds the code under test somewhere.
		b := make([]byte, 2*37)
		for k := 0; k < 37; k++ {
			binary.LittleEndian.PutUint16(b[2*k:], 0x3C01^uint16(k)) // finite in both formats
		}
		for _, pos := range positions {
			kept := binary.LittleEndian.Uint16(b[2*pos:])
			for code := 0; code < 1<<16; code++ {
				binary.LittleEndian.PutUint16(b[2*pos:], uint16(code))
				want := uint16(code)&tc.mask != tc.mask
				if got := finite16(b, tc.exp); got != want {
					t.Fatalf("%s: code %#04x at position %d: finite16 %v, want %v", tc.name, code, pos, got, want)
				}
			}
			binary.LittleEndian.PutUint16(b[2*pos:], kept)
		}
	}
}

// TestSpacingTableIsSpacing: the table gives spacingOf's value (NaN read
// as 0) at both ends of every float64 exponent field, at the smallest
// normal of each dtype and its neighbours, and at random finite values,
// for every format and an integer dtype.
func TestSpacingTableIsSpacing(t *testing.T) {
	dtypes := []tensor.DType{tensor.I32, "UNKNOWN"}
	for name := range formats.Binaries {
		dtypes = append(dtypes, tensor.DType(name))
	}
	r := rand.New(rand.NewPCG(3, 4))
	for _, d := range dtypes {
		spacing := spacingOf(d)
		tab := newSpacingTable(spacing)
		want := func(x float64) float64 {
			if u := spacing(x); !math.IsNaN(u) {
				return u
			}
			return 0
		}
		var xs []float64
		for e := uint64(0); e < 0x7FF; e++ {
			xs = append(xs, math.Float64frombits(e<<52), math.Float64frombits(e<<52|1<<52-1))
		}
		if fi, ok := binaryOf(d); ok {
			m := math.Ldexp(1, fi.MinExp)
			xs = append(xs, m, math.Nextafter(m, 0), math.Nextafter(m, 2))
		}
		for range 100000 {
			if x := math.Float64frombits(r.Uint64()); finite(x) {
				xs = append(xs, x)
			}
		}
		for _, x := range xs {
			for _, v := range []float64{x, -x} {
				if got, w := tab.at(v), want(v); math.Float64bits(got) != math.Float64bits(w) {
					t.Fatalf("%s: spacing at %v: table %v, spacingOf %v", d, v, got, w)
				}
			}
		}
	}
}

// bf16Run is n random finite BF16 codes: mostly normals of exponents in
// [-24, 24], whose squares' sum rounds differently in another order of
// the additions, and some subnormals and ±0; where wide is set, also
// normals of any size (whose squares leave the rest no bits to round).
func bf16Run(r *rand.Rand, n int, wide bool) []byte {
	b := make([]byte, 2*n)
	for k := 0; k < n; k++ {
		sign := uint16(r.IntN(2)) << 15
		var c uint16
		switch r.IntN(16) {
		case 0:
			c = uint16(r.IntN(0x80)) // ±0 and subnormals
		case 1:
			if wide {
				c = uint16(r.IntN(0x7F00)) // normals below the top binade
				break
			}
			fallthrough
		default:
			c = uint16(127+r.IntN(49)-24)<<7 | uint16(r.IntN(0x80))
		}
		binary.LittleEndian.PutUint16(b[2*k:], sign|c)
	}
	return b
}

// TestBF16RunSums: the settled passes' sums over a BF16 run are the
// additions of their element-by-element definitions, bit for bit, from
// any start of the sums (equal or not), at every length around the
// unrolled loops' steps and at lengths long enough that any other order
// of the additions rounds differently.
func TestBF16RunSums(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	ulps := newSpacingTable(spacingOf(tensor.BF16))
	lengths := []int{257, 1000, 4099}
	for n := 0; n < 40; n++ {
		lengths = append(lengths, n)
	}
	for _, n := range lengths {
		b := bf16Run(r, n, n < 40)
		for _, start := range [][3]float64{{0, 0, 0}, {1.5, 2.25, 2.25}, {0.1, 3, 7}} {
			for _, row := range []bool{true, false} {
				rx, x2, e2 := start[0], start[1], start[2]
				for k := 0; k < n; k++ {
					x := bf16At(b, 2*k)
					if row {
						rx += x * x
					}
					x2 += x * x
					e2 += x * x
				}
				grx, gx2, ge2 := bf16Squares(b, row, start[0], start[1], start[2])
				if math.Float64bits(grx) != math.Float64bits(rx) || math.Float64bits(gx2) != math.Float64bits(x2) || math.Float64bits(ge2) != math.Float64bits(e2) {
					t.Fatalf("bf16Squares n=%d row=%v from %v: %v %v %v, want %v %v %v", n, row, start, grx, gx2, ge2, rx, x2, e2)
				}
			}
			for _, rowRMS := range []float64{0, 0.7, 3e-39, math.NaN(), -1} {
				g := 0x1p-20
				ulp2, acc2 := start[0], start[1]
				for k := 0; k < n; k++ {
					x := bf16At(b, 2*k)
					ulp := Spacing(tensor.BF16, math.Abs(x))
					am := g * max(math.Abs(x), rowRMS)
					ulp2 += ulp * ulp
					acc2 += am * am
				}
				gu, ga := bf16TolSquares(b, &ulps, g, rowRMS, start[0], start[1])
				if !sameFloat(gu, ulp2) || !sameFloat(ga, acc2) {
					t.Fatalf("bf16TolSquares n=%d rowRMS=%v from %v: %v %v, want %v %v", n, rowRMS, start, gu, ga, ulp2, acc2)
				}
			}
		}
	}
}

// TestBF16QuadDecodes: bf16Quad's four values are bf16At's, for every
// code in every lane.
func TestBF16QuadDecodes(t *testing.T) {
	b := make([]byte, 8)
	for code := 0; code < 1<<16; code++ {
		for lane := 0; lane < 4; lane++ {
			clear(b)
			binary.LittleEndian.PutUint16(b[2*lane:], uint16(code))
			got := [4]float64{}
			got[0], got[1], got[2], got[3] = bf16Quad(binary.LittleEndian.Uint64(b))
			for k := range got {
				if w := bf16At(b, 2*k); math.Float64bits(got[k]) != math.Float64bits(w) {
					t.Fatalf("code %#04x in lane %d: value %d is %v, want %v", code, lane, k, got[k], w)
				}
			}
		}
	}
}

// sameFloat: the same bits, or both NaN (which NaN an addition of two
// returns depends on the order of its operands in the machine code).
func sameFloat(a, b float64) bool {
	return math.Float64bits(a) == math.Float64bits(b) || math.IsNaN(a) && math.IsNaN(b)
}
