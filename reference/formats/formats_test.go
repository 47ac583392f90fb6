package formats_test

// Every expected value here comes from outside the package under test:
// NVIDIA's host conversion code (testdata/*.csv, see testdata/README.md), the
// OCP 8-bit floating point spec v1.0 and OCP MX spec v1.0 (constants written
// as hex-float literals so the ties are exact), the IEEE 754 binary16 layout,
// or a brute-force search over every code of a format. Nothing is checked only
// against the package's own round trips.

import (
	"encoding/csv"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/formats"
)

// ---------------------------------------------------------------------------
// Helpers

func readCSV(t *testing.T, name string) (header []string, rows [][]string) {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if len(recs) < 2 {
		t.Fatalf("%s: no data rows", name)
	}
	return recs[0], recs[1:]
}

func parseHex(t *testing.T, s string) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(s, 0, 64)
	if err != nil {
		t.Fatalf("bad hex %q: %v", s, err)
	}
	return v
}

// parseValue reads a table value: a decimal, or nan / inf / -inf.
func parseValue(t *testing.T, s string) float64 {
	t.Helper()
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "nan", "-nan":
		return math.NaN()
	case "inf", "+inf":
		return math.Inf(1)
	case "-inf":
		return math.Inf(-1)
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatalf("bad value %q: %v", s, err)
	}
	return v
}

// same reports whether a and b are the same value: both NaN, or equal with the
// same sign (so -0 and +0 differ).
func same(a, b float64) bool {
	if math.IsNaN(a) || math.IsNaN(b) {
		return math.IsNaN(a) && math.IsNaN(b)
	}
	return a == b && math.Signbit(a) == math.Signbit(b)
}

func modeName(m formats.Overflow) string {
	if m == formats.Saturate {
		return "Saturate"
	}
	return "NoSaturate"
}

var minifloats = []*formats.Minifloat{formats.E2M1, formats.E4M3FN, formats.E5M2}

// codes returns every code of f (0 .. 2^Bits-1).
func codes(f *formats.Minifloat) []uint8 {
	n := 1 << f.Bits()
	out := make([]uint8, n)
	for i := range out {
		out[i] = uint8(i)
	}
	return out
}

// positiveLadder is the sorted list of non-negative finite values of f with
// their codes (code 0 is +0).
type rung struct {
	code uint8
	v    float64
}

func positiveLadder(f *formats.Minifloat) []rung {
	var out []rung
	signBit := 1 << (f.Bits() - 1)
	for c := 0; c < signBit; c++ {
		v := f.Decode(uint8(c))
		if math.IsNaN(v) || math.IsInf(v, 0) {
			continue
		}
		out = append(out, rung{uint8(c), v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].v < out[j].v })
	return out
}

// ---------------------------------------------------------------------------
// NVIDIA tables (CUDA 11.8 host conversion code)

// TestFP8DecodeNVIDIA checks all 256 E4M3FN and E5M2 codes against
// __nv_cvt_fp8_to_halfraw.
func TestFP8DecodeNVIDIA(t *testing.T) {
	header, rows := readCSV(t, "fp8_decode.csv")
	if strings.Join(header, ",") != "code,e4m3fn,e5m2" {
		t.Fatalf("fp8_decode.csv header = %v", header)
	}
	if len(rows) != 256 {
		t.Fatalf("fp8_decode.csv has %d rows, want 256", len(rows))
	}
	seen := make(map[uint64]bool)
	for _, r := range rows {
		code := parseHex(t, r[0])
		if code > 0xFF || seen[code] {
			t.Fatalf("fp8_decode.csv: code %s out of range or repeated", r[0])
		}
		seen[code] = true
		for _, c := range []struct {
			f    *formats.Minifloat
			want string
		}{{formats.E4M3FN, r[1]}, {formats.E5M2, r[2]}} {
			want := parseValue(t, c.want)
			if got := c.f.Decode(uint8(code)); !same(got, want) {
				t.Errorf("%s.Decode(%#02x) = %v, CUDA gives %v", c.f.Name, code, got, want)
			}
		}
	}
}

// TestFP8EncodeNVIDIA checks every row of fp8_encode.csv (every midpoint
// between positive codes, the overflow boundaries, subnormals, zeros,
// infinities, NaN) under both overflow modes against __nv_cvt_float_to_fp8.
func TestFP8EncodeNVIDIA(t *testing.T) {
	header, rows := readCSV(t, "fp8_encode.csv")
	if strings.Join(header, ",") != "f32_bits,value,e4m3_satfinite,e4m3_nosat,e5m2_satfinite,e5m2_nosat" {
		t.Fatalf("fp8_encode.csv header = %v", header)
	}
	for _, r := range rows {
		bits := parseHex(t, r[0])
		x := float64(math.Float32frombits(uint32(bits)))
		// The value column is a second spelling of the input: if they
		// disagree the table is being misread.
		if v := parseValue(t, r[1]); !same(v, x) {
			t.Fatalf("row %s: value column %v does not match the bits (%v)", r[0], v, x)
		}
		for i, c := range []struct {
			f    *formats.Minifloat
			mode formats.Overflow
		}{
			{formats.E4M3FN, formats.Saturate},
			{formats.E4M3FN, formats.NoSaturate},
			{formats.E5M2, formats.Saturate},
			{formats.E5M2, formats.NoSaturate},
		} {
			want := uint8(parseHex(t, r[2+i]))
			// Encode's bit-level encoder and the arithmetic one it is
			// tested against (encode_bits_test.go) both answer to CUDA.
			for _, enc := range []struct {
				name   string
				encode func(float64, formats.Overflow) (uint8, formats.Accuracy)
			}{{"Encode", c.f.Encode}, {"EncodeGeneral", c.f.EncodeGeneral}} {
				if got, _ := enc.encode(x, c.mode); got != want {
					t.Errorf("%s.%s(%v [%s], %s) = %#02x, CUDA gives %#02x",
						c.f.Name, enc.name, x, r[0], modeName(c.mode), got, want)
				}
			}
		}
	}
	t.Logf("%d inputs x 4 conversions x 2 encoders checked", len(rows))
}

