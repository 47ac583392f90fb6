package check

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"github.com/kcheck-dev/kcheck/internal/bounded"
	"github.com/kcheck-dev/kcheck/internal/evidence"
	"math"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/safetensors"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// The structured fuzz targets (FuzzKernel, FuzzPipeline) do not feed bytes
// to a parser: they read the fuzzer's bytes as a program of mutations
// applied to a valid capture (a golden fixture, or the shipped pipeline),
// so the fuzzer reaches the kernels' validation and references instead of
// stopping at the file format. Every mutation is one a broken deployment
// produces: a reshaped or retyped tensor, a payload of NaN, Inf, subnormals
// or the largest finite value of its dtype, an index out of range, a
// parameter of the wrong kind or size, a missing tensor, the wrong kernel.

// fuzzBytes reads the fuzzer's input as small integers; past its end every
// read is 0, so any input is a valid program.
type fuzzBytes struct {
	b []byte
	i int
}

func (r *fuzzBytes) more() bool { return r.i < len(r.b) }

func (r *fuzzBytes) byte() byte {
	if r.i >= len(r.b) {
		return 0
	}
	r.i++
	return r.b[r.i-1]
}

// intn returns a value in [0, n) (n > 0) from one or two bytes.
func (r *fuzzBytes) intn(n int) int {
	if n <= 256 {
		return int(r.byte()) % n
	}
	return (int(r.byte())<<8 | int(r.byte())) % n
}

// take returns up to n raw bytes.
func (r *fuzzBytes) take(n int) []byte {
	n = min(n, len(r.b)-r.i)
	out := r.b[r.i : r.i+n]
	r.i += n
	return out
}

// specials are bit patterns worth planting in each dtype, little-endian:
// NaN, ±Inf, the smallest subnormal, ±max finite, -0, 1, and for integer
// dtypes -1, 0, the extremes and values near a cache's size.
var specials = func() map[tensor.DType][][]byte {
	le := func(v uint64, n int) []byte {
		b := make([]byte, 8)
		binary.LittleEndian.PutUint64(b, v)
		return b[:n]
	}
	m := map[tensor.DType][][]byte{}
	for _, s := range []struct {
		d    tensor.DType
		n    int
		bits []uint64
	}{
		{tensor.F64, 8, []uint64{0x7ff8000000000000, 0x7ff0000000000000, 0xfff0000000000000, 1, 0x7fefffffffffffff, 0xffefffffffffffff, 1 << 63, 0x3ff0000000000000, 0x000fffffffffffff}},
		{tensor.F32, 4, []uint64{0x7fc00000, 0x7f800000, 0xff800000, 1, 0x7f7fffff, 0xff7fffff, 0x80000000, 0x3f800000, 0x007fffff}},
		{tensor.F16, 2, []uint64{0x7e00, 0x7c00, 0xfc00, 1, 0x7bff, 0xfbff, 0x8000, 0x3c00, 0x03ff}},
		{tensor.BF16, 2, []uint64{0x7fc0, 0x7f80, 0xff80, 1, 0x7f7f, 0xff7f, 0x8000, 0x3f80, 0x007f}},
		{tensor.F8E4M3, 1, []uint64{0x7f, 0xff, 0x01, 0x7e, 0xfe, 0x80, 0x38, 0x07}},
		{tensor.F8E5M2, 1, []uint64{0x7f, 0x7c, 0xfc, 0x01, 0x7b, 0xfb, 0x80, 0x3c}},
		{tensor.F8E8M0, 1, []uint64{0xff, 0x00, 0xfe, 0x7f}},
		{tensor.U8, 1, []uint64{0, 0xff, 0x77, 0xff, 0x88, 0x7f, 0x80, 0x01}},
		{tensor.Bool, 1, []uint64{0, 1, 2, 0xff}},
	} {
		for _, v := range s.bits {
			m[s.d] = append(m[s.d], le(v, s.n))
		}
	}
	ints := []int64{-1, 0, 1, 2, 3, 4, 5, 7, 16, 63, 64, 65, 4096, math.MaxInt32, math.MinInt32, math.MaxInt32 + 1, math.MaxInt64, math.MinInt64}
	for _, d := range []tensor.DType{tensor.I8, tensor.I16, tensor.I32, tensor.I64, tensor.U16, tensor.U32, tensor.U64} {
		for _, v := range ints {
			m[d] = append(m[d], le(uint64(v), d.Size()))
		}
	}
	return m
}()

