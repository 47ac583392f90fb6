package safetensors

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/google/go-cmp/cmp"

	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// build assembles a file from a header string and a data buffer, with the
// header length computed (the tests of bad lengths write their own bytes).
func build(header string, data []byte) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	b = append(b, header...)
	return append(b, data...)
}

func zeros(n int) []byte { return make([]byte, n) }

// allDTypes is the spec's dtype list, written out here rather than read
// from the package under test.
var allDTypes = []struct {
	name string
	size int
}{
	{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2},
	{"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1},
	{"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1},
	{"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1}, {"BOOL", 1},
}

type badCase struct {
	name string
	in   []byte
	want []string // substrings of the error
}

// badCases are malformed files, one per problem; the fuzz seed corpus holds
// them too.
func badCases() []badCase {
	lenPrefix := func(n uint64, rest string) []byte {
		return append(binary.LittleEndian.AppendUint64(nil, n), rest...)
	}
	w := func(dtype, shape, offs string) string {
		return `{"w":{"dtype":"` + dtype + `","shape":` + shape + `,"data_offsets":` + offs + `}}`
	}
	return []badCase{
		{"empty file", nil, []string{"0 bytes", "too short"}},
		{"truncated length", []byte{2, 0, 0, 0, 0, 0, 0}, []string{"7 bytes", "too short"}},
		{"header length past the end", lenPrefix(100, `{}`), []string{"header length 100", "past the end"}},
		{"header length huge", lenPrefix(1<<40, `{}`), []string{"header length 1099511627776", "limit"}},
		{"header length max uint64", lenPrefix(math.MaxUint64, `{}`), []string{"limit"}},
		{"empty header", build("", nil), []string{"header is empty"}},
		{"header not JSON", build(`not json at all`, nil), []string{"header is not JSON"}},
		{"header cut short", build(`{"w":{"dtype":"F32"`, nil), []string{"header is not JSON"}},
		{"header trailing garbage", build(`{} x`, nil), []string{"header is not JSON"}},
		{"header is an array", build(`[1,2]`, nil), []string{"not an object"}},
		{"header is a string", build(`"hi"`, nil), []string{"not an object"}},
		{"header not UTF-8", build("{\"\xff\":1}", nil), []string{"UTF-8"}},
		{"entry not an object", build(`{"w":5}`, nil), []string{`tensor "w"`, "a number"}},
		{"entry is null", build(`{"w":null}`, nil), []string{`tensor "w"`, "null"}},
		{"unknown dtype", build(w("F8_E4M3FNUZ", "[1]", "[0,1]"), zeros(1)), []string{`tensor "w"`, `unknown dtype "F8_E4M3FNUZ"`}},
		{"lower-case dtype", build(w("f32", "[1]", "[0,4]"), zeros(4)), []string{`tensor "w"`, `unknown dtype "f32"`}},
		{"dtype not a string", build(`{"w":{"dtype":4,"shape":[1],"data_offsets":[0,4]}}`, zeros(4)), []string{`tensor "w"`, "dtype is a number in the header, want a string"}},
		{"no dtype", build(`{"w":{"shape":[1],"data_offsets":[0,4]}}`, zeros(4)), []string{`tensor "w"`, "no dtype"}},
		{"no shape", build(`{"w":{"dtype":"F32","data_offsets":[0,4]}}`, zeros(4)), []string{`tensor "w"`, "no shape"}},
		{"no data_offsets", build(`{"w":{"dtype":"F32","shape":[1]}}`, zeros(4)), []string{`tensor "w"`, "no data_offsets"}},
		{"negative dim", build(w("F32", "[2,-3]", "[0,4]"), zeros(4)), []string{`tensor "w"`, "shape[1] = -3 is negative"}},
		{"fractional dim", build(w("F32", "[1.5]", "[0,4]"), zeros(4)), []string{`tensor "w"`, "shape[0] = 1.5 is not an integer"}},
		{"dim beyond int64", build(w("F32", "[99999999999999999999]", "[0,4]"), zeros(4)), []string{`tensor "w"`, "not an integer"}},
		{"shape not an array", build(w("F32", `"2x2"`, "[0,16]"), zeros(16)), []string{`tensor "w"`, "shape is a string in the header, want an array of integers"}},
		{"one data offset", build(w("F32", "[1]", "[4]"), zeros(4)), []string{`tensor "w"`, "data_offsets has 1 numbers"}},
		{"negative offset", build(w("F32", "[1]", "[-4,0]"), zeros(4)), []string{`tensor "w"`, "data_offsets[0] = -4 is negative"}},
		{"reversed offsets", build(w("F32", "[1]", "[4,0]"), zeros(4)), []string{`tensor "w"`, "[4, 0] are reversed"}},
		{"offsets past the buffer", build(w("F32", "[4]", "[0,16]"), zeros(8)), []string{`tensor "w"`, "[0, 16] run past the end", "8 bytes"}},
		{"byte size mismatch", build(w("F32", "[2,3]", "[0,12]"), zeros(12)), []string{`tensor "w"`, "give 12 bytes", "shape [2 3] of F32 needs 24"}},
		{"byte size mismatch fp8", build(w("F8_E4M3", "[4]", "[0,8]"), zeros(8)), []string{`tensor "w"`, "give 8 bytes", "needs 4"}},
		{"trillion elements", build(w("F32", "[1000000000000]", "[0,4]"), zeros(4)), []string{`tensor "w"`, "needs 4000000000000"}},
		{"element count overflow", build(w("F64", "[4294967296,4294967296]", "[0,8]"), zeros(8)), []string{`tensor "w"`, "too large"}},
		{"overflow hidden by a zero dim", build(w("F64", "[0,4294967296,4294967296]", "[0,0]"), nil), []string{`tensor "w"`, "too large"}},
		{"overlap", build(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, zeros(12)),
			[]string{`tensor "b"`, "overlap tensor \"a\""}},
		{"same range twice", build(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, zeros(4)),
			[]string{`tensor "b"`, "overlap tensor \"a\""}},
		{"hole between tensors", build(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}`, zeros(12)),
			[]string{`tensor "b"`, "hole", "bytes [4, 8)", `tensor "a"`}},
		{"hole at the start", build(w("F32", "[1]", "[4,8]"), zeros(8)), []string{`tensor "w"`, "hole", "bytes [0, 4) at the start of the data buffer"}},
		{"trailing bytes", build(w("F32", "[1]", "[0,4]"), zeros(8)), []string{"4 bytes of data after the last tensor \"w\""}},
		{"data but no tensors", build(`{}`, zeros(3)), []string{"3 bytes of data after the header"}},
		{"duplicate name", build(`{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`, zeros(2)),
			[]string{`"w" twice`}},
		// A key twice inside __metadata__ or a tensor's entry (issue 11 item
		// 14): a JSON decoder keeps the last, so the file would mean
		// something other than what either writer wrote.
		{"metadata key twice", build(`{"__metadata__":{"kcheck.kernel":"nvfp4_gemm","kcheck.kernel":"mla_decode"}}`, nil),
			[]string{`__metadata__ names "kcheck.kernel" twice`}},
		{"entry dtype twice", build(`{"w":{"dtype":"F32","shape":[1],"dtype":"BF16","data_offsets":[0,4]}}`, zeros(4)),
			[]string{`tensor "w"`, `header entry names "dtype" twice`}},
		{"entry shape twice", build(`{"w":{"dtype":"U8","shape":[4],"shape":[2,2],"data_offsets":[0,4]}}`, zeros(4)),
			[]string{`tensor "w"`, `header entry names "shape" twice`}},
		{"entry data_offsets twice", build(`{"w":{"dtype":"U8","shape":[4],"data_offsets":[4,8],"data_offsets":[0,4]}}`, zeros(8)),
			[]string{`tensor "w"`, `header entry names "data_offsets" twice`}},
		// encoding/json matches field names without regard to case, so a
		// key that differs only in case is the same field twice.
		{"entry dtype twice in another case", build(`{"w":{"dtype":"F32","DType":"BF16","shape":[1],"data_offsets":[0,4]}}`, zeros(4)),
			[]string{`tensor "w"`, `header entry names "dtype" twice (once as "DType")`}},
		{"entry unknown key twice", build(`{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1,"x":2}}`, zeros(1)),
			[]string{`tensor "w"`, `header entry names "x" twice`}},
		{"metadata value a number", build(`{"__metadata__":{"softmax_scale":0.125}}`, nil), []string{`__metadata__["softmax_scale"] is a number`, "not a string"}},
		{"metadata value null", build(`{"__metadata__":{"k":null}}`, nil), []string{`__metadata__["k"] is null`}},
		{"metadata value nested", build(`{"__metadata__":{"k":{"a":"b"}}}`, nil), []string{`__metadata__["k"] is an object`}},
		{"metadata an array", build(`{"__metadata__":["a"]}`, nil), []string{"__metadata__ is an array"}},
		{"metadata a string", build(`{"__metadata__":"a"}`, nil), []string{"__metadata__ is a string"}},
	}
}

// TestParseBad: every malformed input gives an error naming the tensor (or
// the header part) and the problem.
func TestParseBad(t *testing.T) {
	for _, tt := range badCases() {
		t.Run(tt.name, func(t *testing.T) {
			f, err := Parse(tt.in)
			if err == nil {
				t.Fatalf("Parse succeeded (%d tensors), want an error", len(f.Tensors))
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// TestParseGood covers the legal corners: no tensors, null metadata, scalars,
// empty tensors sharing an offset, unknown entry fields, padding.
func TestParseGood(t *testing.T) {
	tests := []struct {
		name      string
		in        []byte
		names     []string
		shapes    [][]int
		meta      map[string]string
		dataBytes []int
	}{
		{"no tensors", build(`{}`, nil), nil, nil, map[string]string{}, nil},
		{"no tensors, HF padding", build(`{}      `, nil), nil, nil, map[string]string{}, nil},
		{"null metadata", build(`{"__metadata__":null}`, nil), nil, nil, map[string]string{}, nil},
		{"metadata only", build(`{"__metadata__":{"kcheck.format":"1","a":""}}`, nil), nil, nil, map[string]string{"kcheck.format": "1", "a": ""}, nil},
		{"scalar", build(`{"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}`, zeros(4)), []string{"s"}, [][]int{{}}, map[string]string{}, []int{4}},
		{"empty tensors", build(`{"b":{"dtype":"F32","shape":[0,4],"data_offsets":[4,4]},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"c":{"dtype":"I64","shape":[3,0],"data_offsets":[4,4]}}`, zeros(4)),
			[]string{"a", "b", "c"}, [][]int{{4}, {0, 4}, {3, 0}}, map[string]string{}, []int{4, 0, 0}},
		{"unknown entry field ignored", build(`{"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"extra":[1]}}`, zeros(2)), []string{"w"}, [][]int{{2}}, map[string]string{}, []int{2}},
		{"whitespace and newlines", build("\n{ \"w\" : { \"data_offsets\" : [ 0 , 2 ] , \"shape\" : [ 1 ] , \"dtype\" : \"BF16\" } }\n  ", zeros(2)), []string{"w"}, [][]int{{1}}, map[string]string{}, []int{2}},
		{"offset order, not name order", build(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[2,3]},"b":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}`, zeros(3)),
			[]string{"b", "a"}, [][]int{{2}, {1}}, map[string]string{}, []int{2, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := Parse(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.names, f.Names); diff != "" {
				t.Errorf("Names (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.meta, f.Metadata); diff != "" {
				t.Errorf("Metadata (-want +got):\n%s", diff)
			}
			if len(f.Tensors) != len(tt.names) {
				t.Errorf("%d tensors, want %d", len(f.Tensors), len(tt.names))
			}
			for i, name := range tt.names {
				tn := f.Tensors[name]
				if tn == nil {
					t.Fatalf("tensor %q missing", name)
				}
				if diff := cmp.Diff(tt.shapes[i], tn.Shape); diff != "" {
					t.Errorf("%s shape (-want +got):\n%s", name, diff)
				}
				if len(tn.Data) != tt.dataBytes[i] || cap(tn.Data) != len(tn.Data) {
					t.Errorf("%s: len %d cap %d, want %d bytes capped", name, len(tn.Data), cap(tn.Data), tt.dataBytes[i])
				}
				if err := tn.Check(); err != nil {
					t.Errorf("%s: %v", name, err)
				}
			}
		})
	}
}

// TestParseHuggingFaceFile reads bytes laid out as Python's safetensors
// (safetensors.torch.save_file) writes them, built by hand from the
// published format: the Rust serializer orders tensors by dtype (larger
// first) then name, writes __metadata__ first, and pads the header with
// spaces to a multiple of 8.
//
//	save_file({"weight": torch.tensor([[1., 2.], [3., 4.]], dtype=torch.bfloat16),
//	           "scale": torch.tensor([0.5]),
//	           "codes": torch.tensor([448., -1.]).to(torch.float8_e4m3fn)},
//	          "x.safetensors", metadata={"format": "pt"})
func TestParseHuggingFaceFile(t *testing.T) {
	header := `{"__metadata__":{"format":"pt"},` +
		`"scale":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},` +
		`"weight":{"dtype":"BF16","shape":[2,2],"data_offsets":[4,12]},` +
		`"codes":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[12,14]}}`
	// 32 + 57 + 62 + 63 = 214 characters, padded with 2 spaces to 216.
	const headerLen = 216
	header += "  "
	if len(header) != headerLen {
		t.Fatalf("hand-built header is %d bytes, want %d", len(header), headerLen)
	}
	file := []byte{0xD8, 0, 0, 0, 0, 0, 0, 0} // 216, little-endian
	file = append(file, header...)
	file = append(file,
		0x00, 0x00, 0x00, 0x3F, // 0.5f
		0x80, 0x3F, 0x00, 0x40, 0x40, 0x40, 0x80, 0x40, // bf16 1, 2, 3, 4
		0x7E, 0xB8, // e4m3 448 = S.1111.110, -1 = 1.0111.000
	)
	f, err := Parse(file)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"scale", "weight", "codes"}, f.Names); diff != "" {
		t.Errorf("Names (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]string{"format": "pt"}, f.Metadata); diff != "" {
		t.Errorf("Metadata (-want +got):\n%s", diff)
	}
	for _, c := range []struct {
		name  string
		dtype tensor.DType
		shape []int
		vals  []float64
	}{
		{"scale", tensor.F32, []int{1}, []float64{0.5}},
		{"weight", tensor.BF16, []int{2, 2}, []float64{1, 2, 3, 4}},
		{"codes", tensor.F8E4M3, []int{2}, []float64{448, -1}},
	} {
		tn := f.Tensors[c.name]
		if tn == nil {
			t.Fatalf("tensor %q missing", c.name)
		}
		if tn.DType != c.dtype || !cmp.Equal(tn.Shape, c.shape) {
			t.Errorf("%s: %s %v, want %s %v", c.name, tn.DType, tn.Shape, c.dtype, c.shape)
		}
		if diff := cmp.Diff(c.vals, tn.Float64s()); diff != "" {
			t.Errorf("%s values (-want +got):\n%s", c.name, diff)
		}
	}
}

// randomTensor fills a tensor of each dtype with arbitrary bytes: the format
// must carry every bit pattern (NaN payloads, FP8 NaN codes) untouched.
func randomTensor(r *rand.Rand, dtype string, shape ...int) *tensor.Tensor {
	t := tensor.New(tensor.DType(dtype), shape...)
	for i := range t.Data {
		t.Data[i] = byte(r.UintN(256))
	}
	return t
}

func sampleTensors(r *rand.Rand) map[string]*tensor.Tensor {
	ts := map[string]*tensor.Tensor{}
	for i, d := range allDTypes {
		ts["t_"+d.name] = randomTensor(r, d.name, 3, 1+i%4)
	}
	ts["scalar"] = randomTensor(r, "F32")
	ts["empty"] = randomTensor(r, "BF16", 0, 7)
	ts["packed_fp4"] = randomTensor(r, "U8", 4, 8)
	ts[`odd "name" <&> é`] = randomTensor(r, "F8_E5M2", 5)
	return ts
}

var sampleMeta = map[string]string{
	"kcheck.format":   "1",
	"kcheck.kernel":   "nvfp4_quantize",
	"softmax_scale":   "0.1352337788608801",
	"note":            "quotes \" and <tags> & unicode ✓",
	"empty":           "",
	"__metadata__":    "a key that looks like the reserved name is still a key",
	"newline\nin key": "tab\tin value",
}

func checkSame(t *testing.T, want map[string]*tensor.Tensor, f *File) {
	t.Helper()
	if len(f.Tensors) != len(want) {
		t.Errorf("%d tensors, want %d", len(f.Tensors), len(want))
	}
	for name, w := range want {
		g := f.Tensors[name]
		if g == nil {
			t.Errorf("tensor %q missing", name)
			continue
		}
		if g.DType != w.DType || !slices.Equal(g.Shape, w.Shape) || !bytes.Equal(g.Data, w.Data) {
			t.Errorf("tensor %q: got %s %v (%d bytes), want %s %v (%d bytes), data equal: %v",
				name, g.DType, g.Shape, len(g.Data), w.DType, w.Shape, len(w.Data), bytes.Equal(g.Data, w.Data))
		}
	}
}

// TestRoundTripEveryDType: Encode then Parse gives back every tensor of every
// dtype bit for bit, and the metadata.
func TestRoundTripEveryDType(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	ts := sampleTensors(r)
	var buf bytes.Buffer
	if err := Encode(&buf, sampleMeta, ts); err != nil {
		t.Fatal(err)
	}
	f, err := Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	checkSame(t, ts, f)
	if diff := cmp.Diff(sampleMeta, f.Metadata); diff != "" {
		t.Errorf("Metadata (-want +got):\n%s", diff)
	}
	seen := map[tensor.DType]bool{}
	for _, tn := range f.Tensors {
		seen[tn.DType] = true
	}
	for _, d := range allDTypes {
		if !seen[tensor.DType(d.name)] {
			t.Errorf("dtype %s did not round-trip", d.name)
		}
		if got := tensor.DType(d.name).Size(); got != d.size {
			t.Errorf("%s element size %d, want %d", d.name, got, d.size)
		}
	}
}

// TestEncodeLayout checks the exact bytes of a small file: names sorted,
// offsets contiguous, header padded with spaces to 8-byte alignment.
func TestEncodeLayout(t *testing.T) {
	ts := map[string]*tensor.Tensor{
		"b": {DType: tensor.U8, Shape: []int{3}, Data: []byte{1, 2, 3}},
		"a": {DType: tensor.F32, Shape: []int{}, Data: []byte{0, 0, 0x80, 0x3F}},
	}
	var buf bytes.Buffer
	if err := Encode(&buf, map[string]string{"k": "v"}, ts); err != nil {
		t.Fatal(err)
	}
	header := `{"__metadata__":{"k":"v"},` +
		`"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]},` +
		`"b":{"dtype":"U8","shape":[3],"data_offsets":[4,7]}}`
	// 26 + 52 + 52 = 130 characters; 8+130 = 138, padded to 144: 6 spaces.
	want := append([]byte{136, 0, 0, 0, 0, 0, 0, 0}, header+"      "...)
	want = append(want, 0, 0, 0x80, 0x3F, 1, 2, 3)
	if !bytes.Equal(buf.Bytes(), want) {
		t.Errorf("Encode wrote\n%q\nwant\n%q", buf.Bytes(), want)
	}
	// Deterministic: map iteration order does not leak into the file.
	for i := 0; i < 20; i++ {
		var again bytes.Buffer
		if err := Encode(&again, map[string]string{"k": "v"}, ts); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again.Bytes(), want) {
			t.Fatal("Encode is not deterministic")
		}
	}
	// No metadata: no __metadata__ entry.
	buf.Reset()
	if err := Encode(&buf, nil, map[string]*tensor.Tensor{}); err != nil {
		t.Fatal(err)
	}
	if want := append([]byte{8, 0, 0, 0, 0, 0, 0, 0}, "{}      "...); !bytes.Equal(buf.Bytes(), want) {
		t.Errorf("empty file: %q, want %q", buf.Bytes(), want)
	}
}

func TestEncodeBad(t *testing.T) {
	tests := []struct {
		name    string
		meta    map[string]string
		tensors map[string]*tensor.Tensor
		want    []string
	}{
		{"short data", nil, map[string]*tensor.Tensor{"x": {DType: tensor.F32, Shape: []int{2}, Data: make([]byte, 7)}}, []string{`tensor "x"`, "needs 8 bytes, has 7"}},
		{"unknown dtype", nil, map[string]*tensor.Tensor{"x": {DType: "F4", Shape: []int{2}, Data: make([]byte, 1)}}, []string{`tensor "x"`, `unknown dtype "F4"`}},
		{"negative dim", nil, map[string]*tensor.Tensor{"x": {DType: tensor.U8, Shape: []int{-1}}}, []string{`tensor "x"`, "negative"}},
		{"nil tensor", nil, map[string]*tensor.Tensor{"x": nil}, []string{`tensor "x" is nil`}},
		{"reserved name", nil, map[string]*tensor.Tensor{"__metadata__": tensor.New(tensor.U8, 1)}, []string{"reserved"}},
		{"bad UTF-8 name", nil, map[string]*tensor.Tensor{"\xff": tensor.New(tensor.U8, 1)}, []string{"UTF-8"}},
		{"bad UTF-8 metadata", map[string]string{"k": "\xfe"}, nil, []string{`__metadata__["k"]`, "UTF-8"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			err := Encode(&buf, tt.meta, tt.tensors)
			if err == nil {
				t.Fatal("Encode succeeded, want an error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if buf.Len() != 0 {
				t.Errorf("Encode wrote %d bytes before failing", buf.Len())
			}
		})
	}
}

// TestWriteOpen: Write then Open (memory-mapped) gives back every tensor, the
// tensors are views into the mapping, and Write leaves no temporary file.
func TestWriteOpen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cap.safetensors")
	ts := sampleTensors(rand.New(rand.NewPCG(3, 4)))
	if err := Write(path, sampleMeta, ts, WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Path != path {
		t.Errorf("Path = %q", f.Path)
	}
	checkSame(t, ts, f)
	if diff := cmp.Diff(sampleMeta, f.Metadata); diff != "" {
		t.Errorf("Metadata (-want +got):\n%s", diff)
	}
	if f.mapping == nil {
		t.Fatal("Open did not memory-map the file")
	}
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(f.mapping)))
	hi := lo + uintptr(len(f.mapping))
	for name, tn := range f.Tensors {
		if len(tn.Data) == 0 {
			continue
		}
		p := uintptr(unsafe.Pointer(&tn.Data[0]))
		if p < lo || p+uintptr(len(tn.Data)) > hi {
			t.Errorf("tensor %q is not a view into the mapping (zero-copy)", name)
		}
	}
	// Names in file order = sorted names, since Encode sorts.
	for i := 1; i < len(f.Names); i++ {
		if f.Names[i-1] >= f.Names[i] {
			t.Errorf("Names not in order: %q before %q", f.Names[i-1], f.Names[i])
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries after Write, want 1 (temporary file left?)", len(entries))
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, want 0644", st.Mode().Perm())
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	for name, tn := range f.Tensors {
		if tn.Data != nil {
			t.Errorf("tensor %q still points into the released mapping", name)
		}
	}
	if err := f.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestWriteRefusesOverwrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x.safetensors")
	one := map[string]*tensor.Tensor{"a": {DType: tensor.U8, Shape: []int{1}, Data: []byte{1}}}
	two := map[string]*tensor.Tensor{"a": {DType: tensor.U8, Shape: []int{1}, Data: []byte{2}}}
	if err := Write(path, nil, one, WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	old, err := Open(path) // held open (mapped) while the file is replaced
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	err = Write(path, nil, two, WriteOptions{})
	if err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("Write over an existing file: err = %v, want a refusal", err)
	}
	if err := Write(path, nil, two, WriteOptions{Force: true}); err != nil {
		t.Fatalf("Write with Force: %v", err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got := f.Tensors["a"].Data[0]; got != 2 {
		t.Errorf("after Force the file holds %d, want 2", got)
	}
	if got := old.Tensors["a"].Data[0]; got != 1 {
		t.Errorf("the mapping of the replaced file reads %d, want the old 1", got)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want 1", len(entries))
	}
	// A failed encode leaves neither the target nor a temporary file.
	bad := filepath.Join(dir, "bad.safetensors")
	if err := Write(bad, nil, map[string]*tensor.Tensor{"x": {DType: tensor.F32, Shape: []int{1}}}, WriteOptions{}); err == nil {
		t.Fatal("Write of an inconsistent tensor succeeded")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("failed Write left %d entries", len(entries))
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.safetensors")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.safetensors")
	if err := os.WriteFile(bad, build(`{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, zeros(4)), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		want []string
	}{
		{empty, []string{empty, "too short"}}, // cannot be mapped: read instead
		{bad, []string{bad, `tensor "w"`, "run past the end"}},
		{filepath.Join(dir, "missing.safetensors"), []string{"missing.safetensors", "no such file"}},
		{dir, []string{"directory"}},
	} {
		_, err := Open(c.path)
		if err == nil {
			t.Errorf("Open(%s) succeeded", c.path)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("Open(%s): error %q does not contain %q", c.path, err, w)
			}
		}
	}
}

// TestByteSize checks the overflow guard by hand-computed products.
func TestByteSize(t *testing.T) {
	tests := []struct {
		shape []int
		size  int
		want  uint64
		ok    bool
	}{
		{nil, 4, 4, true},
		{[]int{2, 3}, 4, 24, true},
		{[]int{0, 5}, 8, 0, true},
		{[]int{1 << 30, 1 << 30}, 4, 1 << 62, true},
		{[]int{1 << 31, 1 << 31}, 2, 0, false}, // 2^63 does not fit in int64
		{[]int{1 << 32, 1 << 32}, 1, 0, false}, // 2^64 wraps to 0 if unchecked
		{[]int{0, 1 << 32, 1 << 32}, 1, 0, false},
	}
	for _, tt := range tests {
		got, ok := tensor.ByteSize(tt.shape, tt.size)
		if got != tt.want || ok != tt.ok {
			t.Errorf("ByteSize(%v, %d) = %d, %v; want %d, %v", tt.shape, tt.size, got, ok, tt.want, tt.ok)
		}
	}
}

// TestEncodeMatchesReferenceWriter: for one tensor (where the Rust writer's
// dtype-then-name order and ours coincide) Encode writes the same bytes as
// the Hugging Face writer: compact JSON, __metadata__ first, space padding.
func TestEncodeMatchesReferenceWriter(t *testing.T) {
	f32s := func(vals ...float32) []byte {
		var b []byte
		for _, v := range vals {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
		}
		return b
	}
	data := f32s(0, 1, 2, 3, 4, 5)
	tests := []struct {
		name    string
		meta    map[string]string
		tensors map[string]*tensor.Tensor
		header  string // unpadded
		n       int    // header length with padding
	}{
		// 10 + 15 + 16 + 21 + 2 = 64: already a multiple of 8, no padding.
		{"no padding", nil, map[string]*tensor.Tensor{"attn.0": {DType: tensor.F32, Shape: []int{1, 2, 3}, Data: data}},
			`{"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}}`, 64},
		// 9 + 15 + 18 + 21 + 2 = 65, padded with 7 spaces to 72.
		{"padding", nil, map[string]*tensor.Tensor{"attn0": {DType: tensor.F32, Shape: []int{1, 1, 2, 3}, Data: data}},
			`{"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}}`, 72},
		// 1 + 14 + 1 + 18 + 1 = 35, padded with 5 spaces to 40.
		{"metadata only", map[string]string{"framework": "pt"}, nil,
			`{"__metadata__":{"framework":"pt"}}`, 40},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := Encode(&buf, tt.meta, tt.tensors); err != nil {
				t.Fatal(err)
			}
			want := binary.LittleEndian.AppendUint64(nil, uint64(tt.n))
			want = append(want, tt.header...)
			for len(want) < 8+tt.n {
				want = append(want, ' ')
			}
			if len(tt.tensors) > 0 {
				want = append(want, data...)
			}
			if !bytes.Equal(buf.Bytes(), want) {
				t.Errorf("Encode wrote\n%q\nwant\n%q", buf.Bytes(), want)
			}
		})
	}
}
