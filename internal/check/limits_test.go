package check

import (
	"archive/zip"
	"context"
	"errors"
	"github.com/kcheck-dev/kcheck/internal/bounded"
	"github.com/kcheck-dev/kcheck/internal/evidence"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/backend"
	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// allocDuring returns the bytes allocated while fn ran. Cumulative
// allocation is an upper bound of the peak working set, so an estimate
// above it is conservative.
func allocDuring(fn func()) uint64 {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	fn()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// The estimate must be conservative: on every golden capture and on small
// catalog cases of every kernel, what the check (and, for a case, the input
// generator with the reference backend) really allocates stays under it.
func TestEstimateBoundsAllocation(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation measured over every golden capture and catalog kernel: make test runs it in its pass without -race (-short is its race-detector pass)")
	}
	paths, err := filepath.Glob(golden + "*.safetensors")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no golden fixtures: %v", err)
	}
	for _, p := range paths {
		c := load(t, filepath.Base(p))
		kname := c.Metadata["kcheck.kernel"]
		e := EstimateKernel(kname, c.Tensors, params(c.Metadata))
		var res Result
		got := allocDuring(func() { res = Run(t.Context(), c, Options{}) })
		if res.Verdict != Pass {
			t.Fatalf("%s: verdict %s", p, res.Verdict)
		}
		if int64(got) > e.Bytes {
			t.Errorf("%s: allocated %d bytes, estimate %d (%s)", kname, got, e.Bytes, e.What)
		}
	}
	all, err := cases.Catalog()
	if err != nil {
		t.Fatal(err)
	}
	perKernel := map[string]int{}
	all = append(all, cases.Case{Name: "small_gemm", Kernel: "nvfp4_gemm", M: 8, N: 48, K: 256, Seed: 3})
	for _, c := range all {
		if c.HasTag("long") || perKernel[c.Kernel] >= 2 || EstimateCase(c.Sizes()).Bytes > 64<<20 {
			continue
		}
		perKernel[c.Kernel]++
		e := EstimateCase(c.Sizes())
		var in kernel.Inputs
		var outs map[string]*tensor.Tensor
		got := allocDuring(func() {
			if in, err = c.Inputs(); err == nil {
				outs, err = backend.Reference{}.Run(context.Background(), c.Kernel, in)
			}
		})
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		if int64(got) > e.Bytes {
			t.Errorf("case %s: generator and reference allocated %d bytes, estimate %d (%s)", c.Name, got, e.Bytes, e.What)
		}
		ts := map[string]*tensor.Tensor{}
		for k, v := range in.Tensors {
			ts[k] = v
		}
		for k, v := range outs {
			ts[k] = v
		}
		meta, _ := c.Metadata()
		ke := EstimateKernel(c.Kernel, ts, in.Params)
		got = allocDuring(func() { Run(t.Context(), evidence.Capture{Name: c.Name, Metadata: meta, Tensors: ts}, Options{}) })
		if int64(got) > ke.Bytes {
			t.Errorf("check of case %s: allocated %d bytes, estimate %d (%s)", c.Name, got, ke.Bytes, ke.What)
		}
	}
	if len(perKernel) != len(kernel.Names()) {
		t.Errorf("small cases for %d kernels, want all %d: %v", len(perKernel), len(kernel.Names()), perKernel)
	}
}

// Every non-long catalog case fits the smallest default bound (256 MiB is
// the floor of DefaultMaxMemory... a 4 GiB machine gets 2 GiB).
func TestCatalogWithinBounds(t *testing.T) {
	all, err := cases.Catalog()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range all {
		if c.HasTag("long") {
			continue
		}
		if err := CheckCaseMemory(c.Sizes(), 2<<30); err != nil {
			t.Errorf("%v", err)
		}
	}
}

func TestParseBytes(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		bad  bool
	}{
		{"8G", 8 << 30, false}, {"8GiB", 8 << 30, false}, {"512M", 512 << 20, false}, {"512mb", 512 << 20, false},
		{"1.5G", 3 << 29, false}, {"1024", 1024, false}, {"2T", 2 << 40, false}, {"0", -1, false},
		{"unlimited", -1, false}, {"-1G", 0, true}, {"lots", 0, true}, {"", 0, true}, {"1e30G", 0, true}, {"NaN", 0, true},
		// Only "0" and "unlimited" turn the bound off (issue 11 item 12):
		// a size that rounds below one byte is a mistake, not "no bound".
		{"0.5", 0, true}, {"0B", 0, true}, {"0G", 0, true}, {"1e-300", 0, true}, {"0.4K", 409, false}, {"1", 1, false},
	}
	for _, tc := range tests {
		got, err := ParseBytes(tc.in)
		if (err != nil) != tc.bad || !tc.bad && got != tc.want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d (bad %v)", tc.in, got, err, tc.want, tc.bad)
		}
	}
}