var allDTypes = []tensor.DType{tensor.F64, tensor.F32, tensor.F16, tensor.BF16, tensor.F8E4M3, tensor.F8E5M2, tensor.F8E8M0,
	tensor.I64, tensor.I32, tensor.I16, tensor.I8, tensor.U64, tensor.U32, tensor.U16, tensor.U8, tensor.Bool}

// dims a reshape draws from: small sizes, the kernels' own widths, and
// zero (an empty tensor).
var fuzzDims = []int{0, 1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 20, 32, 64, 65, 128, 129, 256, 512, 576, 640, 656}

// maxFuzzElements bounds a mutated tensor (the estimate bounds what the
// kernels derive from shapes and parameters; this bounds the fuzz inputs
// themselves).
const maxFuzzElements = 1 << 18

// paramKeys are the parameters the kernels read, and a few the checker reads.
var paramKeys = []string{"page_size", "kv_cache_dtype", "num_splits", "topk", "max_seq", "latent_dim", "softmax_scale",
	"causal", "lse_base", "lse_empty", "ds_mla_scale", "scale_layout", "global_scale_kind", "a_global_kind", "b_global_kind",
	"acc_dtype", "p_dtype", "kv_dequant_dtype", "fp8_saturate", "kcheck.kernel", "kcheck.format"}

var paramValues = []string{"", "-1", "0", "1", "2", "3", "4", "7", "16", "64", "512", "576", "2147483647", "2147483648",
	"-2147483648", "9223372036854775807", "1e9", "1e308", "NaN", "inf", "-inf", "0.0625", "true", "false", "e", "2", "bf16",
	"fp8_e4m3", "fp8_ds_mla", "linear", "swizzled_128x4", "quant", "dequant", "f16", "f32", "f64", "pow2", "amax", "zero",
	"-inf", "x", "pipeline", "nvfp4_gemm", "mla_decode", "dsa_indexer"}

// loadCapture reads a fixture into memory (copies: mutations must not touch
// the read-only mapping).
func loadCapture(tb testing.TB, path string) evidence.Capture {
	tb.Helper()
	f, err := safetensors.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	c := evidence.Capture{Name: filepath.Base(path), Metadata: map[string]string{}, Tensors: map[string]*tensor.Tensor{}}
	for k, v := range f.Metadata {
		c.Metadata[k] = v
	}
	for k, v := range f.Tensors {
		c.Tensors[k] = v.Clone()
	}
	return c
}

// cloneCapture copies metadata and tensors.
func cloneCapture(c evidence.Capture) evidence.Capture {
	out := evidence.Capture{Name: c.Name, Metadata: map[string]string{}, Tensors: map[string]*tensor.Tensor{}}
	for k, v := range c.Metadata {
		out.Metadata[k] = v
	}
	for k, v := range c.Tensors {
		out.Tensors[k] = v.Clone()
	}
	return out
}

func sortStrings(s []string) { sort.Strings(s) }

