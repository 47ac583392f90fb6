package npy

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	npyio "codeberg.org/sbinet/npyio/npy"
	"codeberg.org/sbinet/npyio/npz"

	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// npyFile builds a version 1.0 file around a header dict, padded as numpy
// pads it (spaces and a newline, to a multiple of 64 bytes).
func npyFile(dict string, data []byte) []byte {
	b := []byte("\x93NUMPY\x01\x00")
	total := 10 + len(dict) + 1
	pad := (64 - total%64) % 64
	h := dict + strings.Repeat(" ", pad) + "\n"
	b = binary.LittleEndian.AppendUint16(b, uint16(len(h)))
	b = append(b, h...)
	return append(b, data...)
}

// TestReadHandBuilt reads the bytes np.save(f, np.arange(1, 7, dtype='<f4').reshape(2, 3))
// writes, laid out by hand from the format description (NEP 1).
func TestReadHandBuilt(t *testing.T) {
	dict := "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"
	// 17 + 24 + 17 + 1 = 59 characters. 10 (magic, version, length) + 59 +
	// 1 (newline) = 70, padded with 58 spaces to 128: header length 118.
	const headerLen = 118
	if len(dict) != 59 {
		t.Fatalf("hand-counted dict is %d bytes, want 59", len(dict))
	}
	file := []byte{0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, headerLen, 0}
	file = append(file, dict...)
	file = append(file, strings.Repeat(" ", 58)...)
	file = append(file, '\n')
	if len(file) != 128 {
		t.Fatalf("hand-built header is %d bytes, want 128", len(file))
	}
	file = append(file,
		0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x40, 0x40, // 1, 2, 3
		0x00, 0x00, 0x80, 0x40, 0x00, 0x00, 0xA0, 0x40, 0x00, 0x00, 0xC0, 0x40, // 4, 5, 6
	)
	tn, err := Read(bytes.NewReader(file))
	if err != nil {
		t.Fatal(err)
	}
	checkTensor(t, "arange", tn, tensor.F32, []int{2, 3}, []float64{1, 2, 3, 4, 5, 6})

	// The same bytes as a file: named by the stem.
	path := filepath.Join(t.TempDir(), "q_nope.npy")
	if err := os.WriteFile(path, file, 0o644); err != nil {
		t.Fatal(err)
	}
	ts, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 1 || ts["q_nope"] == nil {
		t.Fatalf("ReadFile gave %v, want one tensor q_nope", keys(ts))
	}
	checkTensor(t, "q_nope", ts["q_nope"], tensor.F32, []int{2, 3}, []float64{1, 2, 3, 4, 5, 6})
}

func keys(m map[string]*tensor.Tensor) []string {
	var k []string
	for n := range m {
		k = append(k, n)
	}
	slices.Sort(k)
	return k
}

func checkTensor(t *testing.T, name string, tn *tensor.Tensor, dtype tensor.DType, shape []int, vals []float64) {
	t.Helper()
	if tn.DType != dtype || !slices.Equal(tn.Shape, shape) {
		t.Errorf("%s: %s %v, want %s %v", name, tn.DType, tn.Shape, dtype, shape)
		return
	}
	if err := tn.Check(); err != nil {
		t.Errorf("%s: %v", name, err)
		return
	}
	if got := tn.Float64s(); !slices.Equal(got, vals) {
		t.Errorf("%s values = %v, want %v", name, got, vals)
	}
}

// TestReadNpyio reads arrays written by npyio, an independent writer, for
// every numeric dtype numpy and the contract share.
func TestReadNpyio(t *testing.T) {
	tests := []struct {
		name  string
		v     any
		dtype tensor.DType
		want  []float64
	}{
		{"f8", []float64{1.5, -2, math.MaxFloat64}, tensor.F64, []float64{1.5, -2, math.MaxFloat64}},
		{"f4", []float32{0.1, -3, 65504}, tensor.F32, []float64{float64(float32(0.1)), -3, 65504}},
		// npyio cannot write float16 (it panics "not implemented"): '<f2'
		// is covered by a hand-built file in TestBigEndian.
		{"i8", []int64{-1 << 40, 0, 7}, tensor.I64, []float64{-1 << 40, 0, 7}},
		{"i4", []int32{-5, math.MaxInt32}, tensor.I32, []float64{-5, math.MaxInt32}},
		{"i2", []int16{-300, 300}, tensor.I16, []float64{-300, 300}},
		{"i1", []int8{-128, 127}, tensor.I8, []float64{-128, 127}},
		{"u8", []uint64{1 << 50}, tensor.U64, []float64{1 << 50}},
		{"u4", []uint32{math.MaxUint32}, tensor.U32, []float64{math.MaxUint32}},
		{"u2 (bf16 bits)", []uint16{0x3F80, 0xC000}, tensor.U16, []float64{0x3F80, 0xC000}},
		{"u1 (packed fp4)", []uint8{0x21, 0xF7}, tensor.U8, []float64{0x21, 0xF7}},
		{"b1", []bool{true, false, true}, tensor.Bool, []float64{1, 0, 1}},
		{"scalar", float32(2.5), tensor.F32, []float64{2.5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := npyio.Write(&buf, tt.v); err != nil {
				t.Fatal(err)
			}
			tn, err := Read(&buf)
			if err != nil {
				t.Fatal(err)
			}
			shape := []int{len(tt.want)}
			if tt.name == "scalar" {
				shape = []int{}
			}
			checkTensor(t, tt.name, tn, tt.dtype, shape, tt.want)
		})
	}
}