func TestDefaultMaxMemory(t *testing.T) {
	d := DefaultMaxMemory()
	if d < 256<<20 || d > 8<<30 {
		t.Fatalf("DefaultMaxMemory() = %d, want within [256 MiB, 8 GiB]", d)
	}
	if m := physicalMemory(); m > 0 && d > m/2 && d > 256<<20 {
		t.Errorf("default %d is more than half of physical memory %d", d, m)
	}
}

// i32 is an I32 tensor.
func i32(shape []int, v ...int64) *tensor.Tensor { return tensor.FromInt64s(tensor.I32, shape, v) }

// samePages is a kv_cache_gather or mla_decode capture whose block table
// points every request at cache block 0 (legal: prefix sharing does it),
// seqLen tokens each over pages of 16, with reference-made outputs.
func samePages(t *testing.T, kname string, b, seqLen, heads int) evidence.Capture {
	t.Helper()
	const page, d = 16, 576
	blocks := (seqLen + page - 1) / page
	cache := tensor.New(tensor.BF16, 1, page, d)
	for i := 0; i < cache.Len(); i++ {
		cache.SetFloat64(i, formats.RoundBF16(float64(i%37)/37-0.5))
	}
	seq := make([]int64, b)
	for i := range seq {
		seq[i] = int64(seqLen)
	}
	ts := map[string]*tensor.Tensor{
		"block_table": tensor.FromInt64s(tensor.I32, []int{b, blocks}, make([]int64, b*blocks)),
		"seq_lens":    tensor.FromInt64s(tensor.I32, []int{b}, seq),
	}
	meta := map[string]string{"kcheck.format": "1", "kcheck.kernel": kname, "page_size": strconv.Itoa(page), "kv_cache_dtype": "bf16"}
	if kname == "kv_cache_gather" {
		ts["cache"] = cache
	} else {
		ts["kv_cache"] = cache
		q := tensor.New(tensor.BF16, b, 1, heads, d)
		for i := 0; i < q.Len(); i++ {
			q.SetFloat64(i, formats.RoundBF16(float64(i%29)/29-0.5))
		}
		ts["q"] = q
		meta["softmax_scale"] = "0.0625"
	}
	return withOutputs(t, evidence.Capture{Name: kname + "_same_pages", Metadata: meta, Tensors: ts})
}

// withOutputs adds the reference's outputs (a correct kernel's) to c, when
// they are small enough to make here.
func withOutputs(t *testing.T, c evidence.Capture) evidence.Capture {
	t.Helper()
	k, err := kernel.Lookup(c.Metadata["kcheck.kernel"])
	if err != nil {
		t.Fatal(err)
	}
	p := params(c.Metadata)
	if EstimateKernel(k.Spec().Name, c.Tensors, p).Bytes > 256<<20 {
		// too big to produce: a placeholder of the right name (the check
		// refuses before comparing it)
		c.Tensors[k.Spec().Outputs[0].Name] = tensor.New(k.Spec().Outputs[0].DTypes[0], 1)
		return c
	}
	prec, _ := kernel.PrecisionFrom(p)
	outs, err := kernel.Produce(context.Background(), k, kernel.Inputs{Tensors: c.Tensors, Params: p}, prec, nil)
	if err != nil {
		t.Fatal(err)
	}
	for n, o := range outs {
		c.Tensors[n] = o
	}
	return c
}