func sortedNames(ts map[string]*tensor.Tensor) []string {
	n := make([]string, 0, len(ts))
	for k := range ts {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// resize gives t a new dtype and shape, keeping as much of its bytes as fit
// and repeating them (or zeros) to fill the rest.
func resize(t *tensor.Tensor, d tensor.DType, shape []int) *tensor.Tensor {
	n := tensor.NumElements(shape) * d.Size()
	data := make([]byte, n)
	if len(t.Data) > 0 {
		for i := 0; i < n; i += len(t.Data) {
			copy(data[i:], t.Data)
		}
	}
	return &tensor.Tensor{DType: d, Shape: shape, Data: data}
}

// mutateTensors applies one tensor mutation chosen by r; names are the
// tensors it may pick (prefixed names in a pipeline).
func mutateTensors(c *evidence.Capture, r *fuzzBytes, op int) {
	names := sortedNames(c.Tensors)
	if len(names) == 0 {
		return
	}
	name := names[r.intn(len(names))]
	t := c.Tensors[name]
	switch op {
	case 0: // plant a special value over a run of elements
		sp := specials[t.DType]
		if len(sp) == 0 || t.Len() == 0 {
			return
		}
		v := sp[r.intn(len(sp))]
		start, count := r.intn(t.Len()), 1+r.intn(64)
		if r.byte()%8 == 0 {
			start, count = 0, t.Len() // the whole tensor
		}
		// (bounded by the bytes too: mutation 6 leaves data that does not
		// match the shape)
		for i := start; i < min(t.Len(), start+count) && (i+1)*len(v) <= len(t.Data); i++ {
			copy(t.Data[i*len(v):], v)
		}
	case 1: // raw fuzzer bytes at an offset
		if len(t.Data) == 0 {
			return
		}
		off := r.intn(len(t.Data))
		copy(t.Data[off:], r.take(1+r.intn(32)))
	case 2: // reshape: change one dimension, or the rank
		shape := append([]int(nil), t.Shape...)
		switch k := r.intn(4); {
		case k == 0 && len(shape) > 0:
			shape = shape[:len(shape)-1]
		case k == 1 && len(shape) < 6:
			shape = append(shape, fuzzDims[r.intn(len(fuzzDims))])
		case len(shape) > 0:
			shape[r.intn(len(shape))] = fuzzDims[r.intn(len(fuzzDims))]
		}
		if tensor.NumElements(shape) <= maxFuzzElements {
			c.Tensors[name] = resize(t, t.DType, shape)
		}
	case 3: // retype (the bytes reinterpreted, resized to the new width)
		c.Tensors[name] = resize(t, allDTypes[r.intn(len(allDTypes))], t.Shape)
	case 4: // drop it
		delete(c.Tensors, name)
	case 5: // copy it under another tensor's name (a mixed-up capture)
		other := names[r.intn(len(names))]
		c.Tensors[other] = t.Clone()
	case 6: // bytes that do not match the shape (a reader bug upstream)
		if r.byte()%2 == 0 && len(t.Data) > 0 {
			c.Tensors[name] = &tensor.Tensor{DType: t.DType, Shape: t.Shape, Data: t.Data[:len(t.Data)-1]}
		} else {
			c.Tensors[name] = &tensor.Tensor{DType: t.DType, Shape: t.Shape, Data: append(t.Clone().Data, 0)}
		}
	}
}

// mutateMeta sets or deletes a parameter (under prefix, for a pipeline stage).
func mutateMeta(c *evidence.Capture, r *fuzzBytes, prefix string) {
	key := prefix + paramKeys[r.intn(len(paramKeys))]
	if strings.HasPrefix(key, prefix+"kcheck.") {
		key = strings.TrimPrefix(key, prefix)
	}
	switch r.intn(4) {
	case 0:
		delete(c.Metadata, key)
	case 1: // a value from the fuzzer
		c.Metadata[key] = string(r.take(r.intn(12)))
	default:
		c.Metadata[key] = paramValues[r.intn(len(paramValues))]
	}
}

// fuzzLimits are the bounds the structured targets run under: small enough
// that a runaway estimate is refused quickly, large enough for the fixtures.
const (
	fuzzMaxMemory = 64 << 20
	fuzzTimeout   = 20 * time.Second
)

func digest(c evidence.Capture) [32]byte {
	h := sha256.New()
	for _, n := range sortedNames(c.Tensors) {
		t := c.Tensors[n]
		h.Write([]byte(n + string(t.DType) + strconv.Itoa(len(t.Shape))))
		for _, d := range t.Shape {
			h.Write([]byte(strconv.Itoa(d) + ","))
		}
		h.Write(t.Data)
	}
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out
}

// checkInvariants runs c and asserts what must hold for any input: a
// verdict, an error message when the verdict is error, no panic (Run turns
// one into InternalErrorPrefix), no hang (a timeout on a check the estimate
// calls cheap), no allocation far beyond the estimate, and the inputs
// untouched.
func checkInvariants(t *testing.T, c evidence.Capture) Result {
	t.Helper()
	return checkInvariantsWith(t, c, Options{MaxMemory: fuzzMaxMemory})
}

// kernelNamesForFuzz is every kernel and the pipeline.
var kernelNamesForFuzz = append(kernel.Names(), "pipeline")

func checkInvariantsWith(t *testing.T, c evidence.Capture, opts Options) Result {
	t.Helper()
	before := digest(c)
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	ctx, cancel := context.WithTimeout(context.Background(), fuzzTimeout)
	defer cancel()
	res := Run(ctx, c, opts)
	runtime.ReadMemStats(&ms1)
	switch res.Verdict {
	case Pass, Fail, Inconclusive:
		if res.Error != nil {
			t.Fatalf("verdict %s with an error: %s", res.Verdict, *res.Error)
		}
	case Error:
		if res.Error == nil || *res.Error == "" {
			t.Fatal("verdict error without a message")
		}
		msg := *res.Error
		if strings.Contains(msg, InternalErrorPrefix) {
			t.Fatalf("panic: %s", msg)
		}
		if strings.Contains(msg, ErrTimeout.Error()) {
			t.Fatalf("hang: %s (estimated %.1e multiply-adds)", msg, float64(estimateOps(c)))
		}
	default:
		t.Fatalf("verdict %q", res.Verdict)
	}
	// Cumulative allocation bounds the peak from above; allow the estimate
	// several times over for temporaries, but not a runaway.
	if alloc := ms1.TotalAlloc - ms0.TotalAlloc; alloc > 8*fuzzMaxMemory+(64<<20) {
		t.Fatalf("allocated %s under a %s bound (verdict %s)", bounded.FormatBytes(int64(alloc)), bounded.FormatBytes(fuzzMaxMemory), res.Verdict)
	}
	if digest(c) != before {
		t.Fatal("the check wrote into its input tensors")
	}
	return res
}

// estimateOps is the capture's estimated work: its kernel's, or the sum of
// a pipeline's stages (each read under its prefix).
func estimateOps(c evidence.Capture) int64 {
	kname := c.Metadata["kcheck.kernel"]
	if kname != "pipeline" {
		return EstimateKernel(kname, c.Tensors, params(c.Metadata)).Ops
	}
	var ops int64
	for _, prefix := range strings.Split(c.Metadata["kcheck.stages"], ",") {
		prefix = strings.TrimSpace(prefix)
		ts := map[string]*tensor.Tensor{}
		for n, t := range c.Tensors {
			if strings.HasPrefix(n, prefix+".") {
				ts[strings.TrimPrefix(n, prefix+".")] = t
			}
		}
		p := kernel.Params{}
		for k, v := range c.Metadata {
			if strings.HasPrefix(k, prefix+".") {
				p[strings.TrimPrefix(k, prefix+".")] = v
			}
		}
		// Linked inputs come from another stage: count the largest tensor
		// a link could bring as this stage's too.
		ops = kernel.AddSizes(ops, 3*EstimateKernel(c.Metadata["kcheck."+prefix+".kernel"], ts, p).Ops)
	}
	return ops
}

// maxFuzzOps skips inputs whose estimated work takes seconds: they are
// valid and slow (the time bound has its own tests), and would starve the
// fuzzer of executions.
const maxFuzzOps = 2e8

// encodeSeed turns a mutation program into a corpus entry.
func encodeSeed(ops ...byte) []byte { return bytes.Clone(ops) }