// TestBF16FP16NVIDIA checks __float2bfloat16 and __float2half_rn. CUDA writes
// every NaN as 0x7FFF, so NaN is compared by position, not payload.
func TestBF16FP16NVIDIA(t *testing.T) {
	header, rows := readCSV(t, "f32_to_bf16_fp16.csv")
	if strings.Join(header, ",") != "f32_bits,bf16_bits,fp16_bits" {
		t.Fatalf("f32_to_bf16_fp16.csv header = %v", header)
	}
	for _, r := range rows {
		f := math.Float32frombits(uint32(parseHex(t, r[0])))
		wantBF := uint16(parseHex(t, r[1]))
		wantFP := uint16(parseHex(t, r[2]))

		if got := formats.BF16Encode(f); !sameBF16(got, wantBF) {
			t.Errorf("BF16Encode(%s) = %#04x, CUDA gives %#04x", r[0], got, wantBF)
		}
		// A float32 converts to float64 exactly, so the single-rounding
		// path must agree with the float32 one on these inputs.
		if got := formats.BF16FromFloat64(float64(f)); !sameBF16(got, wantBF) {
			t.Errorf("BF16FromFloat64(%s) = %#04x, CUDA gives %#04x", r[0], got, wantBF)
		}
		if got := formats.FP16Encode(f); !sameFP16(got, wantFP) {
			t.Errorf("FP16Encode(%s) = %#04x, CUDA gives %#04x", r[0], got, wantFP)
		}
	}
}

func bf16IsNaN(b uint16) bool { return b&0x7F80 == 0x7F80 && b&0x007F != 0 }
func fp16IsNaN(b uint16) bool { return b&0x7C00 == 0x7C00 && b&0x03FF != 0 }

func sameBF16(got, want uint16) bool {
	if bf16IsNaN(want) || bf16IsNaN(got) {
		return bf16IsNaN(want) && bf16IsNaN(got)
	}
	return got == want
}

func sameFP16(got, want uint16) bool {
	if fp16IsNaN(want) || fp16IsNaN(got) {
		return fp16IsNaN(want) && fp16IsNaN(got)
	}
	return got == want
}

// ---------------------------------------------------------------------------
// OCP constants

