package kernel

import (
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// FuzzParams feeds the metadata parsers (Params Float, RequiredFloat, Int,
// Bool, Enum and PrecisionFrom) arbitrary strings, as an evidence file's
// __metadata__ can hold anything. They must never panic, every error must
// name the parameter, and what they accept must mean what it says: an
// accepted value is checked against strconv (an independent parser) or
// against the fixed sets the spec allows, never against the parsers
// themselves. CI runs it for a short fixed time (make fuzz-short):
//
//	go test -run='^$' -fuzz='^FuzzParams$' -fuzztime=10m -parallel 1 ./internal/kernel
func FuzzParams(f *testing.F) {
	for _, s := range []string{"", "0", "1", "-1", "true", "false", "TRUE", "inf", "+Inf", "-inf", "NaN",
		"1e308", "1e309", "0x1p-1074", "4.9e-324", "9223372036854775807", "9223372036854775808", "-9223372036854775809",
		"0.1352337788608801", " 1", "1 ", "1_000", "0b101", "f32", "bf16", "BF16", "fp16", "F64", "int8", "\x00", "\xff\xfe"} {
		f.Add("num_splits", s)
		f.Add("acc_dtype", s)
	}
	f.Fuzz(func(t *testing.T, name, value string) {
		p := Params{name: value}
		named := func(err error) {
			t.Helper()
			if err != nil && !strings.Contains(err.Error(), name) {
				t.Fatalf("error %q does not name the parameter %q", err, name)
			}
		}

		// Float: absent when empty; otherwise ±inf spelled out, or what
		// strconv.ParseFloat reads (overflow to ±Inf is an error there).
		v, ok, err := p.Float(name)
		named(err)
		if ok != (value != "") {
			t.Fatalf("Float(%q): ok = %v for a value of %d bytes", value, ok, len(value))
		}
		if err == nil && ok {
			switch strings.ToLower(value) {
			case "inf", "+inf":
				if !math.IsInf(v, 1) {
					t.Fatalf("Float(%q) = %v, want +Inf", value, v)
				}
			case "-inf":
				if !math.IsInf(v, -1) {
					t.Fatalf("Float(%q) = %v, want -Inf", value, v)
				}
			default:
				want, perr := strconv.ParseFloat(value, 64)
				if perr != nil {
					t.Fatalf("Float accepted %q, which strconv rejects: %v", value, perr)
				}
				if !(want == v || math.IsNaN(want) && math.IsNaN(v)) || math.Signbit(want) != math.Signbit(v) {
					t.Fatalf("Float(%q) = %v, strconv says %v", value, v, want)
				}
			}
		}
		if _, rerr := p.RequiredFloat(name); (rerr == nil) != (ok && err == nil) {
			t.Fatalf("RequiredFloat(%q) err = %v but Float ok = %v err = %v", value, rerr, ok, err)
		} else {
			named(rerr)
		}

		// Int: the default when empty, else exactly strconv.Atoi.
		iv, err := p.Int(name, -7)
		named(err)
		if value == "" {
			if err != nil || iv != -7 {
				t.Fatalf("Int of an empty value = %d, %v; want the default -7", iv, err)
			}
		} else if want, aerr := strconv.Atoi(value); (aerr == nil) != (err == nil) || aerr == nil && want != iv {
			t.Fatalf("Int(%q) = %d, %v; strconv.Atoi gives %d, %v", value, iv, err, want, aerr)
		}

		// Bool: only the spec's spellings.
		bv, err := p.Bool(name, true)
		named(err)
		wantB, known := map[string]bool{"": true, "true": true, "1": true, "false": false, "0": false}[value]
		if known != (err == nil) || known && bv != wantB {
			t.Fatalf("Bool(%q) = %v, %v", value, bv, err)
		}

		// Enum: the result is always one of the allowed values.
		allowed := []string{"linear", "swizzled_128x4"}
		ev, err := p.Enum(name, "linear", allowed...)
		named(err)
		if err == nil && ev != "linear" && ev != "swizzled_128x4" {
			t.Fatalf("Enum(%q) = %q, not an allowed value", value, ev)
		}
		if err == nil && value != "" && ev != value {
			t.Fatalf("Enum(%q) = %q", value, ev)
		}

		// PrecisionFrom: every field from the allowed sets; errors name the key.
		pr, err := PrecisionFrom(p)
		named(err)
		if err == nil {
			for _, d := range []tensor.DType{pr.Acc, pr.P, pr.KVDequant} {
				switch d {
				case tensor.F64, tensor.F32, tensor.BF16, tensor.F16:
				default:
					t.Fatalf("PrecisionFrom(%q=%q) gave dtype %q", name, value, d)
				}
			}
		}
	})
}
