package cli

import (
	"archive/zip"
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/safetensors"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// The bad inputs of issues 2 and 7, each given to kcheck as a user would,
// with what kcheck must do: the exit status and words of its message.
// TestBadInputs runs them in-process; with KCHECK_WRITE_BAD_INPUTS=1 it
// also builds cmd/kcheck and regenerates internal/check/BAD_INPUTS.md from
// real runs of the binary:
//
//	KCHECK_WRITE_BAD_INPUTS=1 go test -run TestBadInputs ./internal/cli

type badInput struct {
	name  string
	setup func(t *testing.T, dir string) []string // writes the files, returns the arguments
	code  ExitCode
	want  []string // in stdout or stderr
	// interrupt: SIGINT once the first result line is out (subprocess only)
	interrupt bool
}

// namedCases is a case file listing n valid cases, c0 to c(n-1): too many
// is then the only thing wrong with it.
func namedCases(n int) string {
	var b strings.Builder
	b.WriteString(`{"cases":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"name":"c%d","kernel":"nvfp4_quantize","m":2,"k":32}`, i)
	}
	b.WriteString(`]}`)
	return b.String()
}

// rawSafetensors is an 8-byte header length, the header, then data.
func rawSafetensors(header string, data []byte) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	return append(append(b, header...), data...)
}

