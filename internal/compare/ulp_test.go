package compare

import (
	"bufio"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

func parseF(t *testing.T, s string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatalf("bad value %q: %v", s, err)
	}
	return v
}

func TestULPDistanceTable(t *testing.T) {
	f, err := os.Open("testdata/ulp.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	rows := 0
	for line := 1; sc.Scan(); line++ {
		text := sc.Text()
		if i := strings.IndexByte(text, '#'); i >= 0 {
			text = text[:i]
		}
		fs := strings.Fields(text)
		if len(fs) == 0 {
			continue
		}
		if len(fs) != 4 {
			t.Fatalf("testdata/ulp.txt:%d: want 4 fields, got %q", line, fs)
		}
		d := tensor.DType(fs[0])
		a, b := parseF(t, fs[1]), parseF(t, fs[2])
		for _, pair := range [][2]float64{{a, b}, {b, a}} { // symmetric
			got, ok := ULPDistance(d, pair[0], pair[1])
			if fs[3] == "-" {
				if ok {
					t.Errorf("line %d: ULPDistance(%s, %g, %g) = %d, want undefined", line, d, pair[0], pair[1], got)
				}
				continue
			}
			want, err := strconv.ParseUint(fs[3], 10, 64)
			if err != nil {
				t.Fatalf("line %d: %v", line, err)
			}
			if !ok || got != want {
				t.Errorf("line %d: ULPDistance(%s, %g, %g) = %d, %v; want %d", line, d, pair[0], pair[1], got, ok, want)
			}
		}
		rows++
	}
	if rows < 20 {
		t.Fatalf("only %d rows read", rows)
	}
}

// TestULPDistanceSweep walks every finite non-negative E4M3FN and BF16
// code upward: each step must be exactly one ulp, and the distance from 0
// must equal the code (the codes of a sign-magnitude format are ordered).
func TestULPDistanceSweep(t *testing.T) {
	prev := 0.0
	for c := 1; c <= 0x7E; c++ {
		v := decodeE4M3(uint8(c))
		if d, ok := ULPDistance(tensor.F8E4M3, prev, v); !ok || d != 1 {
			t.Fatalf("E4M3 code %#x: distance from the previous code %d, %v", c, d, ok)
		}
		if d, _ := ULPDistance(tensor.F8E4M3, -v, v); d != uint64(2*c) {
			t.Fatalf("E4M3 code %#x: distance from its negative %d, want %d", c, d, 2*c)
		}
		prev = v
	}
	prev = 0
	for c := uint32(1); c < 0x7F80; c += 97 {
		v := float64(math.Float32frombits(c << 16))
		if d, ok := ULPDistance(tensor.BF16, 0, v); !ok || d != uint64(c) {
			t.Fatalf("BF16 code %#x: distance from zero %d, want %d", c, d, c)
		}
		prev = v
	}
	_ = prev
}

// decodeE4M3 decodes by the OCP formula, independently of reference/formats.
func decodeE4M3(c uint8) float64 {
	e, m := int(c>>3&0xF), float64(c&7)
	if e == 0 {
		return m * math.Ldexp(1, -9)
	}
	return (1 + m/8) * math.Ldexp(1, e-7)
}

func TestSpacing(t *testing.T) {
	tests := []struct {
		d    tensor.DType
		x    float64
		want float64
	}{
		{tensor.BF16, 1, 0x1p-7},
		{tensor.BF16, -3, 0x1p-6},
		{tensor.BF16, 0, 0x1p-133},
		{tensor.BF16, 0x1p-130, 0x1p-133}, // subnormal range
		{tensor.F16, 65504, 32},
		{tensor.F16, 1e-6, 0x1p-24},
		{tensor.F32, 1, 0x1p-23},
		{tensor.F64, 1, 0x1p-52},
		{tensor.F8E4M3, 448, 32},
		{tensor.F8E4M3, 0.001, 0x1p-9},
		{tensor.F8E5M2, 1.5, 0.25},
		{tensor.F8E8M0, 4, 4},
		{tensor.I32, 12345, 1},
	}
	for _, tc := range tests {
		if got := Spacing(tc.d, tc.x); got != tc.want {
			t.Errorf("Spacing(%s, %g) = %g, want %g", tc.d, tc.x, got, tc.want)
		}
	}
	if !math.IsNaN(Spacing(tensor.BF16, math.Inf(1))) {
		t.Errorf("Spacing of +Inf is not NaN")
	}
}

// TestSpacingMatchesFrexp: the spacing read from the exponent bits equals
// the one math.Frexp and math.Ldexp give, for every float dtype, on values
// across float64's whole range (subnormals and the dtype's own subnormal
// range included).
func TestSpacingMatchesFrexp(t *testing.T) {
	rng := rand.New(rand.NewPCG(12, 21))
	for name, fi := range formats.Binaries {
		d := tensor.DType(name)
		minNormal := math.Ldexp(1, fi.MinExp)
		want := func(x float64) float64 {
			ax := math.Abs(x)
			exp := fi.MinExp
			if ax >= minNormal {
				_, e := math.Frexp(ax)
				exp = e - 1
			}
			return math.Ldexp(1, exp-int(fi.MantBits))
		}
		sp := spacingOf(d)
		for i := 0; i < 200000; i++ {
			x := math.Float64frombits(rng.Uint64()&^(0x7FF<<52) | uint64(rng.IntN(2047))<<52)
			if got, w := sp(x), want(x); got != w {
				t.Fatalf("%s: spacing(%g) = %g, want %g", d, x, got, w)
			}
		}
	}
}