// Each resource-bound case of issue 7: refused with a message naming the
// tensor and the estimate, or handled within the bound; never an OOM kill.
func TestResourceBounds(t *testing.T) {
	const limit = 1 << 30
	tests := []struct {
		name    string
		capture func(t *testing.T) evidence.Capture
		verdict compare.Verdict
		want    []string
	}{
		{"every request on the same pages (legal)", func(t *testing.T) evidence.Capture { return samePages(t, "kv_cache_gather", 3, 40, 0) }, Pass, nil},
		{"every request on the same pages, attention (legal)", func(t *testing.T) evidence.Capture { return samePages(t, "mla_decode", 3, 40, 2) }, Pass, nil},
		{"same pages, 64 requests of 65536 tokens: the gather would be 116 GiB", func(t *testing.T) evidence.Capture {
			return samePages(t, "kv_cache_gather", 64, 65536, 0)
		}, Error, []string{"output gathered [4194304, 576]", "more than the memory bound 1.0 GiB", "refused", "--max-memory"}},
		{"seq_lens near 2^31 over a small block table", func(t *testing.T) evidence.Capture {
			c := samePages(t, "kv_cache_gather", 1, 40, 0)
			c.Tensors["seq_lens"] = i32([]int{1}, 2147483000)
			return c
		}, Error, []string{"seq_lens[0] = 2147483000", "capacity"}},
		{"seq_lens near 2^31, attention", func(t *testing.T) evidence.Capture {
			c := samePages(t, "mla_decode", 1, 40, 2)
			c.Tensors["seq_lens"] = i32([]int{1}, 2147483647)
			return c
		}, Error, []string{"seq_lens[0] = 2147483647", "capacity"}},
		{"num_splits = 1000000", func(t *testing.T) evidence.Capture {
			c := load(t, "mla_decode.safetensors")
			c.Metadata["num_splits"] = "1000000"
			return c
		}, Error, []string{"output partial_out [2, 1, 2, 1000000, 512]", "refused"}},
		{"topk = 2^31-1", func(t *testing.T) evidence.Capture {
			c := load(t, "dsa_indexer.safetensors")
			c.Metadata["topk"] = "2147483647"
			return c
		}, Error, []string{"output topk_indices [2, 2147483647]", "refused"}},
		{"max_seq = 2^31-1", func(t *testing.T) evidence.Capture {
			c := load(t, "dsa_indexer.safetensors")
			c.Metadata["max_seq"] = "2147483647"
			return c
		}, Error, []string{"output scores [2, 2147483647]", "refused"}},
		{"a million splits to combine (4 MB of partials: handled)", func(t *testing.T) evidence.Capture {
			const s = 1000000
			lse := make([]float64, s)
			for i := range lse {
				lse[i] = float64(i%7) - 3
			}
			c := evidence.Capture{Name: "million_splits", Metadata: map[string]string{"kcheck.format": "1", "kcheck.kernel": "splitk_combine"},
				Tensors: map[string]*tensor.Tensor{
					"partial_out": tensor.FromFloat64s(tensor.F32, []int{1, s, 1}, lse),
					"partial_lse": tensor.FromFloat64s(tensor.F32, []int{1, s}, lse),
				}}
			return withOutputs(t, c)
		}, Pass, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.capture(t)
			var res Result
			got := allocDuring(func() { res = Run(t.Context(), c, Options{MaxMemory: limit}) })
			msg := ""
			if res.Error != nil {
				msg = *res.Error
			}
			if res.Verdict != tc.verdict {
				t.Fatalf("verdict %s (%s), want %s", res.Verdict, msg, tc.verdict)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not say %q", msg, w)
				}
			}
			if got > limit {
				t.Errorf("allocated %d bytes under a bound of %d", got, limit)
			}
		})
	}
}

// A case file is refused before its inputs are built when the generator or
// the reference would exceed the bound (kcheck run).
func TestCaseBounds(t *testing.T) {
	tests := []struct {
		name string
		c    cases.Case
		want string
	}{
		{"a million splits", cases.Case{Name: "m", Kernel: "mla_decode", Splits: 1000000}, "output partial_out [2, 1, 128, 1000000, 512]"},
		{"a million splits to combine", cases.Case{Name: "s", Kernel: "splitk_combine", Splits: 1000000}, "input partial_out [256, 1000000, 512]"},
		{"seq_lens near 2^31", cases.Case{Name: "l", Kernel: "mla_decode", SeqLens: []int{2147483000}}, "input generated tokens [2147483000, 576]"},
		{"huge topk", cases.Case{Name: "k", Kernel: "mla_decode_sparse", TopK: 1 << 30, SeqLens: []int{100}}, "input indices [1, 1, 1073741824]"},
		{"huge gemm", cases.Case{Name: "g", Kernel: "nvfp4_gemm", M: 1 << 20, N: 1 << 20, K: 1 << 12}, "output out [1048576, 1048576]"},
	}
	for _, tc := range tests {
		err := CheckCaseMemory(tc.c.Sizes(), 1<<30)
		if err == nil || !errors.Is(err, ErrMemory) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "case "+tc.c.Name) {
			t.Errorf("%s: err = %v, want a refusal naming %q", tc.name, err, tc.want)
		}
	}
}