// TestReadNpz reads an archive npyio writes (members named as given) and one
// laid out as np.savez / np.savez_compressed write it (members "x.npy",
// stored or deflated).
func TestReadNpz(t *testing.T) {
	dir := t.TempDir()
	p1 := filepath.Join(dir, "npyio.npz")
	if err := npz.Write(p1, map[string]any{
		"scale": []float32{0.25},
		"codes": []uint8{1, 2, 3},
	}); err != nil {
		t.Fatal(err)
	}
	ts, err := ReadFile(p1)
	if err != nil {
		t.Fatal(err)
	}
	if got := keys(ts); !slices.Equal(got, []string{"codes", "scale"}) {
		t.Fatalf("tensors %v", got)
	}
	checkTensor(t, "scale", ts["scale"], tensor.F32, []int{1}, []float64{0.25})
	checkTensor(t, "codes", ts["codes"], tensor.U8, []int{3}, []float64{1, 2, 3})

	for _, method := range []uint16{zip.Store, zip.Deflate} {
		var buf bytes.Buffer
		zw := zip.NewWriter(&buf)
		add := func(name string, b []byte) {
			w, err := zw.CreateHeader(&zip.FileHeader{Name: name, Method: method})
			if err != nil {
				t.Fatal(err)
			}
			w.Write(b)
		}
		add("q.npy", npyFile("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", []byte{1, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF}))
		add("kv/cache.npy", npyFile("{'descr': '|u1', 'fortran_order': False, 'shape': (1, 2), }", []byte{7, 9}))
		zw.Close()
		p := filepath.Join(dir, "savez.npz")
		if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		ts, err := ReadFile(p)
		if err != nil {
			t.Fatalf("method %d: %v", method, err)
		}
		if got := keys(ts); !slices.Equal(got, []string{"kv/cache", "q"}) {
			t.Fatalf("method %d: tensors %v", method, got)
		}
		checkTensor(t, "q", ts["q"], tensor.I32, []int{2}, []float64{1, -1})
		checkTensor(t, "kv/cache", ts["kv/cache"], tensor.U8, []int{1, 2}, []float64{7, 9})
	}
}

// TestFortranOrder: a column-major array is returned in row-major order.
// Expected values are indexed by hand, independently of the reorder loop.
func TestFortranOrder(t *testing.T) {
	// [[1, 2, 3], [4, 5, 6]] in Fortran order is 1, 4, 2, 5, 3, 6.
	var data []byte
	for _, v := range []int16{1, 4, 2, 5, 3, 6} {
		data = binary.LittleEndian.AppendUint16(data, uint16(v))
	}
	tn, err := Read(bytes.NewReader(npyFile("{'descr': '<i2', 'fortran_order': True, 'shape': (2, 3), }", data)))
	if err != nil {
		t.Fatal(err)
	}
	checkTensor(t, "2x3", tn, tensor.I16, []int{2, 3}, []float64{1, 2, 3, 4, 5, 6})

	// 3-D: element (i, j, k) holds 100i + 10j + k; Fortran order runs i
	// fastest, so write k outermost.
	const I, J, K = 2, 3, 4
	data = nil
	for k := 0; k < K; k++ {
		for j := 0; j < J; j++ {
			for i := 0; i < I; i++ {
				data = binary.LittleEndian.AppendUint32(data, math.Float32bits(float32(100*i+10*j+k)))
			}
		}
	}
	var want []float64
	for i := 0; i < I; i++ {
		for j := 0; j < J; j++ {
			for k := 0; k < K; k++ {
				want = append(want, float64(100*i+10*j+k))
			}
		}
	}
	tn, err = Read(bytes.NewReader(npyFile("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3, 4), }", data)))
	if err != nil {
		t.Fatal(err)
	}
	checkTensor(t, "2x3x4", tn, tensor.F32, []int{I, J, K}, want)

	// Empty and 1-D Fortran arrays need no reordering.
	tn, err = Read(bytes.NewReader(npyFile("{'descr': '<f4', 'fortran_order': True, 'shape': (0, 3), }", nil)))
	if err != nil {
		t.Fatal(err)
	}
	checkTensor(t, "0x3", tn, tensor.F32, []int{0, 3}, []float64{})
}