// TestOCPConstants checks the values the OCP 8-bit FP spec v1.0 (E4M3, E5M2)
// and OCP MX spec v1.0 (E2M1) give for named codes.
func TestOCPConstants(t *testing.T) {
	nan := math.NaN()
	inf := math.Inf(1)
	tests := []struct {
		f    *formats.Minifloat
		code uint8
		want float64
		note string
	}{
		// E4M3: S.EEEE.MMM, bias 7; S.1111.111 is NaN, no infinities.
		{formats.E4M3FN, 0x00, 0, "+0"},
		{formats.E4M3FN, 0x80, math.Copysign(0, -1), "-0"},
		{formats.E4M3FN, 0x01, 0x1p-9, "min subnormal 0.001 x 2^-6"},
		{formats.E4M3FN, 0x07, 0x1.cp-7, "max subnormal 0.111 x 2^-6"},
		{formats.E4M3FN, 0x08, 0x1p-6, "min normal"},
		{formats.E4M3FN, 0x38, 1, "exponent field 7 = bias"},
		{formats.E4M3FN, 0x77, 240, "1.111 x 2^7"},
		{formats.E4M3FN, 0x78, 256, "1.000 x 2^8"},
		{formats.E4M3FN, 0x7E, 448, "max normal 1.110 x 2^8"},
		{formats.E4M3FN, 0xFE, -448, "-max"},
		{formats.E4M3FN, 0x7F, nan, "NaN S.1111.111"},
		{formats.E4M3FN, 0xFF, nan, "NaN S.1111.111"},
		// E5M2: S.EEEEE.MM, bias 15, IEEE-like specials.
		{formats.E5M2, 0x00, 0, "+0"},
		{formats.E5M2, 0x01, 0x1p-16, "min subnormal 0.01 x 2^-14"},
		{formats.E5M2, 0x03, 0x1.8p-15, "max subnormal 0.11 x 2^-14"},
		{formats.E5M2, 0x04, 0x1p-14, "min normal"},
		{formats.E5M2, 0x3C, 1, "exponent field 15 = bias"},
		{formats.E5M2, 0x7B, 57344, "max normal 1.11 x 2^15"},
		{formats.E5M2, 0xFB, -57344, "-max"},
		{formats.E5M2, 0x7C, inf, "+inf S.11111.00"},
		{formats.E5M2, 0xFC, -inf, "-inf"},
		{formats.E5M2, 0x7D, nan, "NaN S.11111.{01,10,11}"},
		{formats.E5M2, 0x7E, nan, "NaN"},
		{formats.E5M2, 0x7F, nan, "NaN"},
		{formats.E5M2, 0xFD, nan, "NaN"},
		{formats.E5M2, 0xFE, nan, "NaN"},
		{formats.E5M2, 0xFF, nan, "NaN"},
		// E2M1 (OCP MX section 5.3.3): S.EE.M, bias 1, no inf/NaN.
		{formats.E2M1, 0x0, 0, "+0"},
		{formats.E2M1, 0x1, 0.5, "subnormal 0.1 x 2^0"},
		{formats.E2M1, 0x2, 1, ""},
		{formats.E2M1, 0x3, 1.5, ""},
		{formats.E2M1, 0x4, 2, ""},
		{formats.E2M1, 0x5, 3, ""},
		{formats.E2M1, 0x6, 4, ""},
		{formats.E2M1, 0x7, 6, "max 1.1 x 2^2"},
		{formats.E2M1, 0x8, math.Copysign(0, -1), "-0"},
		{formats.E2M1, 0x9, -0.5, ""},
		{formats.E2M1, 0xA, -1, ""},
		{formats.E2M1, 0xB, -1.5, ""},
		{formats.E2M1, 0xC, -2, ""},
		{formats.E2M1, 0xD, -3, ""},
		{formats.E2M1, 0xE, -4, ""},
		{formats.E2M1, 0xF, -6, "-max"},
	}
	for _, tt := range tests {
		if got := tt.f.Decode(tt.code); !same(got, tt.want) {
			t.Errorf("%s.Decode(%#02x) = %v, OCP gives %v (%s)", tt.f.Name, tt.code, got, tt.want, tt.note)
		}
		if got, want := tt.f.IsNaN(tt.code), math.IsNaN(tt.want); got != want {
			t.Errorf("%s.IsNaN(%#02x) = %v, want %v", tt.f.Name, tt.code, got, want)
		}
		if got, want := tt.f.IsInf(tt.code), math.IsInf(tt.want, 0); got != want {
			t.Errorf("%s.IsInf(%#02x) = %v, want %v", tt.f.Name, tt.code, got, want)
		}
	}

	for _, c := range []struct {
		f           *formats.Minifloat
		bits        uint
		max, minSub float64
	}{
		{formats.E2M1, 4, 6, 0.5},
		{formats.E4M3FN, 8, 448, 0x1p-9},
		{formats.E5M2, 8, 57344, 0x1p-16},
	} {
		if got := c.f.Bits(); got != c.bits {
			t.Errorf("%s.Bits() = %d, want %d", c.f.Name, got, c.bits)
		}
		if got := c.f.MaxFinite(); got != c.max {
			t.Errorf("%s.MaxFinite() = %v, want %v", c.f.Name, got, c.max)
		}
		if got := c.f.SmallestSubnormal(); got != c.minSub {
			t.Errorf("%s.SmallestSubnormal() = %v, want %v", c.f.Name, got, c.minSub)
		}
	}
}

// TestSpecialCodeCounts sweeps every code and counts the classes the OCP spec
// defines: E4M3 has 2 NaN codes and no inf; E5M2 has 6 NaN codes and 2 inf;
// E2M1 has neither.
func TestSpecialCodeCounts(t *testing.T) {
	for _, c := range []struct {
		f             *formats.Minifloat
		nans, infs    int
		finite, zeros int
	}{
		{formats.E2M1, 0, 0, 16, 2},
		{formats.E4M3FN, 2, 0, 254, 2},
		{formats.E5M2, 6, 2, 248, 2},
	} {
		var nans, infs, finite, zeros int
		for _, code := range codes(c.f) {
			v := c.f.Decode(code)
			switch {
			case math.IsNaN(v):
				nans++
			case math.IsInf(v, 0):
				infs++
			default:
				finite++
				if v == 0 {
					zeros++
				}
			}
		}
		if nans != c.nans || infs != c.infs || finite != c.finite || zeros != c.zeros {
			t.Errorf("%s: %d NaN, %d inf, %d finite (%d zeros); OCP: %d, %d, %d (%d)",
				c.f.Name, nans, infs, finite, zeros, c.nans, c.infs, c.finite, c.zeros)
		}
	}
}

// TestDecodeIgnoresHighBits: a nibble read from a packed byte may carry the
// other nibble in its high bits; Decode is documented to ignore them.
func TestDecodeIgnoresHighBits(t *testing.T) {
	for c := 0; c < 256; c++ {
		if got, want := formats.E2M1.Decode(uint8(c)), formats.E2M1.Decode(uint8(c&0xF)); !same(got, want) {
			t.Errorf("E2M1.Decode(%#02x) = %v, want Decode(%#x) = %v", c, got, c&0xF, want)
		}
	}
}

// ---------------------------------------------------------------------------
// E2M1 rounding (reference/CONTRACTS.md §2)