// A case's batch is a number in its file, not a list: "batch": 10^8 (a
// 90-byte file) once filled 2.6 GB of default contexts to print its
// refusal, and 2^40 ran out of memory. Estimating and refusing it
// allocates nothing per request, and its numbers are exact where a list
// of contexts is (sizesOfRamp below).
func TestCaseBatchEstimatedWithoutAllocating(t *testing.T) {
	for _, tc := range []struct {
		c    cases.Case
		want string
	}{
		{cases.Case{Name: "b", Kernel: "mla_decode", Batch: 100000000}, "input generated tokens [5000025650000000, 576]"},
		{cases.Case{Name: "b", Kernel: "kv_cache_gather", Batch: 1 << 40}, "more than 2^61 B"},
		{cases.Case{Name: "b", Kernel: "dsa_indexer", Batch: 1 << 40, PageSize: 1 << 20}, "more than 2^61 B"},
		{cases.Case{Name: "b", Kernel: "splitk_combine", Batch: 1 << 40}, "more than 2^61 B"},
		{cases.Case{Name: "b", Kernel: "mla_decode_sparse", Batch: 1 << 40}, "more than 2^61 B"},
	} {
		var err error
		got := allocDuring(func() { err = CheckCaseMemory(tc.c.Sizes(), 8<<30) })
		if err == nil || !errors.Is(err, ErrMemory) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s batch %d: err = %v, want a refusal saying %q", tc.c.Kernel, tc.c.Batch, err, tc.want)
		}
		if got > 1<<20 {
			t.Errorf("%s batch %d: estimating allocated %d bytes", tc.c.Kernel, tc.c.Batch, got)
		}
	}
}

// A reference that runs past the deadline gives verdict error at once,
// saying it timed out; the estimate stays small (it is time, not memory).
func TestTimeBound(t *testing.T) {
	c := samePages(t, "mla_decode", 2, 64, 4)
	// The outputs above were made for 64 tokens; now make the work large
	// (8192 tokens a request, all on the same pages: about 1.5e8
	// multiply-adds, most of a second) without new outputs.
	c.Tensors["block_table"] = tensor.FromInt64s(tensor.I32, []int{2, 512}, make([]int64, 2*512))
	c.Tensors["seq_lens"] = i32([]int{2}, 8192, 8192)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	res := Run(ctx, c, Options{})
	if took := time.Since(start); took > stopBound {
		t.Errorf("returned after %v, want soon after the 20ms deadline", took)
	}
	if res.Verdict != Error || res.Error == nil || !strings.Contains(*res.Error, "timed out") || !strings.Contains(*res.Error, "mla_decode") {
		t.Fatalf("verdict %s error %v, want a timeout naming the kernel", res.Verdict, res.Error)
	}
	// The reference has stopped: nothing runs on with the check's memory.
	if held, n := heldBytes(); held != 0 || n != 0 {
		t.Errorf("%d bytes in %d charges held after Run returned", held, n)
	}
	// Canceled (an interrupt) rather than a deadline: said so.
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	res = Run(ctx, c, Options{})
	if res.Verdict != Error || res.Error == nil || !strings.Contains(*res.Error, "interrupted") {
		t.Fatalf("verdict %s error %v, want interrupted", res.Verdict, res.Error)
	}
}

// A .npz member deflates megabytes of zeros into kilobytes; its header is
// charged against the memory bound before the data is inflated.
func TestNpzBomb(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bomb.npz")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	zw := zip.NewWriter(f)
	w, err := zw.CreateHeader(&zip.FileHeader{Name: "partial_out.npy", Method: zip.Deflate})
	if err != nil {
		t.Fatal(err)
	}
	// numpy 1.0 header: magic, version, length, then the dict padded so the
	// data starts at a multiple of 64.
	h := "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1048576, 1), }"
	h += strings.Repeat(" ", (64-(10+len(h)+1)%64)%64) + "\n"
	w.Write(append([]byte("\x93NUMPY\x01\x00"), byte(len(h)), byte(len(h)>>8)))
	w.Write([]byte(h))
	w.Write(make([]byte, 4<<20)) // 4 MiB of zeros
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	st, _ := os.Stat(path)
	res := File(t.Context(), path, map[string]string{"kcheck.kernel": "splitk_combine"}, Options{MaxMemory: 1 << 20})
	if res.Verdict != Error || res.Error == nil || !strings.Contains(*res.Error, "needs 4194304 bytes") || !strings.Contains(*res.Error, "--max-memory") {
		t.Fatalf("a %d-byte .npz asking for 4 MiB under a 1 MiB bound: verdict %s error %v", st.Size(), res.Verdict, res.Error)
	}
	// Under a bound that allows it, it reads (and the check goes on to
	// say what the file lacks: the outputs).
	res = File(t.Context(), path, map[string]string{"kcheck.kernel": "splitk_combine"}, Options{MaxMemory: 64 << 20})
	if res.Error == nil || !strings.Contains(*res.Error, "none of splitk_combine's outputs") {
		t.Fatalf("within the bound: verdict %s error %s, want the missing outputs", res.Verdict, *res.Error)
	}
}