// TestBigEndian: '>' arrays are byte-swapped into the contract's little-endian;
// also the header spellings and dtypes the npyio writer cannot produce.
func TestBigEndian(t *testing.T) {
	tests := []struct {
		dict  string
		data  []byte
		dtype tensor.DType
		want  []float64
	}{
		{"{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", []byte{0x3F, 0x80, 0, 0, 0xC0, 0, 0, 0}, tensor.F32, []float64{1, -2}},
		{"{'descr': '>i8', 'fortran_order': False, 'shape': (1,), }", []byte{0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFE}, tensor.I64, []float64{-2}},
		{"{'descr': '>u2', 'fortran_order': False, 'shape': (1,), }", []byte{0x3F, 0x80}, tensor.U16, []float64{0x3F80}},
		{"{'descr': '|i1', 'fortran_order': False, 'shape': (1,), }", []byte{0xFE}, tensor.I8, []float64{-2}},
		// binary16: 1 = 0x3C00, -0.5 = 0xB800, 65504 = 0x7BFF (max).
		{"{'descr': '<f2', 'fortran_order': False, 'shape': (3,), }", []byte{0x00, 0x3C, 0x00, 0xB8, 0xFF, 0x7B}, tensor.F16, []float64{1, -0.5, 65504}},
		{"{'descr': '>f2', 'fortran_order': False, 'shape': (1,), }", []byte{0xB8, 0x00}, tensor.F16, []float64{-0.5}},
		// Python 2 files: long integers and double quotes.
		{`{"descr": "<u2", "fortran_order": False, "shape": (1L,)}`, []byte{0x80, 0x3F}, tensor.U16, []float64{0x3F80}},
		// A scalar.
		{"{'descr': '<f8', 'fortran_order': False, 'shape': (), }", binary.LittleEndian.AppendUint64(nil, math.Float64bits(0.125)), tensor.F64, []float64{0.125}},
	}
	for _, tt := range tests {
		tn, err := Read(bytes.NewReader(npyFile(tt.dict, tt.data)))
		if err != nil {
			t.Errorf("%s: %v", tt.dict, err)
			continue
		}
		shape := []int{len(tt.want)}
		if strings.Contains(tt.dict, "()") {
			shape = []int{}
		}
		checkTensor(t, tt.dict, tn, tt.dtype, shape, tt.want)
	}
}