func TestE2M1Ties(t *testing.T) {
	// Values by code: 0:0 1:0.5 2:1 3:1.5 4:2 5:3 6:4 7:6. An even
	// mantissa is an even code.
	tests := []struct {
		x    float64
		want float64
		note string
	}{
		{0x1p-2, 0, "0.25: tie 0|0.5, to even (0)"},
		{0x1.8p-1, 1, "0.75: tie 0.5|1, to even (1, code 2)"},
		{0x1.4p0, 1, "1.25: tie 1|1.5, to even (1)"},
		{0x1.cp0, 2, "1.75: tie 1.5|2, rounded up to even (2, code 4)"},
		{0x1.4p1, 2, "2.5: tie 2|3, to even (2)"},
		{0x1.cp1, 4, "3.5: tie 3|4, rounded up to even (4, code 6)"},
		{0x1.4p2, 4, "5: tie 4|6, to even (4)"},
		{0x1.0000000000001p-2, 0.5, "just above 0.25: up"},
		{0x1.fffffffffffffp-3, 0, "just below 0.25: down"},
		{0x1.7ffffffffffffp-1, 0.5, "just below 0.75: down"},
		{0x1.4000000000001p2, 6, "just above 5: up"},
		{0x1.3ffffffffffffp2, 4, "just below 5: down"},
		{6, 6, "max"},
		{0x1.cp2, 6, "7: saturates"},
		{0x1.8000000000001p2, 6, "just above 6: saturates"},
		{1e300, 6, "saturates"},
		{math.Inf(1), 6, "+inf saturates"},
		{0x1p-1074, 0, "tiny: 0"},
	}
	for _, tt := range tests {
		for _, neg := range []bool{false, true} {
			x, want := tt.x, tt.want
			if neg {
				x, want = -x, -want
			}
			for _, mode := range []formats.Overflow{formats.Saturate, formats.NoSaturate} {
				code, _ := formats.E2M1.Encode(x, mode)
				// Compare values: 0 and 8 (-0) are the same value.
				if got := formats.E2M1.Decode(code); got != want {
					t.Errorf("E2M1.Encode(%v, %s) = %#x (%v), want %v (%s)", x, modeName(mode), code, got, want, tt.note)
				}
				if code > 0xF {
					t.Errorf("E2M1.Encode(%v) = %#x uses more than 4 bits", x, code)
				}
			}
		}
	}
}

// ---------------------------------------------------------------------------
// E8M0

func TestE8M0(t *testing.T) {
	decode := []struct {
		code uint8
		want float64
	}{
		{0x00, 0x1p-127}, {0x01, 0x1p-126}, {0x7E, 0.5}, {0x7F, 1}, {0x80, 2},
		{0xFE, 0x1p127}, {0xFF, math.NaN()},
	}
	for _, tt := range decode {
		if got := formats.E8M0.Decode(tt.code); !same(got, tt.want) {
			t.Errorf("E8M0.Decode(%#02x) = %v, want %v", tt.code, got, tt.want)
		}
	}
	// Every code but NaN is 2^(b-127) and encodes back to itself.
	for c := 0; c < 255; c++ {
		v := formats.E8M0.Decode(uint8(c))
		if v != math.Ldexp(1, c-127) {
			t.Errorf("E8M0.Decode(%#02x) = %v, want 2^%d", c, v, c-127)
		}
		if got := formats.E8M0.Encode(v); got != uint8(c) {
			t.Errorf("E8M0.Encode(Decode(%#02x)) = %#02x", c, got)
		}
	}
	encode := []struct {
		x    float64
		want uint8
		note string
	}{
		{1, 0x7F, "exact"},
		{0x1.8p0, 0x7F, "1.5: linear midpoint of 1|2 stays at 1 (documented: up only above it)"},
		{0x1.8000000000001p0, 0x80, "just above 1.5: rounded up to 2"},
		{0x1.7ffffffffffffp0, 0x7F, "just below 1.5: 1"},
		{0x1.8p-1, 0x7E, "0.75: midpoint of 0.5|1 stays at 0.5"},
		{0x1.fffffffffffffp0, 0x80, "just below 2: 2"},
		{0x1p127, 0xFE, "largest"},
		{0x1p200, 0xFE, "clamps to the largest code, never NaN"},
		{0x1p-127, 0x00, "smallest"},
		{0x1p-200, 0x00, "clamps to the smallest code"},
		{0, 0x00, "zero clamps to the smallest code"},
		{-3, 0x00, "negatives clamp to the smallest code"},
		{math.Inf(1), 0xFF, "inf: NaN"},
		{math.Inf(-1), 0xFF, "-inf: NaN"},
		{math.NaN(), 0xFF, "NaN"},
	}
	for _, tt := range encode {
		if got := formats.E8M0.Encode(tt.x); got != tt.want {
			t.Errorf("E8M0.Encode(%v) = %#02x, want %#02x (%s)", tt.x, got, tt.want, tt.note)
		}
	}
}

// ---------------------------------------------------------------------------
// Exhaustive sweeps over every code of the minifloats

