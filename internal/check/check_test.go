package check

import (
	"context"
	"encoding/binary"
	"github.com/kcheck-dev/kcheck/internal/evidence"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/safetensors"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

const golden = "../../fixtures/golden/"

// load reads a golden capture into memory the test may change.
func load(t *testing.T, name string) evidence.Capture {
	t.Helper()
	f, err := safetensors.Open(golden + name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c := evidence.Capture{Name: name, Metadata: map[string]string{}, Tensors: map[string]*tensor.Tensor{}}
	for k, v := range f.Metadata {
		c.Metadata[k] = v
	}
	for k, v := range f.Tensors {
		c.Tensors[k] = v.Clone()
	}
	return c
}

// Each bad capture gives verdict error with a message naming the tensor
// (or key) and the problem, never a panic.
func TestBadCaptures(t *testing.T) {
	tests := []struct {
		name, file string
		mutate     func(c *evidence.Capture)
		want       []string
	}{
		{"no kernel", "nvfp4_dequantize.safetensors", func(c *evidence.Capture) { delete(c.Metadata, "kcheck.kernel") }, []string{"kcheck.kernel", "missing"}},
		{"unknown kernel", "nvfp4_dequantize.safetensors", func(c *evidence.Capture) { c.Metadata["kcheck.kernel"] = "flash_attn_9" }, []string{"unknown kernel", "flash_attn_9"}},
		{"future format", "nvfp4_dequantize.safetensors", func(c *evidence.Capture) { c.Metadata["kcheck.format"] = "2" }, []string{"kcheck.format"}},
		{"missing input", "nvfp4_dequantize.safetensors", func(c *evidence.Capture) { delete(c.Tensors, "block_scale") }, []string{"block_scale", "missing"}},
		{"no outputs", "nvfp4_dequantize.safetensors", func(c *evidence.Capture) { delete(c.Tensors, "out") }, []string{"none of", "outputs"}},
		{"wrong input dtype", "nvfp4_dequantize.safetensors", func(c *evidence.Capture) {
			p := c.Tensors["packed"]
			c.Tensors["packed"] = &tensor.Tensor{DType: tensor.I8, Shape: p.Shape, Data: p.Data}
		}, []string{"packed", "I8"}},
		{"wrong output dtype", "nvfp4_dequantize.safetensors", func(c *evidence.Capture) {
			o := c.Tensors["out"]
			c.Tensors["out"] = &tensor.Tensor{DType: tensor.I16, Shape: o.Shape, Data: o.Data}
		}, []string{"out", "I16"}},
		{"K not a multiple of 16", "nvfp4_quantize.safetensors", func(c *evidence.Capture) {
			x := c.Tensors["x"]
			rows, k := x.Shape[0], x.Shape[1]
			cut := tensor.New(x.DType, rows, k-8)
			for r := 0; r < rows; r++ {
				copy(cut.Data[r*(k-8)*2:(r+1)*(k-8)*2], x.Data[r*k*2:])
			}
			c.Tensors["x"] = cut
		}, []string{"x", "multiple of 16"}},
		{"output shape disagrees", "splitk_combine.safetensors", func(c *evidence.Capture) {
			o := c.Tensors["out"]
			c.Tensors["out"] = &tensor.Tensor{DType: o.DType, Shape: []int{o.Shape[1], o.Shape[0]}, Data: o.Data}
		}, []string{"out", "shape"}},
		{"block table outside the cache", "mla_decode.safetensors", func(c *evidence.Capture) {
			c.Tensors["block_table"].SetInt64(0, 9412)
		}, []string{"block_table[0,0] = 9412"}},
		{"seq_len beyond the table", "mla_decode.safetensors", func(c *evidence.Capture) {
			c.Tensors["seq_lens"].SetInt64(1, 5000)
		}, []string{"seq_lens[1] = 5000"}},
		{"slot outside the cache", "kv_cache_write.safetensors", func(c *evidence.Capture) {
			c.Tensors["slot_mapping"].SetInt64(2, 1<<40)
		}, []string{"slot_mapping[2]"}},
		{"softmax_scale missing", "mla_decode.safetensors", func(c *evidence.Capture) { delete(c.Metadata, "softmax_scale") }, []string{"softmax_scale"}},
		{"bad parameter", "mla_decode.safetensors", func(c *evidence.Capture) { c.Metadata["lse_base"] = "10" }, []string{"lse_base"}},
		{"data shorter than shape", "splitk_combine.safetensors", func(c *evidence.Capture) {
			p := c.Tensors["partial_lse"]
			p.Data = p.Data[:len(p.Data)-4]
		}, []string{"partial_lse"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := load(t, tc.file)
			tc.mutate(&c)
			res := Run(t.Context(), c, Options{})
			if res.Verdict != Error || res.Error == nil {
				t.Fatalf("verdict %s, want error", res.Verdict)
			}
			for _, w := range tc.want {
				if !strings.Contains(*res.Error, w) {
					t.Errorf("error %q does not mention %q", *res.Error, w)
				}
			}
		})
	}
}

// NaN in an input is not an error: the kernel must carry it through, and
// the report says it was there.
func TestNaNInputIsAnAnomalyNotAnError(t *testing.T) {
	c := load(t, "nvfp4_quantize.safetensors")
	x := c.Tensors["x"]
	binary.LittleEndian.PutUint16(x.Data[2*5:], 0x7FC0) // x[0,5] = NaN
	res := Run(t.Context(), c, Options{})
	if res.Verdict == Error {
		t.Fatalf("verdict error (%s); a NaN input must be checked", *res.Error)
	}
	found := false
	for _, n := range res.Notes {
		found = found || strings.Contains(n, "input anomaly: tensor x holds 1 NaN")
	}
	if !found {
		t.Errorf("notes %q do not report the NaN in x", res.Notes)
	}
}

// Issue 11 item 5: a note must mean something. kcheck's own generated
// inputs are correct, so none of them raises an input anomaly, though its
// caches hold NaN in the pages no request owns and its combine inputs -inf
// for empty splits; NaN or Inf where the kernel reads it, or where the
// contract gives it no meaning, is still noted.
func TestInputAnomalyNotesMeanSomething(t *testing.T) {
	if testing.Short() {
		t.Skip("every catalog case generated and checked: make test runs it in its pass without -race (-short is its race-detector pass)")
	}
	all, err := cases.Catalog()
	if err != nil {
		t.Fatal(err)
	}
	// The smallest case of each kernel and cache dtype, for the kernels with
	// an input the contract reads only in part or whose special values mean
	// something (the others' generated inputs hold no NaN or Inf).
	partly := map[string]bool{}
	for _, name := range kernel.Names() {
		k, _ := kernel.Lookup(name)
		for _, s := range k.Spec().Inputs {
			partly[name] = partly[name] || s.Read != nil || len(s.Meaningful) > 0
		}
	}
	smallest := map[string]cases.Case{}
	for _, c := range all {
		if c.HasTag("long") || !partly[c.Kernel] {
			continue
		}
		key := c.Kernel + "/" + c.KVCacheDType
		if old, ok := smallest[key]; !ok || EstimateCase(c.Sizes()).Bytes < EstimateCase(old.Sizes()).Bytes {
			smallest[key] = c
		}
	}
	poisoned := 0
	for _, key := range slices.Sorted(maps.Keys(smallest)) {
		c := smallest[key]
		t.Run("generated "+c.Name, func(t *testing.T) {
			capture := captureOf(t, c, produce(t, c, kernel.DefaultPrecision(), nil))
			for _, ts := range capture.Tensors {
				if ts.DType.IsFloat() {
					for i := 0; i < ts.Len(); i++ {
						if v := ts.Float64At(i); math.IsNaN(v) || math.IsInf(v, 0) {
							poisoned++
							break
						}
					}
				}
			}
			res := Run(t.Context(), capture, Options{})
			for _, n := range res.Notes {
				if strings.HasPrefix(n, "input anomaly") {
					t.Errorf("a correct generated input raises %q", n)
				}
			}
		})
	}
	if poisoned == 0 {
		t.Fatal("no generated input holds NaN or Inf: the cases above prove nothing")
	}

	nan, inf := math.NaN(), math.Inf(1)
	decode := cases.Case{Name: "decode", Kernel: "mla_decode", Preset: "deepseek-v3", TP: 32, SeqLens: []int{37, 20}, PageSize: 16, Seed: 3}
	write := cases.Case{Name: "write", Kernel: "kv_cache_write", KVCacheDType: "bf16", PageSize: 16, SeqLens: []int{37, 20}, Latent: 32, Rope: 16, Seed: 3}
	combine := cases.Case{Name: "combine", Kernel: "splitk_combine", Preset: "deepseek-v3", TP: 32, Batch: 2, Splits: 4, Seed: 3}
	// entry sets element j of request b's token t of a paged cache.
	entry := func(ts map[string]*tensor.Tensor, cache string, b, t0, j int, v float64) {
		c, bt := ts[cache], ts["block_table"]
		blk := int(bt.Int64At(b*bt.Shape[1] + t0/c.Shape[1]))
		c.SetFloat64((blk*c.Shape[1]+t0%c.Shape[1])*c.Shape[2]+j, v)
	}
	for _, tc := range []struct {
		name string
		c    cases.Case
		edit func(ts map[string]*tensor.Tensor)
		want string // "" for no note
	}{
		{"NaN in q", decode, func(ts map[string]*tensor.Tensor) { ts["q"].SetFloat64(7, nan) }, "input anomaly: tensor q holds 1 NaN and 0 Inf (first at [0 0 0 7])"},
		{"NaN in an attended cache entry", decode, func(ts map[string]*tensor.Tensor) { entry(ts, "kv_cache", 1, 19, 3, nan) }, "input anomaly: tensor kv_cache holds 1 NaN and 0 Inf"},
		{"Inf in the last attended token", decode, func(ts map[string]*tensor.Tensor) { entry(ts, "kv_cache", 0, 36, 0, inf) }, "input anomaly: tensor kv_cache holds 0 NaN and 1 Inf"},
		{"Inf past seq_len on the last page", decode, func(ts map[string]*tensor.Tensor) { entry(ts, "kv_cache", 0, 37, 0, inf) }, ""},
		{"NaN in kv_c", write, func(ts map[string]*tensor.Tensor) { ts["kv_c"].SetFloat64(0, nan) }, "input anomaly: tensor kv_c holds 1 NaN"},
		{"NaN in the cache a writer writes over", write, func(ts map[string]*tensor.Tensor) { ts["cache_before"].SetFloat64(0, nan) }, ""},
		{"-inf partial lse (an empty split)", combine, func(ts map[string]*tensor.Tensor) { ts["partial_lse"].SetFloat64(1, -inf) }, ""},
		// the combine cannot weigh these: verdict error, the message names them
		{"+inf partial lse", combine, func(ts map[string]*tensor.Tensor) { ts["partial_lse"].SetFloat64(1, inf) }, "partial_lse[0,1] = +Inf: a partial lse must be finite, or -inf for an empty split"},
		{"NaN partial lse", combine, func(ts map[string]*tensor.Tensor) { ts["partial_lse"].SetFloat64(1, nan) }, "partial_lse[0,1] = NaN: a partial lse must be finite"},
		{"-inf partial out", combine, func(ts map[string]*tensor.Tensor) { ts["partial_out"].SetFloat64(1, -inf) }, "input anomaly: tensor partial_out holds 0 NaN and 1 Inf"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			capture := captureOf(t, tc.c, produce(t, tc.c, kernel.DefaultPrecision(), nil))
			for name, ts := range capture.Tensors {
				capture.Tensors[name] = ts.Clone()
			}
			tc.edit(capture.Tensors)
			res := Run(t.Context(), capture, Options{})
			var got []string
			for _, n := range res.Notes {
				if strings.HasPrefix(n, "input anomaly") {
					got = append(got, n)
				}
			}
			if res.Error != nil {
				got = append(got, *res.Error)
			}
			if tc.want == "" && len(got) > 0 || tc.want != "" && (len(got) != 1 || !strings.Contains(got[0], tc.want)) {
				t.Errorf("notes and error %q, want %q", got, tc.want)
			}
		})
	}
}

// Unreadable files are verdict error naming the file's problem.
func TestBadFiles(t *testing.T) {
	good, err := os.ReadFile(golden + "splitk_combine.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"truncated", good[:5], "8"},
		{"header past the end", append(binary.LittleEndian.AppendUint64(nil, 1<<40), good[8:]...), "header"},
		{"header not JSON", append(binary.LittleEndian.AppendUint64(nil, 4), []byte("nope")...), "JSON"},
		{"data cut short", good[:len(good)-10], "partial"},
		{"unknown dtype", []byte(strings.Replace(string(good), `"F32"`, `"F31"`, 1)), "F31"},
	}
	dir := t.TempDir()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_")+".safetensors")
			if err := os.WriteFile(path, tc.data, 0o644); err != nil {
				t.Fatal(err)
			}
			res := File(t.Context(), path, nil, Options{})
			if res.Verdict != Error || res.Error == nil || !strings.Contains(*res.Error, tc.want) {
				t.Fatalf("verdict %s error %v, want error mentioning %q", res.Verdict, res.Error, tc.want)
			}
		})
	}
}