// TestReadBad: malformed files give errors that say what is wrong.
func TestReadBad(t *testing.T) {
	f4 := func(shape string) string {
		return "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }"
	}
	v2 := []byte("\x93NUMPY\x02\x00")
	v2 = binary.LittleEndian.AppendUint32(v2, 1<<30)
	tests := []struct {
		name string
		in   []byte
		want []string
	}{
		{"empty", nil, []string{"0 bytes", "too short"}},
		{"truncated magic", []byte("\x93NUM"), []string{"too short"}},
		{"not npy", []byte("GIF89a, not numpy"), []string{"not a .npy array"}},
		{"version 4", []byte("\x93NUMPY\x04\x00\x00\x00"), []string{"version 4.0 is not supported"}},
		{"length cut", []byte("\x93NUMPY\x01\x00\x10"), []string{"header length", "truncated"}},
		{"header past the end", append([]byte("\x93NUMPY\x01\x00\x40\x00"), "{'descr'"...), []string{"header is 64 bytes", "ends after 8"}},
		{"header too long", v2, []string{"exceeds"}},
		{"header not a dict", npyFile("['descr', '<f4']", nil), []string{"want '{'"}},
		{"header cut", npyFile("{'descr': '<f4', 'fortran_order': Fal", nil), []string{".npy header"}},
		{"text after the dict", npyFile(f4("(1,)")+" junk", zeros(4)), []string{"text after the header dict"}},
		{"no descr", npyFile("{'fortran_order': False, 'shape': (1,), }", zeros(4)), []string{"no 'descr'"}},
		{"no shape", npyFile("{'descr': '<f4', 'fortran_order': False, }", zeros(4)), []string{"no 'shape'"}},
		{"no fortran_order", npyFile("{'descr': '<f4', 'shape': (1,), }", zeros(4)), []string{"no 'fortran_order'"}},
		{"fortran_order not bool", npyFile("{'descr': '<f4', 'fortran_order': 0, 'shape': (1,), }", zeros(4)), []string{"'fortran_order' is 0"}},
		{"shape a list", npyFile("{'descr': '<f4', 'fortran_order': False, 'shape': [1], }", zeros(4)), []string{"'shape' is", "not a tuple"}},
		{"shape not ints", npyFile(f4("('a',)"), zeros(4)), []string{"want an integer"}},
		{"negative dim", npyFile(f4("(2, -1)"), zeros(4)), []string{"shape[1] = -1 is negative"}},
		{"dim overflows int64", npyFile(f4("(99999999999999999999,)"), zeros(4)), []string{"bad integer"}},
		{"duplicate key", npyFile("{'descr': '<f4', 'descr': '<f8', 'fortran_order': False, 'shape': (1,), }", zeros(4)), []string{"'descr'", "twice"}},
		{"raw record of 3 bytes", npyFile("{'descr': '<V3', 'fortran_order': False, 'shape': (1,), }", zeros(3)), []string{`unsupported dtype "<V3"`, "raw records"}},
		{"complex", npyFile("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", zeros(8)), []string{`"<c8"`, "complex"}},
		{"object", npyFile("{'descr': '|O', 'fortran_order': False, 'shape': (1,), }", zeros(8)), []string{`"|O"`, "object"}},
		{"string", npyFile("{'descr': '<U3', 'fortran_order': False, 'shape': (1,), }", zeros(12)), []string{`"<U3"`, "string"}},
		{"structured", npyFile("{'descr': [('a', '<f4'), ('b', '<i4')], 'fortran_order': False, 'shape': (1,), }", zeros(8)), []string{"structured dtype", "('a', '<f4')"}},
		{"truncated data", npyFile(f4("(2, 3)"), zeros(20)), []string{"shape [2 3] of <f4 needs 24 bytes", "has 20"}},
		{"trillion elements", npyFile(f4("(1000000000000,)"), zeros(4)), []string{"needs 4000000000000 bytes"}},
		{"byte size overflow", npyFile(f4("(4294967296, 4294967296)"), zeros(4)), []string{"too large"}},
		{"trailing data", npyFile(f4("(1,)"), zeros(8)), []string{"bytes follow"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Through the file path (size known) and as a stream.
			path := filepath.Join(t.TempDir(), "x.npy")
			if err := os.WriteFile(path, tt.in, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := ReadFile(path)
			if err == nil {
				t.Fatal("ReadFile succeeded, want an error")
			}
			want := tt.want
			if tt.name == "not npy" || tt.name == "empty" || tt.name == "truncated magic" {
				want = []string{"not a .npy or .npz file"}
			}
			for _, w := range want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("ReadFile: error %q does not contain %q", err, w)
				}
			}
			if !strings.Contains(err.Error(), path) {
				t.Errorf("ReadFile: error %q does not name the file", err)
			}
			if tt.name == "trailing data" {
				return // a stream may hold more arrays after this one
			}
			if _, err := Read(bytes.NewReader(tt.in)); err == nil {
				t.Error("Read succeeded, want an error")
			} else if tt.name != "truncated data" && tt.name != "trillion elements" {
				for _, w := range tt.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("Read: error %q does not contain %q", err, w)
					}
				}
			}
		})
	}
}

func zeros(n int) []byte { return make([]byte, n) }

// TestReadStreamTruncated: without a known size, a short stream is caught
// after reading what there is (never by allocating what the header claims).
func TestReadStreamTruncated(t *testing.T) {
	in := npyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }", zeros(4))
	_, err := Read(bytes.NewReader(in))
	if err == nil || !strings.Contains(err.Error(), "needs 4000000000000 bytes of data, the file has 4") {
		t.Errorf("err = %v", err)
	}
}