// TestMinifloatCodeSweep: for every code, decode→encode is the identity
// (finite codes in both modes, infinities under NoSaturate, and Saturate maps
// infinity to ±max); NaN codes decode to NaN and NaN encodes to a NaN code.
// The positive values increase strictly with the code.
func TestMinifloatCodeSweep(t *testing.T) {
	for _, f := range minifloats {
		for _, c := range codes(f) {
			v := f.Decode(c)
			switch {
			case math.IsNaN(v):
				if !f.IsNaN(c) {
					t.Errorf("%s: code %#02x decodes to NaN but IsNaN is false", f.Name, c)
				}
			case math.IsInf(v, 0):
				got, acc := f.Encode(v, formats.NoSaturate)
				if got != c || acc != formats.Exact {
					t.Errorf("%s.Encode(%v, NoSaturate) = %#02x, %v; want %#02x, Exact", f.Name, v, got, acc, c)
				}
				got, _ = f.Encode(v, formats.Saturate)
				if want := math.Copysign(f.MaxFinite(), v); f.Decode(got) != want {
					t.Errorf("%s.Encode(%v, Saturate) = %#02x, want ±max", f.Name, v, got)
				}
			default:
				for _, mode := range []formats.Overflow{formats.Saturate, formats.NoSaturate} {
					got, acc := f.Encode(v, mode)
					if got != c || acc != formats.Exact {
						t.Errorf("%s.Encode(Decode(%#02x) = %v, %s) = %#02x, %v; want the same code, Exact",
							f.Name, c, v, modeName(mode), got, acc)
					}
					if r, acc := f.Round(v, mode); !same(r, v) || acc != formats.Exact {
						t.Errorf("%s.Round(%v, %s) = %v, %v; want itself, Exact", f.Name, v, modeName(mode), r, acc)
					}
				}
			}
		}
		if f.NoNaN {
			continue
		}
		for _, mode := range []formats.Overflow{formats.Saturate, formats.NoSaturate} {
			for _, x := range []float64{math.NaN(), math.Copysign(math.NaN(), -1)} {
				if got, _ := f.Encode(x, mode); !f.IsNaN(got) {
					t.Errorf("%s.Encode(NaN, %s) = %#02x, not a NaN code", f.Name, modeName(mode), got)
				}
			}
		}
		ladder := positiveLadder(f)
		for i := 1; i < len(ladder); i++ {
			if ladder[i].code != ladder[i-1].code+1 {
				t.Errorf("%s: positive values are not ordered by code: %#02x (%v) after %#02x (%v)",
					f.Name, ladder[i].code, ladder[i].v, ladder[i-1].code, ladder[i-1].v)
			}
		}
	}
}

// TestMinifloatMidpointSweep: at the exact midpoint between every pair of
// neighbouring codes the result has an even mantissa (= an even code); one
// float64 ulp either side goes to the nearer code. Negatives mirror. Above
// the largest value the neighbour is max+spacing, which is an overflow (NaN
// for E4M3FN, inf for E5M2) under NoSaturate and max under Saturate.
func TestMinifloatMidpointSweep(t *testing.T) {
	n := 0
	for _, f := range minifloats {
		ladder := positiveLadder(f)
		for i := 0; i+1 < len(ladder); i++ {
			lo, hi := ladder[i], ladder[i+1]
			mid := (lo.v + hi.v) / 2 // exact: one more bit than the format
			even := lo
			if lo.code&1 != 0 {
				even = hi
			}
			for _, c := range []struct {
				x    float64
				want rung
				note string
			}{
				{mid, even, "tie, to even"},
				{math.Nextafter(mid, math.Inf(1)), hi, "just above the tie: up"},
				{math.Nextafter(mid, 0), lo, "just below the tie: down"},
			} {
				for _, mode := range []formats.Overflow{formats.Saturate, formats.NoSaturate} {
					n++
					checkEncode(t, f, c.x, mode, c.want.code, c.note)
					checkEncode(t, f, -c.x, mode, c.want.code|signBit(f), c.note)
				}
			}
		}

		// The midpoint above the largest value.
		top := ladder[len(ladder)-1]
		step := top.v - ladder[len(ladder)-2].v // same binade
		mid := top.v + step/2
		// The virtual next value top+step has code top+1's mantissa parity.
		overflowAtTie := top.code&1 != 0
		for _, c := range []struct {
			x        float64
			overflow bool
			note     string
		}{
			{math.Nextafter(mid, 0), false, "just below the overflow midpoint"},
			{mid, overflowAtTie, "overflow midpoint, to even"},
			{math.Nextafter(mid, math.Inf(1)), true, "just above the overflow midpoint"},
			{top.v + step, true, "max + spacing"},
			{math.Inf(1), true, "+inf"},
		} {
			for _, neg := range []bool{false, true} {
				x, sb := c.x, uint8(0)
				if neg {
					x, sb = -x, signBit(f)
				}
				checkEncode(t, f, x, formats.Saturate, top.code|sb, c.note+" (saturate)")
				want := top.code | sb
				if c.overflow && !f.NoNaN {
					if f.HasInf {
						want = (top.code + 1) | sb // S.11111.00
					} else {
						want = 0x7F | sb // S.1111.111
					}
				}
				checkEncode(t, f, x, formats.NoSaturate, want, c.note+" (no saturate)")
			}
		}
	}
	t.Logf("%d midpoint encodes checked", 2*n)
}

func signBit(f *formats.Minifloat) uint8 { return 1 << (f.Bits() - 1) }