// Every coordinate a kernel names an element by is explained where the
// terminal prints it (kernel.CoordMeaning), or says what it is itself:
// run over one small catalog case of every kernel and every output, so a
// coordinate added later without a meaning fails here.
func TestCoordinatesExplained(t *testing.T) {
	selfEvident := map[string]bool{"request": true, "head": true, "latent": true, "split": true, "page": true,
		"block": true, "page_offset": true, "column": true, "col": true, "byte": true, "sf_row": true, "sf_col": true, "rank": true}
	all, err := cases.Catalog()
	if err != nil {
		t.Fatal(err)
	}
	all = append(all, cases.Case{Name: "small_gemm", Kernel: "nvfp4_gemm", M: 8, N: 48, K: 256, Seed: 3}) // the catalog's are large
	done := map[string]bool{}
	for _, c := range all {
		if done[c.Kernel] || c.HasTag("long") || EstimateCase(c.Sizes()).Bytes > 64<<20 {
			continue
		}
		done[c.Kernel] = true
		in, err := c.Inputs()
		if err != nil {
			t.Fatal(err)
		}
		k, err := kernel.Lookup(c.Kernel)
		if err != nil {
			t.Fatal(err)
		}
		outs, err := kernel.Evaluate(context.Background(), k, in, kernel.DefaultPrecision(), nil)
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		for _, o := range outs {
			if len(o.Shape) == 0 {
				continue
			}
			for _, coord := range o.Coords.Name(make([]int, len(o.Shape))) {
				if !coord.Kind.Declared() { // signature could not know what it stands for
					t.Errorf("%s output %s: coordinate kind %q is not declared (kernel/coords.go)", c.Kernel, o.Name, coord.Kind)
				}
				if kernel.CoordMeaning(coord.Name()) == "" && !selfEvident[coord.Name()] {
					t.Errorf("%s output %s: coordinate %q has no meaning (kernel/coords.go)", c.Kernel, o.Name, coord.Name())
				}
			}
		}
	}
	if len(done) != len(kernel.Names()) {
		t.Errorf("covered %d kernels of %d", len(done), len(kernel.Names()))
	}
}