func TestReadZipBad(t *testing.T) {
	good := npyFile("{'descr': '|u1', 'fortran_order': False, 'shape': (4,), }", []byte{1, 2, 3, 4})
	build := func(members ...[2]string) []byte {
		var buf bytes.Buffer
		zw := zip.NewWriter(&buf)
		for _, m := range members {
			w, _ := zw.CreateHeader(&zip.FileHeader{Name: m[0], Method: zip.Store})
			w.Write([]byte(m[1]))
		}
		zw.Close()
		return buf.Bytes()
	}
	corrupt := build([2]string{"a.npy", string(good)})
	// Flip the last data byte of the stored member: the CRC no longer matches.
	i := bytes.Index(corrupt, good) + len(good) - 1
	corrupt[i] ^= 0xFF
	tests := []struct {
		name string
		in   []byte
		want []string
	}{
		{"member not npy", build([2]string{"notes.txt", "hello, these are notes"}), []string{`member "notes.txt"`, "not a .npy array"}},
		{"duplicate array", build([2]string{"x.npy", string(good)}, [2]string{"x", string(good)}), []string{`"x" twice`}},
		{"bad member", build([2]string{"w.npy", string(npyFile("{'descr': '<V3', 'fortran_order': False, 'shape': (1,), }", zeros(3)))}), []string{`member "w.npy"`, "<V3"}},
		{"checksum", corrupt, []string{`member "a.npy"`, "checksum"}},
		{"cut archive", build([2]string{"a.npy", string(good)})[:40], []string{"zip"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "x.npz")
			if err := os.WriteFile(path, tt.in, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := ReadFile(path)
			if err == nil {
				t.Fatal("ReadFile succeeded, want an error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
	// An empty archive is valid and holds nothing.
	path := filepath.Join(t.TempDir(), "empty.npz")
	if err := os.WriteFile(path, build(), 0o644); err != nil {
		t.Fatal(err)
	}
	if ts, err := ReadFile(path); err != nil || len(ts) != 0 {
		t.Errorf("empty archive: %v, %v", keys(ts), err)
	}
}

func TestReadFileErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := ReadFile(filepath.Join(dir, "missing.npy")); err == nil || !strings.Contains(err.Error(), "missing.npy") {
		t.Errorf("missing file: %v", err)
	}
	if _, err := ReadFile(dir); err == nil || !strings.Contains(err.Error(), "directory") {
		t.Errorf("directory: %v", err)
	}
}

// FuzzRead: Read never panics, and what it accepts is a consistent tensor.
func FuzzRead(f *testing.F) {
	f.Add(npyFile("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", zeros(16)))
	f.Add(npyFile("{'descr': '>i2', 'fortran_order': False, 'shape': (3,), }", zeros(6)))
	f.Add(npyFile("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (), }", zeros(4)))
	f.Fuzz(func(t *testing.T, b []byte) {
		tn, err := Read(bytes.NewReader(b))
		if err != nil {
			return
		}
		if err := tn.Check(); err != nil {
			t.Fatalf("accepted an inconsistent tensor: %v", err)
		}
	})
}

// Arrays saved by ml_dtypes (testdata/ml_dtypes/make.py: numpy 2.4.6,
// ml_dtypes 0.7.0) arrive as their bits, U16 for bfloat16 ('<V2') and U8
// for the float8 formats ('<V1', '<f1'), and those bits are the values
// saved, [1, -2.5, 0.5, 448], in the dtype they were saved in.
func TestMLDtypesFiles(t *testing.T) {
	want := []float64{1, -2.5, 0.5, 448}
	for _, tc := range []struct {
		file   string
		bits   tensor.DType
		actual tensor.DType
	}{
		{"bfloat16.npy", tensor.U16, tensor.BF16},
		{"float8_e4m3fn.npy", tensor.U8, tensor.F8E4M3},
		{"float8_e5m2.npy", tensor.U8, tensor.F8E5M2},
	} {
		ts, err := ReadFile(filepath.Join("testdata", "ml_dtypes", tc.file))
		if err != nil {
			t.Fatalf("%s: %v", tc.file, err)
		}
		x := ts[strings.TrimSuffix(tc.file, ".npy")]
		if x == nil || x.DType != tc.bits || len(x.Shape) != 1 || x.Shape[0] != 4 {
			t.Fatalf("%s: %v, want %s [4]", tc.file, x, tc.bits)
		}
		typed := &tensor.Tensor{DType: tc.actual, Shape: x.Shape, Data: x.Data}
		for i, w := range want {
			if got := typed.Float64At(i); got != w {
				t.Errorf("%s[%d] as %s = %v, want %v", tc.file, i, tc.actual, got, w)
			}
		}
	}
	ts, err := ReadFile(filepath.Join("testdata", "ml_dtypes", "bf16_and_fp8.npz"))
	if err != nil {
		t.Fatal(err)
	}
	if ts["x"].DType != tensor.U16 || ts["s"].DType != tensor.U8 {
		t.Errorf("npz members x %s, s %s: want U16 and U8", ts["x"].DType, ts["s"].DType)
	}
}