func checkEncode(t *testing.T, f *formats.Minifloat, x float64, mode formats.Overflow, want uint8, note string) {
	t.Helper()
	if got, _ := f.Encode(x, mode); got != want {
		t.Errorf("%s.Encode(%x, %s) = %#02x (%v), want %#02x (%v): %s",
			f.Name, x, modeName(mode), got, f.Decode(got), want, f.Decode(want), note)
	}
}

// TestE4M3FNNoSaturateBoundary is the spec's own example: 464 rounds to 448
// (tie, 448 = 1.110 x 2^8 has the even mantissa), anything above 464 is NaN.
func TestE4M3FNNoSaturateBoundary(t *testing.T) {
	checkEncode(t, formats.E4M3FN, 0x1.dp8, formats.NoSaturate, 0x7E, "464: tie, to even 448")
	checkEncode(t, formats.E4M3FN, 0x1.d000000000001p8, formats.NoSaturate, 0x7F, "just above 464: NaN")
	checkEncode(t, formats.E4M3FN, 0x1.d000000000001p8, formats.Saturate, 0x7E, "just above 464: saturates")
	checkEncode(t, formats.E5M2, 0x1.ep15, formats.NoSaturate, 0x7C, "61440: tie, to even 65536 = inf")
	checkEncode(t, formats.E5M2, 0x1.dffffffffffffp15, formats.NoSaturate, 0x7B, "just below 61440: max")
}

// ---------------------------------------------------------------------------
// BF16

func TestBF16HalfwayRNE(t *testing.T) {
	tests := []struct {
		in   uint32
		want uint16
		note string
	}{
		{0x3F808000, 0x3F80, "1 + 2^-8: tie, to even (down)"},
		{0x3F818000, 0x3F82, "tie, rounded up to even"},
		{0x3F808001, 0x3F81, "just above the tie: up"},
		{0x3F807FFF, 0x3F80, "just below the tie: down"},
		{0x3F81FFFF, 0x3F82, "up"},
		{0xBF808000, 0xBF80, "negative tie, to even (toward zero)"},
		{0xBF818000, 0xBF82, "negative tie, to even (away from zero)"},
		{0x00008000, 0x0000, "subnormal tie, to even zero"},
		{0x00018000, 0x0002, "subnormal tie, rounded up to even"},
		{0x007F8000, 0x0080, "largest subnormal tie, rounded up to the min normal"},
		{0x7F7F7FFF, 0x7F7F, "just below the top tie: max"},
		{0x7F7F8000, 0x7F80, "top tie, to even: +inf (0x7F7F is odd)"},
		{0x7F7FFFFF, 0x7F80, "float32 max: +inf"},
		{0x7F800000, 0x7F80, "+inf"},
		{0xFF800000, 0xFF80, "-inf"},
		{0x80000000, 0x8000, "-0"},
	}
	for _, tt := range tests {
		if got := formats.BF16Encode(math.Float32frombits(tt.in)); got != tt.want {
			t.Errorf("BF16Encode(%#08x) = %#04x, want %#04x (%s)", tt.in, got, tt.want, tt.note)
		}
	}
	for _, in := range []uint32{0x7FC00000, 0x7F800001, 0xFFC00001, 0x7FBFFFFF} {
		if got := formats.BF16Encode(math.Float32frombits(in)); !bf16IsNaN(got) {
			t.Errorf("BF16Encode(NaN %#08x) = %#04x, not a NaN", in, got)
		}
	}
}

// TestBF16Sweep: every bf16 code decodes to its float32 top half and encodes
// back to itself; every midpoint between neighbours rounds to the even code.
func TestBF16Sweep(t *testing.T) {
	for c := 0; c < 1<<16; c++ {
		b := uint16(c)
		f := formats.BF16Decode(b)
		if math.Float32bits(f) != uint32(b)<<16 {
			t.Fatalf("BF16Decode(%#04x) = %#08x, want the top half", b, math.Float32bits(f))
		}
		if bf16IsNaN(b) {
			if got := formats.BF16Encode(f); !bf16IsNaN(got) {
				t.Errorf("BF16Encode(NaN %#04x) = %#04x", b, got)
			}
			continue
		}
		if got := formats.BF16Encode(f); got != b {
			t.Errorf("BF16Encode(BF16Decode(%#04x)) = %#04x", b, got)
		}
		if got := formats.BF16FromFloat64(float64(f)); got != b {
			t.Errorf("BF16FromFloat64(%v) = %#04x, want %#04x", f, got, b)
		}
	}
	for _, sign := range []uint32{0, 0x80000000} {
		// c and c+1 are neighbours for c < 0x7F80 (c+1 = 0x7F80 is inf,
		// the overflow neighbour).
		for c := uint32(0); c < 0x7F80; c++ {
			mid := sign | c<<16 | 0x8000
			even := uint16(sign>>16 | c)
			if c&1 != 0 {
				even++
			}
			if got := formats.BF16Encode(math.Float32frombits(mid)); got != even {
				t.Fatalf("BF16Encode(tie %#08x) = %#04x, want even %#04x", mid, got, even)
			}
			if got := formats.BF16Encode(math.Float32frombits(mid + 1)); got != uint16(sign>>16|c)+1 {
				t.Fatalf("BF16Encode(%#08x) = %#04x, want up", mid+1, got)
			}
			if got := formats.BF16Encode(math.Float32frombits(mid - 1)); got != uint16(sign>>16|c) {
				t.Fatalf("BF16Encode(%#08x) = %#04x, want down", mid-1, got)
			}
		}
	}
}