func writeFile(t *testing.T, path string, b []byte) string {
	t.Helper()
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// goldenCapture reads a golden fixture into memory.
func goldenCapture(t *testing.T, name string) (map[string]string, map[string]*tensor.Tensor) {
	t.Helper()
	f, err := safetensors.Open(fx + "golden/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	meta, ts := map[string]string{}, map[string]*tensor.Tensor{}
	for k, v := range f.Metadata {
		meta[k] = v
	}
	for k, v := range f.Tensors {
		ts[k] = v.Clone()
	}
	return meta, ts
}

// mutated writes a golden capture changed by edit to dir/name.
func mutated(t *testing.T, dir, golden, name string, edit func(meta map[string]string, ts map[string]*tensor.Tensor)) string {
	t.Helper()
	meta, ts := goldenCapture(t, golden)
	edit(meta, ts)
	path := filepath.Join(dir, name)
	if err := safetensors.Write(path, meta, ts, safetensors.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	return path
}

// examplePipeline writes examples/pipeline_ok.safetensors with its metadata
// changed by edit to dir and returns the path.
func examplePipeline(t *testing.T, dir string, edit func(meta map[string]string)) string {
	t.Helper()
	f, err := safetensors.Open(fx + "examples/pipeline_ok.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	meta := map[string]string{}
	for k, v := range f.Metadata {
		meta[k] = v
	}
	edit(meta)
	path := filepath.Join(dir, "pipeline.safetensors")
	if err := safetensors.Write(path, meta, f.Tensors, safetensors.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	return path
}

// reproduce replaces a capture's outputs by the reference's on its inputs:
// what a correct kernel writes.
func reproduce(meta map[string]string, ts map[string]*tensor.Tensor) {
	k, err := kernel.Lookup(meta["kcheck.kernel"])
	if err != nil {
		panic(err)
	}
	p := kernel.Params{}
	for key, v := range meta {
		p[key] = v
	}
	outs, err := kernel.Produce(context.Background(), k, kernel.Inputs{Tensors: ts, Params: p}, kernel.DefaultPrecision(), nil)
	if err != nil {
		panic(err)
	}
	for n, o := range outs {
		ts[n] = o
	}
}

// samePagesFile is a kv_cache_gather or mla_decode capture whose block
// table [b, blocks] points every request at block 0, seq tokens each, pages
// of 16. A small one holds the reference's output; a big one a placeholder.
func samePagesFile(t *testing.T, path, kname string, b, seq, heads int) string {
	t.Helper()
	const page, d = 16, 576
	blocks := (seq + page - 1) / page
	cache := tensor.New(tensor.BF16, 1, page, d)
	for i := 0; i < cache.Len(); i++ {
		cache.SetFloat64(i, float64(i%17)/16-0.5)
	}
	lens := make([]int64, b)
	for i := range lens {
		lens[i] = int64(seq)
	}
	ts := map[string]*tensor.Tensor{
		"block_table": tensor.FromInt64s(tensor.I32, []int{b, blocks}, make([]int64, b*blocks)),
		"seq_lens":    tensor.FromInt64s(tensor.I32, []int{b}, lens),
	}
	meta := map[string]string{"kcheck.format": "1", "kcheck.kernel": kname, "page_size": "16", "kv_cache_dtype": "bf16"}
	out := "gathered"
	if kname == "kv_cache_gather" {
		ts["cache"] = cache
	} else {
		out = "out"
		ts["kv_cache"] = cache
		q := tensor.New(tensor.BF16, b, 1, heads, d)
		for i := 0; i < q.Len(); i++ {
			q.SetFloat64(i, float64(i%13)/12-0.5)
		}
		ts["q"] = q
		meta["softmax_scale"] = "0.0625"
	}
	if b*seq <= 4096 { // small: the reference's own output, so the check passes
		k, err := kernel.Lookup(kname)
		if err != nil {
			t.Fatal(err)
		}
		p := kernel.Params{}
		for k, v := range meta {
			p[k] = v
		}
		outs, err := kernel.Produce(context.Background(), k, kernel.Inputs{Tensors: ts, Params: p}, kernel.DefaultPrecision(), nil)
		if err != nil {
			t.Fatal(err)
		}
		ts[out] = outs[out]
	} else { // a placeholder: the check stops before comparing it
		ts[out] = tensor.New(tensor.BF16, 1, d)
	}
	if err := safetensors.Write(path, meta, ts, safetensors.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	return path
}

// platformBadInputs are rows that need what only some systems have (named
// pipes, /proc): build-tagged files add them.
var platformBadInputs []func() []badInput

// npzOf writes a golden capture's tensors as a .npz archive the way numpy
// saves them, bf16 and fp8 as ml_dtypes does ('<V2', '<V1': raw records;
// internal/npy/testdata/ml_dtypes holds files ml_dtypes wrote), or, with
// asUint, as their bits viewed as uint16 and uint8. It returns the
// --set arguments that carry the capture's metadata.
func npzOf(t *testing.T, path, golden string, asUint bool) []string {
	t.Helper()
	meta, ts := goldenCapture(t, golden)
	descr := map[tensor.DType]string{tensor.F32: "<f4", tensor.F64: "<f8", tensor.I32: "<i4", tensor.I64: "<i8", tensor.U8: "|u1",
		tensor.BF16: "<V2", tensor.F8E4M3: "<V1"}
	if asUint {
		descr[tensor.BF16], descr[tensor.F8E4M3] = "<u2", "|u1"
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	zw := zip.NewWriter(f)
	for name, x := range ts {
		d, ok := descr[x.DType]
		if !ok {
			t.Fatalf("no numpy dtype for %s", x.DType)
		}
		dims := make([]string, len(x.Shape))
		for i, v := range x.Shape {
			dims[i] = fmt.Sprint(v)
		}
		shape := "(" + strings.Join(dims, ", ") + ")"
		if len(dims) == 1 {
			shape = "(" + dims[0] + ",)"
		}
		h := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': %s, }", d, shape)
		h += strings.Repeat(" ", (64-(10+len(h)+1)%64)%64) + "\n"
		w, err := zw.Create(name + ".npy")
		if err != nil {
			t.Fatal(err)
		}
		w.Write(append([]byte("\x93NUMPY\x01\x00"), byte(len(h)), byte(len(h)>>8)))
		w.Write([]byte(h))
		w.Write(x.Data)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	var set []string
	for _, k := range slices.Sorted(maps.Keys(meta)) { // the same command every time
		v := meta[k]
		set = append(set, "--set", k+"="+v)
	}
	return set
}

// flashMLANames gives a capture FlashMLA's tensor names
// (flash_mla_with_kvcache's k_cache, cache_seqlens, softmax_lse:
// internal/engines).
func flashMLANames(_ map[string]string, ts map[string]*tensor.Tensor) {
	for from, to := range map[string]string{"kv_cache": "k_cache", "seq_lens": "cache_seqlens", "lse": "softmax_lse"} {
		ts[to] = ts[from]
		delete(ts, from)
	}
}

func badInputs() []badInput {
	rows := commonBadInputs()
	for _, more := range platformBadInputs {
		rows = append(rows, more()...)
	}
	return rows
}

func commonBadInputs() []badInput {
	w := func(dtype, shape, offs string) string {
		return `{"w":{"dtype":"` + dtype + `","shape":` + shape + `,"data_offsets":` + offs + `}}`
	}
	raw := func(name string, b []byte) func(t *testing.T, dir string) []string {
		return func(t *testing.T, dir string) []string {
			return []string{"check", "--json", writeFile(t, filepath.Join(dir, name), b)}
		}
	}
	mut := func(golden string, edit func(meta map[string]string, ts map[string]*tensor.Tensor), extra ...string) func(t *testing.T, dir string) []string {
		return func(t *testing.T, dir string) []string {
			return append(append([]string{"check", "--json"}, extra...), mutated(t, dir, golden, "capture.safetensors", edit))
		}
	}
	caseFile := func(js string, extra ...string) func(t *testing.T, dir string) []string {
		return func(t *testing.T, dir string) []string {
			return append([]string{"run", "--json", "--cases", writeFile(t, filepath.Join(dir, "cases.json"), []byte(js))}, extra...)
		}
	}
	return []badInput{
		// The file format (issue 2 item 7).
		{name: "empty file", setup: raw("empty.safetensors", nil), code: ExitUsage, want: []string{"too short"}},
		{name: "truncated file (a valid capture cut in half)", setup: func(t *testing.T, dir string) []string {
			b, err := os.ReadFile(fx + "golden/nvfp4_gemm.safetensors")
			if err != nil {
				t.Fatal(err)
			}
			return []string{"check", "--json", writeFile(t, filepath.Join(dir, "cut.safetensors"), b[:len(b)/2])}
		}, code: ExitUsage, want: []string{"error"}},
		{name: "header length past the end of the file", setup: raw("hlen.safetensors", append(binary.LittleEndian.AppendUint64(nil, 100), "{}"...)), code: ExitUsage, want: []string{"past the end"}},
		{name: "header that is not JSON", setup: raw("json.safetensors", rawSafetensors("not json at all", nil)), code: ExitUsage, want: []string{"not JSON"}},
		{name: "unknown dtype", setup: raw("dtype.safetensors", rawSafetensors(w("F8_E4M3FNUZ", "[1]", "[0,1]"), []byte{0})), code: ExitUsage, want: []string{"F8_E4M3FNUZ"}},
		{name: "overlapping data offsets", setup: raw("overlap.safetensors", rawSafetensors(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}`, make([]byte, 6))), code: ExitUsage, want: []string{"overlap"}},
		{name: "data offsets past the end of the file", setup: raw("offs.safetensors", rawSafetensors(w("F32", "[4]", "[0,16]"), make([]byte, 8))), code: ExitUsage, want: []string{"w"}},
		{name: "shape whose byte size does not match its offsets", setup: raw("size.safetensors", rawSafetensors(w("F32", "[3]", "[0,8]"), make([]byte, 8))), code: ExitUsage, want: []string{"needs 12"}},
		{name: "header claiming a trillion elements (10^6 x 10^6 F32)", setup: raw("trillion.safetensors", rawSafetensors(w("F32", "[1000000,1000000]", "[0,4]"), make([]byte, 4))), code: ExitUsage, want: []string{"4000000000000"}},
		{name: "header claiming 2^64 bytes", setup: raw("huge.safetensors", rawSafetensors(w("F64", "[4294967296,4294967296]", "[0,8]"), make([]byte, 8))), code: ExitUsage, want: []string{"too large"}},
		{name: "a key twice inside __metadata__ (a decoder keeps the last)", setup: raw("dupmeta.safetensors", rawSafetensors(`{"__metadata__":{"kcheck.format":"1","kcheck.kernel":"nvfp4_gemm","kcheck.kernel":"splitk_combine"}}`, nil)),
			code: ExitUsage, want: []string{`__metadata__ names \"kcheck.kernel\" twice`}}, // as --json escapes it
		{name: "a key twice inside a tensor entry", setup: raw("dupentry.safetensors", rawSafetensors(`{"w":{"dtype":"F32","shape":[2],"dtype":"BF16","data_offsets":[0,8]}}`, make([]byte, 8))),
			code: ExitUsage, want: []string{`tensor \"w\": header entry names \"dtype\" twice`}},
		{name: "a 2 MB header at --max-memory 16M (its parse could take 128 MiB)", setup: func(t *testing.T, dir string) []string {
			h := `{"__metadata__":{"kcheck.format":"1","kcheck.kernel":"nvfp4_dequantize","note":"` + strings.Repeat("x", 2<<20) + `"}}`
			return []string{"check", "--json", "--max-memory", "16M", writeFile(t, filepath.Join(dir, "header.safetensors"), rawSafetensors(h, nil))}
		}, code: ExitUsage, want: []string{"header could take 128.0 MiB to parse", "--max-memory"}},
		{name: ".npy file cut short", setup: func(t *testing.T, dir string) []string {
			h := "{'descr': '<f4', 'fortran_order': False, 'shape': (1000,), }"
			h += strings.Repeat(" ", (64-(10+len(h)+1)%64)%64) + "\n" // magic, version, length, header: a multiple of 64
			b := append([]byte("\x93NUMPY\x01\x00"), byte(len(h)), 0)
			b = append(append(b, h...), make([]byte, 40)...)
			return []string{"check", "--json", "--set", "kcheck.kernel=splitk_combine", writeFile(t, filepath.Join(dir, "partial_out.npy"), b)}
		}, code: ExitUsage, want: []string{"truncated"}},
		{name: ".npz whose member inflates to 64 MiB of zeros (a 64 KiB file), --max-memory 16M", setup: func(t *testing.T, dir string) []string {
			path := filepath.Join(dir, "bomb.npz")
			f, err := os.Create(path)
			if err != nil {
				t.Fatal(err)
			}
			zw := zip.NewWriter(f)
			w, err := zw.CreateHeader(&zip.FileHeader{Name: "partial_out.npy", Method: zip.Deflate})
			if err != nil {
				t.Fatal(err)
			}
			h := "{'descr': '<f4', 'fortran_order': False, 'shape': (16, 1024, 1024), }"
			h += strings.Repeat(" ", (64-(10+len(h)+1)%64)%64) + "\n"
			w.Write(append([]byte("\x93NUMPY\x01\x00"), byte(len(h)), 0))
			w.Write([]byte(h))
			w.Write(make([]byte, 64<<20))
			if err := zw.Close(); err != nil {
				t.Fatal(err)
			}
			f.Close()
			return []string{"check", "--json", "--max-memory", "16M", "--set", "kcheck.kernel=splitk_combine", path}
		}, code: ExitUsage, want: []string{"needs 67108864 bytes", "--max-memory"}},
		// A new user's capture (issue 11 item 15).
		{name: "a FlashMLA capture checked without --from", setup: mut("mla_decode.safetensors", flashMLANames), code: ExitUsage,
			want: []string{"tensor kv_cache is missing", "tensor names cache_seqlens, k_cache, softmax_lse are what flashmla, sglang and vllm call them: try --from flashmla (or sglang, vllm)"}},
		{name: "the same capture with --from flashmla", setup: mut("mla_decode.safetensors", flashMLANames, "--from", "flashmla"), code: ExitPass, want: []string{`"verdict":"pass"`}},
		{name: "a mistyped kernel name", setup: mut("nvfp4_dequantize.safetensors", func(m map[string]string, _ map[string]*tensor.Tensor) { m["kcheck.kernel"] = "nvfp4_dequantise" }),
			code: ExitUsage, want: []string{`unknown kernel \"nvfp4_dequantise\"; did you mean \"nvfp4_dequantize\"?`}},
		{name: "a mistyped case name", setup: func(t *testing.T, dir string) []string {
			return []string{"run", "--case", "kv_cache_gather/bf16/p16/ctx-3p"}
		}, code: ExitUsage, want: []string{`no case named "kv_cache_gather/bf16/p16/ctx-3p"; did you mean "kv_cache_gather/bf16/p16/ctx-3P"?`}},
		{name: "a case name near no catalog name, in a family of few cases", setup: func(t *testing.T, dir string) []string {
			return []string{"run", "--case", "splitk_combine/s2x"}
		}, code: ExitUsage, want: []string{`no case named "splitk_combine/s2x"; the 10 splitk_combine cases are splitk_combine/deepseek-v3/tp8/s1, `}},
		{name: "a case name near no catalog name, in a family of many cases", setup: func(t *testing.T, dir string) []string {
			return []string{"run", "--case", "mla_decode/nope"}
		}, code: ExitUsage, want: []string{`no case named "mla_decode/nope"; there are `, ` mla_decode cases: kcheck cases --long --match 'mla_decode/*' lists them`}},
		{name: "a fault name with a word left out", setup: func(t *testing.T, dir string) []string {
			return []string{"run", "--case", "kv_cache_gather/bf16/p16/ctx-3P", "--backend", "faulty:page_of_by_one"}
		}, code: ExitUsage, want: []string{`unknown fault "page_of_by_one"; did you mean "page_boundary_off_by_one"?`}},
		{name: "a mistyped fault name", setup: func(t *testing.T, dir string) []string {
			return []string{"run", "--case", "kv_cache_gather/bf16/p16/ctx-3P", "--backend", "faulty:stale_page"}
		}, code: ExitUsage, want: []string{`unknown fault "stale_page"; did you mean "stale_pages"?`}},
		{name: "a mistyped backend name", setup: func(t *testing.T, dir string) []string {
			return []string{"run", "--case", "kv_cache_gather/bf16/p16/ctx-3P", "--backend", "refernce"}
		}, code: ExitUsage, want: []string{`unknown backend "refernce"; did you mean "reference"?`}},

		// numpy arrays of bf16 and fp8 (issue 11 item 15).
		{name: ".npz of ml_dtypes bfloat16 arrays ('<V2'): read as the contract's BF16", setup: func(t *testing.T, dir string) []string {
			path := filepath.Join(dir, "mla.npz")
			return append(append([]string{"check", "--json"}, npzOf(t, path, "mla_decode.safetensors", false)...), path)
		}, code: ExitPass, want: []string{`"verdict":"pass"`, "numpy array q holds 2-byte bits", "read as BF16"}},
		{name: ".npz of bf16 and fp8 saved as uint16 and uint8 bits", setup: func(t *testing.T, dir string) []string {
			path := filepath.Join(dir, "quant.npz")
			return append(append([]string{"check", "--json"}, npzOf(t, path, "nvfp4_quantize.safetensors", true)...), path)
		}, code: ExitPass, want: []string{`"verdict":"pass"`, "numpy array x holds 2-byte bits"}},
		{name: ".npz of bf16 bits with a declared dtype of the wrong width", setup: func(t *testing.T, dir string) []string {
			path := filepath.Join(dir, "gather.npz")
			return append(append([]string{"check", "--json", "--set", "kcheck.dtype.gathered=F8_E4M3"}, npzOf(t, path, "kv_cache_gather.safetensors", false)...), path)
		}, code: ExitUsage, want: []string{"metadata kcheck.dtype.gathered = F8_E4M3: array gathered holds 2-byte values, F8_E4M3 is 1 bytes"}},
		{name: ".npz with a dtype declared for an array of numbers, not bits", setup: func(t *testing.T, dir string) []string {
			path := filepath.Join(dir, "mla.npz")
			return append(append([]string{"check", "--json", "--set", "kcheck.dtype.lse=BF16"}, npzOf(t, path, "mla_decode.safetensors", false)...), path)
		}, code: ExitUsage, want: []string{"metadata kcheck.dtype.lse = BF16: array lse holds F32 numbers, not bits"}},
		{name: ".npz with a dtype declared for an array it does not hold", setup: func(t *testing.T, dir string) []string {
			path := filepath.Join(dir, "gather.npz")
			return append(append([]string{"check", "--json", "--set", "kcheck.dtype.gatherd=BF16"}, npzOf(t, path, "kv_cache_gather.safetensors", false)...), path)
		}, code: ExitUsage, want: []string{"metadata kcheck.dtype.gatherd = BF16: the file holds no array gatherd"}},
		{name: "an endless stream (/dev/zero) given as a capture, --max-memory 16M", setup: func(t *testing.T, dir string) []string {
			return []string{"check", "--json", "--max-memory", "16M", "/dev/zero"}
		}, code: ExitUsage, want: []string{"a stream of more than 16.0 MiB"}},
		{name: "a path that does not exist", setup: func(t *testing.T, dir string) []string {
			return []string{"check", filepath.Join(dir, "nowhere.safetensors")}
		}, code: ExitUsage, want: []string{"no such file"}},

		// The contract (issue 2 item 7).
		{name: "no kcheck.kernel in the metadata", setup: mut("nvfp4_dequantize.safetensors", func(m map[string]string, _ map[string]*tensor.Tensor) { delete(m, "kcheck.kernel") }), code: ExitUsage, want: []string{"kcheck.kernel is missing"}},
		{name: "a tensor the contract needs is missing", setup: mut("nvfp4_dequantize.safetensors", func(_ map[string]string, ts map[string]*tensor.Tensor) { delete(ts, "block_scale") }), code: ExitUsage, want: []string{"block_scale is missing"}},
		{name: "wrong dtype for the contract", setup: mut("nvfp4_dequantize.safetensors", func(_ map[string]string, ts map[string]*tensor.Tensor) {
			p := ts["packed"]
			ts["packed"] = &tensor.Tensor{DType: tensor.I8, Shape: p.Shape, Data: p.Data}
		}), code: ExitUsage, want: []string{"packed", "I8"}},
		{name: "K not a multiple of 16", setup: mut("nvfp4_quantize.safetensors", func(_ map[string]string, ts map[string]*tensor.Tensor) {
			ts["x"] = tensor.New(tensor.BF16, 8, 56)
		}), code: ExitUsage, want: []string{"K = 56", "16"}},
		{name: "NaN in an input (the outputs a correct kernel makes of it)", setup: mut("splitk_combine.safetensors", func(m map[string]string, ts map[string]*tensor.Tensor) {
			ts["partial_out"].SetFloat64(5, nanValue())
			reproduce(m, ts)
		}), code: ExitPass, want: []string{"input anomaly: tensor partial_out holds 1 NaN and 0 Inf (first at [0 0 5])"}},
		{name: "NaN in an input, outputs captured without it", setup: mut("splitk_combine.safetensors", func(_ map[string]string, ts map[string]*tensor.Tensor) {
			ts["partial_out"].SetFloat64(5, nanValue())
		}), code: ExitFail, want: []string{"input anomaly: tensor partial_out holds 1 NaN", `"nan_mismatch":1`}},
		{name: "block_table entry outside the cache", setup: mut("kv_cache_gather.safetensors", func(_ map[string]string, ts map[string]*tensor.Tensor) {
			ts["block_table"].SetInt64(3, 9412)
		}), code: ExitUsage, want: []string{"block_table[1,1] = 9412 is outside the cache"}},
		{name: "kv_cache_transfer: a prefill block_table entry outside the prefill cache", setup: mut("kv_cache_transfer.safetensors", func(_ map[string]string, ts map[string]*tensor.Tensor) {
			ts["src_block_table"].SetInt64(1, 9412)
		}), code: ExitUsage, want: []string{"src_block_table[0,1] = 9412 is outside the cache"}},
		{name: "kv_cache_transfer: a seq_len longer than the decode block table holds", setup: mut("kv_cache_transfer.safetensors", func(_ map[string]string, ts map[string]*tensor.Tensor) {
			ts["seq_lens"].SetInt64(0, 13)
		}), code: ExitUsage, want: []string{"seq_lens[0] = 13 exceeds the dst_block_table's capacity 3*4 = 12"}},
		{name: "kv_cache_transfer: two requests' tokens in one decode entry", setup: mut("kv_cache_transfer.safetensors", func(_ map[string]string, ts map[string]*tensor.Tensor) {
			bt := ts["dst_block_table"]
			bt.SetInt64(bt.Shape[1], bt.Int64At(0))
		}), code: ExitUsage, want: []string{"two tokens would land in one decode-side entry"}},
		{name: "kv_cache_transfer: whole_pages between page sizes that differ", setup: mut("kv_cache_transfer.safetensors", func(m map[string]string, _ map[string]*tensor.Tensor) {
			m["whole_pages"] = "true"
		}), code: ExitUsage, want: []string{"parameter whole_pages = true needs equal page sizes on both sides: src_page_size = 8, page_size = 4"}},
		{name: "kv_cache_transfer: a decode cache of another entry width", setup: mut("kv_cache_transfer.safetensors", func(_ map[string]string, ts map[string]*tensor.Tensor) {
			ts["dst_cache_before"] = tensor.New(tensor.U8, 6, 4, 600)
		}), code: ExitUsage, want: []string{"tensor dst_cache_before has shape [6 4 600]; kv_cache_dtype fp8_ds_mla with page_size 4 wants [NB, 4, 656]"}},
		{name: "kv_cache_transfer: a prefill block table of rank 1", setup: mut("kv_cache_transfer.safetensors", func(_ map[string]string, ts map[string]*tensor.Tensor) {
			ts["src_block_table"] = tensor.New(tensor.I32, 4)
		}), code: ExitUsage, want: []string{"tensor src_block_table has shape [4]; want [B, max_blocks]"}},
		{name: "two tokens written to one cache slot", setup: mut("kv_cache_write.safetensors", func(_ map[string]string, ts map[string]*tensor.Tensor) {
			ts["slot_mapping"].SetInt64(1, ts["slot_mapping"].Int64At(0))
		}), code: ExitUsage, want: []string{"slot_mapping[1]", "repeats"}},
		{name: "pipeline link to a later stage", setup: func(t *testing.T, dir string) []string {
			f, err := safetensors.Open(fx + "examples/pipeline_ok.safetensors")
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			meta := map[string]string{}
			for k, v := range f.Metadata {
				meta[k] = v
			}
			meta["kcheck.cache.from.kv_c"] = "combine.out"
			path := filepath.Join(dir, "pipeline.safetensors")
			if err := safetensors.Write(path, meta, f.Tensors, safetensors.WriteOptions{}); err != nil {
				t.Fatal(err)
			}
			return []string{"check", "--json", path}
		}, code: ExitUsage, want: []string{"not an earlier stage"}},

		// The split count S is the partials' split dimension (reference/CONTRACTS.md §3.6.1, issue 11 item 1).
		{name: "mla_decode partials with neither num_splits nor split_bounds (S from the shape)", setup: mut("mla_decode.safetensors", func(m map[string]string, _ map[string]*tensor.Tensor) {
			delete(m, "num_splits")
		}), code: ExitPass, want: []string{`"verdict":"pass"`, `"tensor":"partial_out"`, `"tensor":"partial_lse"`}},
		{name: "pipeline attn partials with no num_splits (S from the shape)", setup: func(t *testing.T, dir string) []string {
			return []string{"check", "--json", examplePipeline(t, dir, func(m map[string]string) { delete(m, "attn.num_splits") })}
		}, code: ExitPass, want: []string{`"verdict":"pass"`, `"tensor":"attn.partial_out"`}},
		{name: "num_splits disagrees with partial_out's split dimension", setup: mut("mla_decode.safetensors", func(m map[string]string, _ map[string]*tensor.Tensor) {
			m["num_splits"] = "2"
		}), code: ExitUsage, want: []string{"parameter num_splits = 2 but tensor partial_out has S = 3 splits (shape [2 1 2 3 512])"}},
		{name: "split_bounds disagree with partial_out's split dimension", setup: mut("mla_decode.safetensors", func(m map[string]string, ts map[string]*tensor.Tensor) {
			delete(m, "num_splits")
			ts["split_bounds"] = tensor.FromInt64s(tensor.I32, []int{2, 3}, []int64{0, 10, int64(ts["seq_lens"].Int64At(0)), 0, 10, int64(ts["seq_lens"].Int64At(1))})
		}), code: ExitUsage, want: []string{"tensor split_bounds has S+1 = 3 columns but tensor partial_out has S = 3 splits"}},
		{name: "partial_lse disagrees with partial_out on S", setup: mut("mla_decode.safetensors", func(m map[string]string, ts map[string]*tensor.Tensor) {
			delete(m, "num_splits")
			ts["partial_lse"] = tensor.New(tensor.F32, 2, 1, 2, 2)
		}), code: ExitUsage, want: []string{"tensor partial_lse has S = 2 splits (shape [2 1 2 2]) but tensor partial_out has S = 3 splits"}},
		{name: "splitk_combine num_splits disagrees with partial_out", setup: mut("splitk_combine.safetensors", func(m map[string]string, ts map[string]*tensor.Tensor) {
			m["num_splits"] = fmt.Sprint(ts["partial_out"].Shape[1] + 1)
		}), code: ExitUsage, want: []string{"but tensor partial_out has S = "}},

		// A planted fault that cannot show is a usage error, not a pass (issue 11 item 4).
		{name: "faulty backend whose fault does not fire on the case (fp8_scale_ignored, bf16 cache)", setup: func(t *testing.T, dir string) []string {
			return []string{"run", "--json", "--case", "kv_cache_write/bf16/p64/amax", "--backend", "faulty:fp8_scale_ignored"}
		}, code: ExitUsage, want: []string{"fault fp8_scale_ignored did not fire", "fp8_e4m3", "a pass would prove nothing"}},
		{name: "faulty backend on a kernel the fault does not live in", setup: func(t *testing.T, dir string) []string {
			return []string{"run", "--json", "--case", "nvfp4_quantize/m1/k2048/linear", "--backend", "faulty:page_tail_attended"}
		}, code: ExitUsage, want: []string{"fault page_tail_attended lives in mla_decode, and this run calls nvfp4_quantize"}},
		{name: "faulty backend on a case it fires on", setup: func(t *testing.T, dir string) []string {
			return []string{"run", "--json", "--case", "kv_cache_write/fp8_e4m3/p1/amax", "--backend", "faulty:fp8_scale_ignored"}
		}, code: ExitFail, want: []string{`"verdict":"fail"`}},
		{name: "simulation on a fault that has no effect there (fp8_scale_ignored, bf16 cache)", setup: func(t *testing.T, dir string) []string {
			return append([]string{"diagnose", "--simulate", "--backend", "faulty:fp8_scale_ignored"}, small...)
		}, code: ExitUsage, want: []string{"fault fp8_scale_ignored had no effect on the simulation", "--kv-cache-dtype fp8_e4m3"}},
		{name: "simulation on a fault the simulated decoder cannot show", setup: func(t *testing.T, dir string) []string {
			return append([]string{"diagnose", "--simulate", "--backend", "faulty:indexer_weights_ignored"}, small...)
		}, code: ExitUsage, want: []string{"fault indexer_weights_ignored does not show in the simulated decoder"}},

		// Resource bounds (issue 7 item 2).
		{name: "block table pointing every request at the same pages (legal)", setup: func(t *testing.T, dir string) []string {
			return []string{"check", "--json", samePagesFile(t, filepath.Join(dir, "same.safetensors"), "kv_cache_gather", 3, 40, 0)}
		}, code: ExitPass, want: []string{`"verdict":"pass"`}},
		{name: "same pages, attention (legal)", setup: func(t *testing.T, dir string) []string {
			return []string{"check", "--json", samePagesFile(t, filepath.Join(dir, "same_attn.safetensors"), "mla_decode", 3, 40, 2)}
		}, code: ExitPass, want: []string{`"verdict":"pass"`}},
		{name: "same pages, 64 requests of 65536 tokens (a 1 MB file asking for a 10 GiB gather)", setup: func(t *testing.T, dir string) []string {
			return []string{"check", "--json", "--max-memory", "1G", samePagesFile(t, filepath.Join(dir, "same_big.safetensors"), "kv_cache_gather", 64, 65536, 0)}
		}, code: ExitUsage, want: []string{"output gathered [4194304, 576]", "refused"}},
		{name: "seq_lens near 2^31", setup: mut("kv_cache_gather.safetensors", func(_ map[string]string, ts map[string]*tensor.Tensor) {
			ts["seq_lens"].SetInt64(0, 2147483000)
		}), code: ExitUsage, want: []string{"seq_lens[0] = 2147483000 exceeds the block table's capacity"}},
		{name: "num_splits = 1000000", setup: mut("mla_decode.safetensors", func(m map[string]string, _ map[string]*tensor.Tensor) { m["num_splits"] = "1000000" }, "--max-memory", "1G"), code: ExitUsage, want: []string{"partial_out [2, 1, 2, 1000000, 512]", "refused"}},
		{name: "topk = 2^31-1", setup: mut("dsa_indexer.safetensors", func(m map[string]string, _ map[string]*tensor.Tensor) { m["topk"] = "2147483647" }, "--max-memory", "1G"), code: ExitUsage, want: []string{"topk_indices [2, 2147483647]", "refused"}},
		{name: "a reference slower than --timeout (same pages, 2 x 65536 tokens)", setup: func(t *testing.T, dir string) []string {
			// 5e8 multiply-adds take tens of milliseconds even in assembly
			return []string{"check", "--json", "--timeout", "1ms", samePagesFile(t, filepath.Join(dir, "slow.safetensors"), "mla_decode", 2, 65536, 4)}
		}, code: ExitUsage, want: []string{"timed out after"}},
		{name: "diagnose on a capture whose reference is slower than --timeout", setup: func(t *testing.T, dir string) []string {
			return []string{"diagnose", "--json", "--timeout", "1ms", samePagesFile(t, filepath.Join(dir, "slow.safetensors"), "mla_decode", 2, 65536, 4)}
		}, code: ExitUsage, want: []string{"timed out after"}},
		{name: "case file: mla_decode with a million splits", setup: caseFile(`{"cases":[{"name":"splits","kernel":"mla_decode","splits":1000000}]}`, "--max-memory", "8G"), code: ExitUsage, want: []string{"case splits needs about", "partial_out [2, 1, 128, 1000000, 512]"}},
		{name: "case file: seq_lens near 2^31", setup: caseFile(`{"cases":[{"name":"long","kernel":"kv_cache_gather","seq_lens":[2147483000]}]}`, "--max-memory", "8G"), code: ExitUsage, want: []string{"case long needs about", "[2147483000, 576]"}},
		{name: "case file whose matrix expands to 10^10 cases", setup: caseFile(`{"families":[{"name":"x","base":{"kernel":"dsa_indexer"},"matrix":{` + tenKeys() + `}}]}`), code: ExitUsage, want: []string{"more than 100000 cases"}},
		// Sizes refused before they are allocated (issue 11 items 11, 14).
		{name: "case file: a batch of 10^8 requests (a 64-byte file)", setup: caseFile(`{"cases":[{"name":"x","kernel":"mla_decode","batch":100000000}]}`), code: ExitUsage, want: []string{"case x needs more than 2^61 B", "input generated tokens [5000025650000000, 576]", "refused"}},
		{name: "case file: a context of 2^58+1 pages (wraps to 64 in 64 bits)", setup: caseFile(`{"families":[{"name":"f","base":{"kernel":"kv_cache_gather","page_size":64},"matrix":{"context":["288230376151711745P"]}}]}`), code: ExitUsage, want: []string{`context "288230376151711745P" overflows a 64-bit integer`}},
		{name: "case file listing 100001 cases", setup: caseFile(namedCases(100001)), code: ExitUsage, want: []string{"more than 100000 cases (100001 listed)"}},
		{name: "diagnose --simulate --hidden 1600000000", setup: func(t *testing.T, dir string) []string {
			return []string{"diagnose", "--simulate", "--hidden", "1600000000"}
		}, code: ExitUsage, want: []string{"the simulation needs about 317.0 TiB", "b_packed [3648, 1600000000]", "refused"}},
		{name: "diagnose --simulate --steps 1600000000", setup: func(t *testing.T, dir string) []string {
			return []string{"diagnose", "--simulate", "--steps", "1600000000"}
		}, code: ExitUsage, want: []string{"the simulation needs about", "traces of 4800000000 steps", "refused"}},
		{name: "diagnose --simulate over --max-memory", setup: func(t *testing.T, dir string) []string {
			return []string{"diagnose", "--simulate", "--max-memory", "16M"}
		}, code: ExitUsage, want: []string{"the simulation needs about", "more than the memory bound 16.0 MiB"}},
		{name: "--max-memory that is not a size", setup: func(t *testing.T, dir string) []string {
			return []string{"check", "--max-memory", "lots", fx + "golden/nvfp4_gemm.safetensors"}
		}, code: ExitUsage, want: []string{"--max-memory", "lots"}},
		{name: "--max-memory below one byte (0.5), which must not turn the bound off", setup: func(t *testing.T, dir string) []string {
			return []string{"check", "--max-memory", "0.5", fx + "golden/nvfp4_gemm.safetensors"}
		}, code: ExitUsage, want: []string{"--max-memory", "less than one byte", "0 or unlimited"}},

		// Nothing overwritten, nothing lost (issue 7 item 3).
		{name: "run --out over an existing capture without --force", setup: func(t *testing.T, dir string) []string {
			out := filepath.Join(dir, "out")
			if err := os.MkdirAll(out, 0o755); err != nil {
				t.Fatal(err)
			}
			writeFile(t, filepath.Join(out, "small.safetensors"), []byte("precious"))
			return []string{"run", "--json", "--cases", writeFile(t, filepath.Join(dir, "c.json"), []byte(`{"cases":[{"name":"small","kernel":"nvfp4_quantize","m":2,"k":32}]}`)), "--out", out}
		}, code: ExitUsage, want: []string{"exists"}},
		{name: "--report into a directory that holds a report, without --force", setup: func(t *testing.T, dir string) []string {
			rep := filepath.Join(dir, "report")
			if err := os.MkdirAll(rep, 0o755); err != nil {
				t.Fatal(err)
			}
			writeFile(t, filepath.Join(rep, "report.md"), []byte("precious"))
			return []string{"check", "--report", rep, fx + "golden/nvfp4_gemm.safetensors"}
		}, code: ExitUsage, want: []string{"report.md exists"}},
		{name: "--report whose plots/ is a symbolic link out of the directory, --force", setup: func(t *testing.T, dir string) []string {
			rep := filepath.Join(dir, "report")
			if err := os.MkdirAll(rep, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(t.TempDir(), filepath.Join(rep, "plots")); err != nil {
				t.Fatal(err)
			}
			return []string{"check", "--report", rep, "--force", fx + "golden/nvfp4_gemm.safetensors"}
		}, code: ExitUsage, want: []string{"plots is a symbolic link"}},
		{name: "--report naming a file, not a directory", setup: func(t *testing.T, dir string) []string {
			return []string{"check", "--report", writeFile(t, filepath.Join(dir, "report"), []byte("precious")), fx + "golden/nvfp4_gemm.safetensors"}
		}, code: ExitUsage, want: []string{"not a directory"}},
		{name: "run --out --force with cases x/y and x__y (one capture file)", setup: func(t *testing.T, dir string) []string {
			return caseFile(`{"cases":[{"name":"x/y","kernel":"nvfp4_quantize","m":2,"k":32},{"name":"x__y","kernel":"nvfp4_quantize","m":2,"k":32}]}`, "--out", filepath.Join(dir, "out"), "--force")(t, dir)
		},
			code: ExitUsage, want: []string{`cases "x/y" and "x__y" would both be captured to x__y.safetensors`}},
		{name: "run --out into a directory holding the temporary file of a killed kcheck", setup: func(t *testing.T, dir string) []string {
			out := filepath.Join(dir, "out")
			if err := os.MkdirAll(out, 0o755); err != nil {
				t.Fatal(err)
			}
			left := writeFile(t, filepath.Join(out, ".small.safetensors.kcheck-tmp-4242"), []byte("half a capture"))
			old := time.Now().Add(-time.Hour)
			os.Chtimes(left, old, old)
			return []string{"run", "--json", "--cases", writeFile(t, filepath.Join(dir, "c.json"), []byte(`{"cases":[{"name":"small","kernel":"nvfp4_quantize","m":2,"k":32}]}`)), "--out", out}
		}, code: ExitPass, want: []string{"removed 1 temporary file(s) that a killed kcheck left in", ".small.safetensors.kcheck-tmp-4242"}},
		{name: "check --bisect --set without =", setup: func(t *testing.T, dir string) []string {
			return []string{"check", "--bisect", "--set", "foo", fx + "golden/nvfp4_gemm.safetensors"}
		}, code: ExitSkip, want: []string{`--set "foo": want KEY=VALUE`}},
		{name: "check --bisect with a flag value that does not parse", setup: func(t *testing.T, dir string) []string {
			return []string{"check", "--bisect", "--worst", "many", fx + "golden/nvfp4_gemm.safetensors"}
		}, code: ExitSkip, want: []string{"--worst"}},
		{name: "SIGINT during a run", setup: func(t *testing.T, dir string) []string {
			return []string{"run", "--json", "--cases", writeFile(t, filepath.Join(dir, "c.json"), []byte(interruptCases)), "--out", filepath.Join(dir, "out")}
		}, code: ExitInterrupted, want: []string{"interrupted after 1 of 3; finished: a-fast (pass)"}, interrupt: true},
	}
}

// tenKeys is a matrix of ten keys of ten values.
func tenKeys() string {
	keys := make([]string, 10)
	for i := range keys {
		keys[i] = fmt.Sprintf(`"k%d":[0,1,2,3,4,5,6,7,8,9]`, i)
	}
	return strings.Join(keys, ",")
}

// interruptCases: a fast case, a slow one (interrupted), a fast one.
const interruptCases = `{"cases":[
 {"name":"a-fast","kernel":"nvfp4_quantize","m":2,"k":32},
 {"name":"b-slow","kernel":"mla_decode","tp":1,"seq_lens":[16384]},
 {"name":"c-fast","kernel":"nvfp4_quantize","m":2,"k":32}]}`

func nanValue() float64 { return math.NaN() }

func TestBadInputs(t *testing.T) {
	regen := os.Getenv("KCHECK_WRITE_BAD_INPUTS") != ""
	var bin string
	if regen {
		bin = filepath.Join(t.TempDir(), "kcheck")
		if out, err := exec.Command("go", "build", "-o", bin, "github.com/kcheck-dev/kcheck/cmd/kcheck").CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
	}
	var rows []string
	for _, bi := range badInputs() {
		t.Run(bi.name, func(t *testing.T) {
			dir := t.TempDir()
			args := bi.setup(t, dir)
			var code ExitCode
			var stdout, stderr string
			switch {
			case bi.interrupt:
				code, stdout, stderr = runInterrupted(t, selfExec(), args)
			default:
				code, stdout, stderr = run(t, args...)
			}
			check := func(code ExitCode, stdout, stderr string) {
				if code != bi.code {
					t.Errorf("exit %d, want %d\nstdout: %.2000s\nstderr: %.2000s", code, bi.code, stdout, stderr)
				}
				for _, w := range bi.want {
					if !strings.Contains(stdout+stderr, w) {
						t.Errorf("output does not say %q\nstdout: %.2000s\nstderr: %.2000s", w, stdout, stderr)
					}
				}
			}
			check(code, stdout, stderr)
			if !regen {
				return
			}
			// The table comes from the built binary, on fresh files.
			dir = t.TempDir()
			args = bi.setup(t, dir)
			if bi.interrupt {
				code, stdout, stderr = runInterrupted(t, exec.Command(bin), args)
			} else {
				code, stdout, stderr = runBinary(t, bin, args)
			}
			check(code, stdout, stderr)
			rows = append(rows, fmt.Sprintf("| %s | `kcheck %s` | %s | %d | %s |", bi.name, shortArgs(args, dir), verdictOf(stdout), code,
				mdEscape(excerpt(stdout, stderr, dir))))
		})
	}
	if regen && !t.Failed() {
		writeBadInputsTable(t, rows)
	}
}

// selfExec is this test binary acting as kcheck (TestMain).
func selfExec() *exec.Cmd {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "KCHECK_CLI_MAIN=1")
	return cmd
}

func runBinary(t *testing.T, bin string, args []string) (ExitCode, string, string) {
	t.Helper()
	var out, errw bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &errw
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return ExitCode(code), out.String(), errw.String()
}

// runInterrupted starts cmd with args, sends SIGINT once the first line
// of stdout (one case's JSON result) is out, and returns what it did.
func runInterrupted(t *testing.T, cmd *exec.Cmd, args []string) (ExitCode, string, string) {
	t.Helper()
	cmd.Args = append(cmd.Args[:1], args...)
	var errw bytes.Buffer
	cmd.Stderr = &errw
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(pipe)
	first, err := r.ReadString('\n')
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("no first result: %v (stderr %s)", err, errw.String())
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(r)
	timer := time.AfterFunc(30*time.Second, func() { cmd.Process.Kill() })
	defer timer.Stop()
	err = cmd.Wait()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return ExitCode(code), first + string(rest), errw.String()
}

func verdictOf(stdout string) string {
	var verdicts []string
	dec := json.NewDecoder(strings.NewReader(stdout))
	for {
		var r struct {
			Verdict string `json:"verdict"`
		}
		if dec.Decode(&r) != nil {
			break
		}
		verdicts = append(verdicts, r.Verdict)
	}
	if len(verdicts) == 0 {
		return "(none)"
	}
	return strings.Join(verdicts, ", ")
}

// closingLine matches the tally check and run end with ("1 passed, 2
// errors in 0.3s"): it says nothing about the input and its time changes
// from run to run, so excerpts leave it out.
var closingLine = regexp.MustCompile(`(?m)^(nothing checked|[0-9]+ (passed|failed|inconclusive|errors?)(, [0-9]+ (passed|failed|inconclusive|errors?))*) in [0-9.]+s\n?`)

// excerpt is the message a user sees: the JSON error or input anomaly
// note of the first result, else the first stderr line; temporary paths
// are cut to their base names.
func excerpt(stdout, stderr, dir string) string {
	msg := ""
	dec := json.NewDecoder(strings.NewReader(stdout))
	for msg == "" {
		var r struct {
			Error *string  `json:"error"`
			Notes []string `json:"notes"`
		}
		if dec.Decode(&r) != nil {
			break
		}
		if r.Error != nil {
			msg = *r.Error
		}
		var anomalies []string
		for _, n := range r.Notes {
			if strings.HasPrefix(n, "input anomaly") {
				anomalies = append(anomalies, n)
			}
		}
		if msg == "" {
			msg = strings.Join(anomalies, "; ")
		}
	}
	if msg == "" || strings.Contains(stderr, "interrupted") {
		msg = strings.TrimSpace(closingLine.ReplaceAllString(stderr, ""))
	}
	msg = strings.ReplaceAll(msg, dir+string(filepath.Separator), "")
	msg = strings.ReplaceAll(msg, dir, ".")
	if i := strings.Index(msg, "\n"); i >= 0 && !strings.Contains(msg, "interrupted") {
		msg = msg[:i]
	}
	msg = strings.ReplaceAll(msg, "\n", " ")
	if len(msg) > 240 {
		msg = msg[:240] + "…"
	}
	return msg
}

func shortArgs(args []string, dir string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == dir {
			a = "."
		}
		a = strings.ReplaceAll(a, dir+string(filepath.Separator), "")
		out[i] = strings.ReplaceAll(a, fx, "fixtures/")
	}
	return strings.Join(out, " ")
}

func mdEscape(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

func writeBadInputsTable(t *testing.T, rows []string) {
	var b strings.Builder
	b.WriteString(`# Bad inputs: what kcheck does with them

Generated from real runs of the built ` + "`kcheck`" + ` binary on files the test
writes (internal/cli/badinputs_test.go); regenerate with

    KCHECK_WRITE_BAD_INPUTS=1 go test -run TestBadInputs ./internal/cli

Exit status: 0 all pass, 1 a fail, 2 unusable input or usage, 3
inconclusive, 130 interrupted. A verdict ` + "`error`" + ` never stops a run over
several files; no input here crashes kcheck or exhausts memory: a file
whose reference would need more than ` + "`--max-memory`" + ` (default half the
physical memory, at most 8 GiB) is refused from its shapes before it runs,
and ` + "`--timeout`" + ` (check: 10m a file; run: 2m a case) bounds the time: a check past
it stops within a unit of its work, and whatever has not stopped stays
charged against the memory bound until it does.
Every input is read within a bound and a deadline (internal/bounded):
a stream or a file that stats as 0 bytes (a pipe, ` + "`/dev/zero`" + `,
` + "`/proc/self/pagemap`" + `) is read up to ` + "`--max-memory`" + `, a safetensors header's
parse is charged against it (64 bytes a header byte), case files are read
within 32 MiB and a minute, and ` + "`report`" + ` and ` + "`merge`" + ` take ` + "`--max-memory`" + `
and ` + "`--timeout`" + ` too; opening a named pipe gives up at the deadline, and a
directory walk skips what is not a regular file, with a note. A capture
that shrinks while it is checked (a re-capture into the same path) gets
verdict ` + "`error`" + `, and the run goes on. The first SIGINT or SIGTERM ends any
command within 5 s.
Files named below are written by the test into a temporary directory.

| Bad input | Command | Verdict | Exit | Message (excerpt) |
|---|---|---|---|---|
`)
	for _, r := range rows {
		b.WriteString(r + "\n")
	}
	b.WriteString(`
Every entry point is also fuzzed (` + "`go test -fuzz`" + `): the safetensors, npy and
npz readers, the metadata and case-file parsers, every kernel's contract
validation and reference on mutated captures (NaN, Inf, subnormal and
max-magnitude payloads in every dtype, out-of-range indices, wrong shapes
and dtypes), the same through every ` + "`--from`" + ` engine adapter, pipeline
link resolution, and the pipeline stage parser on its own (against the
quadratic definition it replaced, with 100,000-stage inputs). ` + "`make fuzz-short`" + `
runs each target in CI for a fixed number of executions (about 10 s each
here: a count, because Go 1.26 can fail a duration-bounded fuzz run with
"context deadline exceeded" at its deadline, golang/go#75804); each ran 10
minutes during development, and the crashes found are fixed with their
inputs kept in ` + "`testdata/fuzz/`" + `.
`)
	if err := os.WriteFile("../check/BAD_INPUTS.md", []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestMain lets the test binary act as kcheck (KCHECK_CLI_MAIN=1), so the
// interrupt test can send a real SIGINT to a real process.
func TestMain(m *testing.M) {
	if os.Getenv(stuckChildEnv) == "1" {
		stuckChild()
	}
	if os.Getenv("KCHECK_CLI_MAIN") == "1" {
		code := Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
		if path := os.Getenv("KCHECK_PEAK_RSS_FILE"); path != "" {
			writePeakRSS(path) // rss_test.go
		}
		os.Exit(int(code))
	}
	os.Exit(m.Run())
}
