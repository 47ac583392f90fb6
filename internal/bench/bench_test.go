package bench

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/npy"
)

// TestWriteNPYMatchesNumpy: the bytes numpy 1.24's np.save writes for
// np.array([1.5, -2.0]), copied from `python3 -c "np.save(...)"`: magic,
// version 1.0, header length 0x76, the dict padded with spaces to a
// 64-byte boundary and a newline, then the data.
func TestWriteNPYMatchesNumpy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "h.npy")
	if err := WriteNPY(path, F64Array([]float64{1.5, -2}, 2)); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dict := "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }"
	want := "\x93NUMPY\x01\x00v\x00" + dict + strings.Repeat(" ", 128-10-len(dict)-1) + "\n" +
		"\x00\x00\x00\x00\x00\x00\xf8\x3f" + // 1.5
		"\x00\x00\x00\x00\x00\x00\x00\xc0" // -2
	if !bytes.Equal(got, []byte(want)) {
		t.Errorf("npy bytes\n got %q\nwant %q", got, want)
	}
}

// TestWriteNPYRoundTrip: every dtype the bench writes reads back through
// internal/npy with its shape and values.
func TestWriteNPYRoundTrip(t *testing.T) {
	dir := t.TempDir()
	cases := map[string]Array{
		"f":  F64Array([]float64{0, -1, math.Inf(1), 3.25, 1e-300, 7}, 2, 3),
		"i":  I32Array([]int64{-1, 0, 70000}, 3),
		"u2": {Descr: "<u2", Shape: []int{1, 2}, Data: []byte{0x80, 0x3F, 0x00, 0xC0}},
		"u1": {Descr: "|u1", Shape: []int{2, 1, 2}, Data: []byte{1, 2, 3, 255}},
	}
	if err := WriteAll(dir, cases); err != nil {
		t.Fatal(err)
	}
	want := map[string][]float64{"f": {0, -1, math.Inf(1), 3.25, 1e-300, 7}, "i": {-1, 0, 70000}, "u2": {0x3F80, 0xC000}, "u1": {1, 2, 3, 255}}
	for name, a := range cases {
		ts, err := npy.ReadFile(filepath.Join(dir, name+".npy"))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got := ts[name]
		if got == nil || len(got.Shape) != len(a.Shape) {
			t.Fatalf("%s: read %v", name, got)
		}
		for i, d := range a.Shape {
			if got.Shape[i] != d {
				t.Errorf("%s: shape %v, want %v", name, got.Shape, a.Shape)
			}
		}
		for i, v := range got.Float64s() {
			if v != want[name][i] {
				t.Errorf("%s[%d] = %v, want %v", name, i, v, want[name][i])
			}
		}
	}
	if err := WriteNPY(filepath.Join(dir, "bad.npy"), Array{Descr: "<f8", Shape: []int{3}, Data: make([]byte, 16)}); err == nil {
		t.Error("16 bytes written as 3 float64s: want an error")
	}
	if err := WriteNPY(filepath.Join(dir, "bad.npy"), F64Array([]float64{1, 2}, 3)); err == nil {
		t.Error("2 float64s written as 3: want an error")
	}
}

// TestAgreement: hand-computed differences, and mismatched specials.
func TestAgreement(t *testing.T) {
	// |1-1.5|/1.5 = 1/3 elementwise; normwise 0.5/max|b| = 0.5/4.
	mr, nr, err := Agreement([]float64{1, 4, 0, math.Inf(-1)}, []float64{1.5, 4, 0, math.Inf(-1)})
	if err != nil || math.Abs(mr-1.0/3) > 1e-15 || nr != 0.125 {
		t.Errorf("Agreement = %v, %v, %v; want 1/3, 0.125", mr, nr, err)
	}
	if _, _, err := Agreement([]float64{math.NaN()}, []float64{1}); err == nil {
		t.Error("NaN against 1: want an error")
	}
	if _, _, err := Agreement([]float64{1}, []float64{1, 2}); err == nil {
		t.Error("lengths 1 and 2: want an error")
	}
}

// TestPeakRSSSeesAllocation: touching 64 MiB raises the reported peak by
// about that much.
func TestPeakRSSSeesAllocation(t *testing.T) {
	before := PeakRSS()
	if before <= 0 {
		t.Skip("no VmHWM or ru_maxrss here")
	}
	b := make([]byte, 64<<20)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	after := PeakRSS()
	if after-before < 48<<20 {
		t.Errorf("peak RSS %d -> %d after touching 64 MiB", before, after)
	}
	_ = b[len(b)-1]
}

// TestSmallCasesRun builds and runs each kind of case at a small size: the
// inputs are the sizes the case says and the outputs are finite and not all
// zero.
func TestSmallCasesRun(t *testing.T) {
	for _, c := range []Case{
		MLADecode("t mla", 2, 8, 100),
		SplitKCombine("t combine", 8, 4, 16),
		NVFP4GEMM("t gemm", 4, 8, 64),
		NVFP4Dequantize("t dequant", 4, 64),
	} {
		p, err := c.Build()
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		var n int64
		for _, a := range p.Inputs {
			n += a.Nbytes()
		}
		if n < p.InputBytes/2 || p.InputBytes <= 0 {
			t.Errorf("%s: input arrays of %d bytes against InputBytes %d", c.Name, n, p.InputBytes)
		}
		outs, err := p.Run()
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		for name, o := range outs {
			size, nonzero := 1, false
			for _, d := range o.Shape {
				size *= d
			}
			if len(o.V) != size {
				t.Errorf("%s %s: %d values for shape %v", c.Name, name, len(o.V), o.Shape)
			}
			for _, v := range o.V {
				if math.IsNaN(v) || math.IsInf(v, 0) {
					t.Fatalf("%s %s: non-finite %v", c.Name, name, v)
				}
				nonzero = nonzero || v != 0
			}
			if !nonzero {
				t.Errorf("%s %s: all zero", c.Name, name)
			}
		}
	}
}