// TestBF16FromFloat64SingleRounding: float64 → bf16 must round once. Going
// through float32 first can land exactly on a bf16 midpoint and then round
// the wrong way (double rounding); RoundBF16 does that on purpose, as an fp32
// kernel does.
func TestBF16FromFloat64SingleRounding(t *testing.T) {
	tests := []struct {
		x      float64
		want   uint16 // single rounding
		viaF32 uint16 // float64 → float32 → bf16
		note   string
	}{
		// 1 + 2^-8 is the midpoint of 0x3F80 (1) and 0x3F81 (1 + 2^-7).
		{0x1.0100000001p0, 0x3F81, 0x3F80, "just above the midpoint: up (fp32 lands on the tie, goes to even)"},
		{0x1.00ffffffffp0, 0x3F80, 0x3F80, "just below the midpoint: down"},
		{0x1.01p0, 0x3F80, 0x3F80, "exact midpoint: to even"},
		// 1 + 3*2^-8 is the midpoint of 0x3F81 and 0x3F82.
		{0x1.02ffffffffp0, 0x3F81, 0x3F82, "just below an odd midpoint: down (fp32 lands on the tie, goes up to even)"},
		{0x1.0300000001p0, 0x3F82, 0x3F82, "just above: up"},
		{-0x1.0100000001p0, 0xBF81, 0xBF80, "negative: away from zero"},
		{-0x1.02ffffffffp0, 0xBF81, 0xBF82, "negative: toward zero"},
		// bf16 subnormals are spaced 2^-133: 2^-130 is code 0x0008 and
		// 2^-130 + 2^-134 is the midpoint of 0x0008 and 0x0009; float32 still
		// holds that midpoint exactly (its spacing there is 2^-149).
		{0x1.1000000001p-130, 0x0009, 0x0008, "subnormal: just above the midpoint"},
	}
	for _, tt := range tests {
		if got := formats.BF16FromFloat64(tt.x); got != tt.want {
			t.Errorf("BF16FromFloat64(%x) = %#04x, want %#04x (%s)", tt.x, got, tt.want, tt.note)
		}
		if got := formats.BF16Encode(float32(tt.x)); got != tt.viaF32 {
			t.Errorf("BF16Encode(float32(%x)) = %#04x, want %#04x (double rounding)", tt.x, got, tt.viaF32)
		}
		if got, want := formats.RoundBF16(tt.x), float64(formats.BF16Decode(tt.viaF32)); got != want {
			t.Errorf("RoundBF16(%x) = %v, want %v (through fp32, as a kernel does)", tt.x, got, want)
		}
	}
	if got := formats.BF16FromFloat64(math.NaN()); !bf16IsNaN(got) {
		t.Errorf("BF16FromFloat64(NaN) = %#04x", got)
	}
	for _, c := range []struct {
		x    float64
		want uint16
	}{{math.Inf(1), 0x7F80}, {math.Inf(-1), 0xFF80}, {1e300, 0x7F80}, {-1e300, 0xFF80}, {0x1p-1074, 0}} {
		if got := formats.BF16FromFloat64(c.x); got != c.want {
			t.Errorf("BF16FromFloat64(%v) = %#04x, want %#04x", c.x, got, c.want)
		}
	}
}

// ---------------------------------------------------------------------------
// FP16

// fp16Value is IEEE 754 binary16 by its definition, written independently of
// the package: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
func fp16Value(b uint16) float64 {
	s, e, m := b>>15, int(b>>10&0x1F), float64(b&0x3FF)
	var v float64
	switch {
	case e == 0x1F && m == 0:
		v = math.Inf(1)
	case e == 0x1F:
		return math.NaN()
	case e == 0:
		v = m * 0x1p-24
	default:
		v = (1024 + m) * math.Ldexp(1, e-25)
	}
	if s == 1 {
		v = -v
	}
	return v
}

