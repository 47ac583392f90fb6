package safetensors

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// FuzzParse feeds Parse arbitrary bytes. It must never panic, and whatever it
// accepts must be consistent: every tensor's bytes match its dtype and shape,
// the tensors and header tile the input exactly, and writing the file back
// out and parsing it again gives the same tensors and metadata. The seed
// corpus (testdata/fuzz/FuzzParse) holds one file per malformation in
// badCases plus valid files; CI runs it for a short fixed time:
//
//	go test -run='^$' -fuzz=FuzzParse -fuzztime=20s -fuzzminimizetime=2s ./internal/safetensors
//
// (-fuzzminimizetime keeps the fuzzer from spending the whole budget
// minimizing each new interesting input, which it otherwise does for up to a
// minute on the kilobyte-sized seeds).
func FuzzParse(f *testing.F) {
	var buf bytes.Buffer
	if err := Encode(&buf, sampleMeta, sampleTensors(rand.New(rand.NewPCG(5, 6)))); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		file, err := Parse(b)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		if len(file.Names) != len(file.Tensors) {
			t.Fatalf("%d names for %d tensors", len(file.Names), len(file.Tensors))
		}
		total := 0
		for _, name := range file.Names {
			tn := file.Tensors[name]
			if tn == nil {
				t.Fatalf("name %q has no tensor", name)
			}
			if err := tn.Check(); err != nil {
				t.Fatalf("accepted tensor %q is inconsistent: %v", name, err)
			}
			total += len(tn.Data)
		}
		n := int(b[0]) | int(b[1])<<8 | int(b[2])<<16 | int(b[3])<<24 // < 100 MB: the high bytes are 0
		if 8+n+total != len(b) {
			t.Fatalf("8 + header %d + tensors %d != file %d bytes", n, total, len(b))
		}
		var out bytes.Buffer
		if err := Encode(&out, file.Metadata, file.Tensors); err != nil {
			t.Fatalf("re-encoding an accepted file: %v", err)
		}
		again, err := Parse(out.Bytes())
		if err != nil {
			t.Fatalf("re-parsing a re-encoded file: %v", err)
		}
		if len(again.Metadata) != len(file.Metadata) {
			t.Fatalf("metadata changed in a round trip: %v vs %v", again.Metadata, file.Metadata)
		}
		for k, v := range file.Metadata {
			if again.Metadata[k] != v {
				t.Fatalf("metadata[%q] changed in a round trip", k)
			}
		}
		for name, tn := range file.Tensors {
			g := again.Tensors[name]
			if g == nil || g.DType != tn.DType || !slices.Equal(g.Shape, tn.Shape) || !bytes.Equal(g.Data, tn.Data) {
				t.Fatalf("tensor %q changed in a round trip", name)
			}
		}
	})
}

// TestWriteFuzzCorpus regenerates testdata/fuzz/FuzzParse from badCases and
// a few valid files. It runs only when asked:
//
//	KCHECK_WRITE_FUZZ_CORPUS=1 go test -run TestWriteFuzzCorpus ./internal/safetensors
func TestWriteFuzzCorpus(t *testing.T) {
	if os.Getenv("KCHECK_WRITE_FUZZ_CORPUS") == "" {
		t.Skip("set KCHECK_WRITE_FUZZ_CORPUS=1 to regenerate the seed corpus")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzParse")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name string, b []byte) {
		name = strings.Map(func(r rune) rune {
			if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
				return r
			}
			return '_'
		}, strings.ToLower(name))
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", b)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range badCases() {
		write("bad_"+c.name, c.in)
	}
	var buf bytes.Buffer
	if err := Encode(&buf, map[string]string{"kcheck.format": "1", "kcheck.kernel": "nvfp4_dequantize"}, sampleTensors(rand.New(rand.NewPCG(7, 8)))); err != nil {
		t.Fatal(err)
	}
	write("good_every_dtype", buf.Bytes())
	write("good_empty", build(`{}      `, nil))
	write("good_offset_order", build(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[2,3]},"b":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}`, zeros(3)))
	write("good_empty_tensors", build(`{"b":{"dtype":"F32","shape":[0,4],"data_offsets":[4,4]},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}`, zeros(4)))
}