// A device or pipe that never ends (/dev/zero) is read only up to the
// memory bound, then refused.
func TestEndlessStream(t *testing.T) {
	if _, err := os.Stat("/dev/zero"); err != nil {
		t.Skip("no /dev/zero")
	}
	res := File(t.Context(), "/dev/zero", nil, Options{MaxMemory: 1 << 20})
	if res.Verdict != Error || res.Error == nil || !strings.Contains(*res.Error, "a stream of more than 1.0 MiB") {
		t.Fatalf("verdict %s error %v, want a refusal at the 1 MiB bound", res.Verdict, res.Error)
	}
}

// The cache kernels compute their reference values on demand, so a check of
// a real-size cache (604 MB of bf16: 8192 blocks of 64 entries of 576
// values) is estimated at the output it stores (F32 for a gather, whose
// dtype the estimate does not see) plus at most 512 MiB of bookkeeping,
// where it was once 48 bytes an element (14 GiB for the write).
func TestCacheEstimatesAtRealSize(t *testing.T) {
	const nb, page, d = 8192, 64, 576
	cacheBytes := int64(nb * page * d * 2)
	shaped := func(dt tensor.DType, shape ...int) *tensor.Tensor { return &tensor.Tensor{DType: dt, Shape: shape} }
	p := kernel.Params{"kv_cache_dtype": "bf16", "page_size": "64"}
	write := EstimateKernel("kv_cache_write", map[string]*tensor.Tensor{
		"cache_before": shaped(tensor.BF16, nb, page, d),
		"kv_c":         shaped(tensor.BF16, 32768, 512),
		"k_pe":         shaped(tensor.BF16, 32768, 64),
		"slot_mapping": shaped(tensor.I64, 32768),
	}, p)
	seq := make([]int64, 16)
	for i := range seq {
		seq[i] = nb / 16 * page
	}
	gather := EstimateKernel("kv_cache_gather", map[string]*tensor.Tensor{
		"cache":       shaped(tensor.BF16, nb, page, d),
		"block_table": shaped(tensor.I32, 16, nb/16),
		"seq_lens":    tensor.FromInt64s(tensor.I32, []int{16}, seq),
	}, p)
	for _, c := range []struct {
		name string
		e    kernel.Estimate
		out  int64 // the stored output's bytes, which the estimate must cover
	}{{"kv_cache_write", write, cacheBytes}, {"kv_cache_gather", gather, 2 * cacheBytes}} {
		if c.e.Bytes < c.out || c.e.Bytes > c.out+512<<20 {
			t.Errorf("%s over a %d-byte cache: estimate %s (%s), want between the stored output %s and 512 MiB more",
				c.name, cacheBytes, bounded.FormatBytes(c.e.Bytes), c.e.What, bounded.FormatBytes(c.out))
		}
	}
}

// A capture's partials give mla_decode's split count when no parameter
// does (reference/CONTRACTS.md §3.6.1), so the estimate counts the partials the reference makes
// from them: a million splits of partial_out are refused before they are
// allocated, with or without num_splits.
func TestEstimateReadsSplitsFromPartials(t *testing.T) {
	in := map[string]*tensor.Tensor{
		"q":           {DType: tensor.BF16, Shape: []int{2, 1, 16, 576}},
		"kv_cache":    {DType: tensor.BF16, Shape: []int{4, 64, 576}},
		"block_table": {DType: tensor.I32, Shape: []int{2, 2}},
		"seq_lens":    tensor.FromInt64s(tensor.I32, []int{2}, []int64{100, 120}),
	}
	p := kernel.Params{"kv_cache_dtype": "bf16", "page_size": "64", "softmax_scale": "0.1"}
	without := EstimateKernel("mla_decode", in, p).Bytes
	in["partial_out"] = &tensor.Tensor{DType: tensor.F32, Shape: []int{2, 1, 16, 1 << 20, 512}}
	from := EstimateKernel("mla_decode", in, p)
	withParam := EstimateKernel("mla_decode", in, kernel.Params{"kv_cache_dtype": "bf16", "page_size": "64", "num_splits": "1048576"})
	if from.Bytes < 2*16<<20*512*8 || from.Bytes != withParam.Bytes || from.Bytes <= without {
		t.Errorf("estimate with partials of 2^20 splits %d B (num_splits 2^20: %d B, no partials: %d B): want the partials counted alike", from.Bytes, withParam.Bytes, without)
	}
}