func TestFP16KnownValues(t *testing.T) {
	tests := []struct {
		bits uint16
		want float64
		note string
	}{
		{0x3C00, 1, ""},
		{0x7BFF, 65504, "max 1.1111111111 x 2^15"},
		{0x0001, 0x1p-24, "min subnormal"},
		{0x03FF, 0x1.ff8p-15, "max subnormal"},
		{0x0400, 0x1p-14, "min normal"},
		{0x3555, 0x1.554p-2, "nearest to 1/3"},
		{0xC000, -2, ""},
		{0x7C00, math.Inf(1), "+inf"},
		{0xFC00, math.Inf(-1), "-inf"},
	}
	for _, tt := range tests {
		if got := float64(formats.FP16Decode(tt.bits)); got != tt.want {
			t.Errorf("FP16Decode(%#04x) = %v, want %v (%s)", tt.bits, got, tt.want, tt.note)
		}
		if got := formats.FP16Encode(float32(tt.want)); got != tt.bits {
			t.Errorf("FP16Encode(%v) = %#04x, want %#04x (%s)", tt.want, got, tt.bits, tt.note)
		}
	}
	encode := []struct {
		x    float32
		want uint16
		note string
	}{
		{0x1.ffcp15, 0x7BFF, "65504"},
		{0x1.ffdp15, 0x7BFF, "65512: below the top midpoint"},
		{0x1.ffep15, 0x7C00, "65520: top tie, to even: +inf"},
		{0x1p-25, 0x0000, "2^-25: tie 0|2^-24, to even 0"},
		{0x1.000002p-25, 0x0001, "just above 2^-25: min subnormal"},
		{0x1.8p-24, 0x0002, "1.5 x 2^-24: tie, rounded up to even"},
		{0x1.002p0, 0x3C00, "1 + 2^-11: tie, to even"},
		{0x1.006p0, 0x3C02, "1 + 3 x 2^-11: tie, rounded up to even"},
		{1e10, 0x7C00, "overflow: +inf"},
	}
	for _, tt := range encode {
		if got := formats.FP16Encode(tt.x); got != tt.want {
			t.Errorf("FP16Encode(%x) = %#04x, want %#04x (%s)", tt.x, got, tt.want, tt.note)
		}
	}
	if got, want := formats.RoundFP16(65504), 65504.0; got != want {
		t.Errorf("RoundFP16(65504) = %v", got)
	}
}

// TestFP16Sweep: every binary16 code against the IEEE definition, encode of
// decode is the identity, and every midpoint rounds to the even code.
func TestFP16Sweep(t *testing.T) {
	for c := 0; c < 1<<16; c++ {
		b := uint16(c)
		want := fp16Value(b)
		got := float64(formats.FP16Decode(b))
		if !same(got, want) {
			t.Fatalf("FP16Decode(%#04x) = %v, IEEE gives %v", b, got, want)
		}
		if math.IsNaN(want) {
			if e := formats.FP16Encode(float32(got)); !fp16IsNaN(e) {
				t.Errorf("FP16Encode(NaN %#04x) = %#04x", b, e)
			}
			continue
		}
		if e := formats.FP16Encode(float32(got)); e != b {
			t.Errorf("FP16Encode(FP16Decode(%#04x)) = %#04x", b, e)
		}
	}
	for _, sign := range []uint16{0, 0x8000} {
		for c := uint16(0); c < 0x7C00; c++ { // c+1 = 0x7C00 is inf: the overflow neighbour
			lo, hi := fp16Value(sign|c), fp16Value(sign|(c+1))
			if math.IsInf(hi, 0) {
				hi = math.Copysign(65536, hi)
			}
			mid := float32((lo + hi) / 2) // exact: 12 significant bits
			even := sign | c
			if c&1 != 0 {
				even = sign | (c + 1)
			}
			if got := formats.FP16Encode(mid); got != even {
				t.Fatalf("FP16Encode(tie %x) = %#04x, want even %#04x", mid, got, even)
			}
			away := float32(math.Copysign(math.Inf(1), float64(mid)))
			if got := formats.FP16Encode(math.Nextafter32(mid, away)); got != sign|(c+1) {
				t.Fatalf("FP16Encode(just above tie %x) = %#04x, want %#04x", mid, got, sign|(c+1))
			}
			if got := formats.FP16Encode(math.Nextafter32(mid, 0)); got != sign|c {
				t.Fatalf("FP16Encode(just below tie %x) = %#04x, want %#04x", mid, got, sign|c)
			}
		}
	}
}

func TestRoundF32(t *testing.T) {
	tests := []struct{ x, want float64 }{
		{0x1.000001p0, 1},                       // 1 + 2^-24: tie, to even
		{0x1.000003p0, 0x1.000004p0},            // 1 + 3·2^-24: tie, rounded up to even
		{0x1.0000010000001p0, 0x1.000002p0},     // just above the tie: up
		{0x1.fffffefffffffp127, 0x1.fffffep127}, // below the overflow midpoint: max
		{0x1.ffffffp127, math.Inf(1)},           // overflow midpoint: to even = inf
	}
	for _, tt := range tests {
		if got := formats.RoundF32(tt.x); got != tt.want {
			t.Errorf("RoundF32(%x) = %x, want %x", tt.x, got, tt.want)
		}
	}
}

// TestAccuracyReported: the Accuracy says on which side of x the stored value lies.
func TestAccuracyReported(t *testing.T) {
	for _, tt := range []struct {
		f    *formats.Minifloat
		x    float64
		want formats.Accuracy
	}{
		{formats.E4M3FN, 1, formats.Exact},
		{formats.E4M3FN, 0x1.1p0, formats.Below},  // 1.0625: tie 1|1.125, to even 1 (below)
		{formats.E4M3FN, 0x1.3p0, formats.Above},  // 1.1875: tie 1.125|1.25, rounded up to even 1.25
		{formats.E4M3FN, -0x1.3p0, formats.Below}, // stored -1.25 < -1.1875
		{formats.E4M3FN, 500, formats.Below},      // saturates to 448
		{formats.E2M1, 0x1.4p2, formats.Below},    // 5 → 4
	} {
		if _, acc := tt.f.Encode(tt.x, formats.Saturate); acc != tt.want {
			t.Errorf("%s.Encode(%v) accuracy = %v, want %v", tt.f.Name, tt.x, acc, tt.want)
		}
	}
}
