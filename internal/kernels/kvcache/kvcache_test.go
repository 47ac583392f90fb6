package kvcache

import (
	"context"
	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/kvcache"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// bitwiseFaults counts the elements of actual that differ from o.Expected
// and that o.Equivalent does not excuse, as a Bitwise check does.
func bitwiseFaults(o Output, actual *tensor.Tensor) []int {
	var bad []int
	for i, want := range Float64s(o.Expected) {
		got := actual.Float64At(i)
		if got == want || (math.IsNaN(got) && math.IsNaN(want)) {
			continue
		}
		if o.Equivalent == nil || !o.Equivalent(i, got) {
			bad = append(bad, i)
		}
	}
	return bad
}

func writeInputs(kind, conv string, before *tensor.Tensor, kv []float64, l int, slots []int64, ks float64) Inputs {
	n := len(slots)
	in := Inputs{
		Tensors: map[string]*tensor.Tensor{
			"kv_c":         tensor.FromFloat64s(tensor.BF16, []int{n, l}, kv),
			"k_pe":         tensor.FromFloat64s(tensor.BF16, []int{n, 64}, make([]float64, n*64)),
			"slot_mapping": tensor.FromInt64s(tensor.I64, []int{n}, slots),
			"cache_before": before,
			"k_scale":      tensor.FromFloat64s(tensor.F32, []int{}, []float64{ks}),
		},
		Params: Params{"kv_cache_dtype": kind, "ds_mla_scale": conv},
	}
	return in
}

// TestKVCacheWriteDSMLA: a fp8_ds_mla write through the contract, checked by
// the Bitwise rule: the correct bytes pass, a stray write fails, the other
// tile-scale convention fails.
func TestKVCacheWriteDSMLA(t *testing.T) {
	k, err := Lookup("kv_cache_write")
	if err != nil {
		t.Fatal(err)
	}
	kv := make([]float64, 2*512)
	for i := range kv {
		kv[i] = float64(i%29-14) * 0.37 // tile amaxes 5.18 (not a power of two times 448)
	}
	before := tensor.New(tensor.U8, 3, 2, 656)
	in := writeInputs("fp8_ds_mla", "amax", before, kv, 512, []int64{3, -1}, 0)
	outs, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	o := outs[0]
	if o.Mode != Bitwise || o.DType != tensor.U8 || o.Expected.Len() != 3*2*656 {
		t.Fatalf("cache_after: mode %v dtype %s %d elements", o.Mode, o.DType, o.Expected.Len())
	}
	good := Materialize(tensor.U8, o.Shape, o.Expected)
	if bad := bitwiseFaults(o, good); len(bad) != 0 {
		t.Errorf("the expected bytes fail at %v", bad)
	}
	// slot 3 = block 1, offset 1; byte 600 is rope, byte 515 is tile 0's scale MSB
	c := o.Coords.Name([]int{1, 1, 515})
	want := []Coord{{Kind: "block", Value: 1}, {Kind: "page_offset", Value: 1}, {Kind: "column", Value: 515}, {Kind: "part", Value: 1}, {Kind: "token", Value: 0}, {Kind: "tile128", Value: 0}}
	if len(c) != len(want) {
		t.Fatalf("coords %v, want %v", c, want)
	}
	for i := range want {
		if c[i] != want[i] {
			t.Errorf("coords %v, want %v", c, want)
			break
		}
	}
	if c := o.Coords.Name([]int{2, 0, 600}); c[3] != (Coord{Kind: "part", Value: 2}) || c[4] != (Coord{Kind: "token", Value: -1}) {
		t.Errorf("rope column of an empty slot: %v", c)
	}

	stray := good.Clone()
	stray.Data[5*656+10] ^= 1 // slot 5: no token there
	if bad := bitwiseFaults(o, stray); len(bad) != 1 || bad[0] != 5*656+10 {
		t.Errorf("stray write: faults at %v, want [%d]", bad, 5*656+10)
	}

	// the same write in the pow2 convention, checked as amax: a fault
	inP := writeInputs("fp8_ds_mla", "pow2", before, kv, 512, []int64{3, -1}, 0)
	po, err := Evaluate(context.Background(), k, inP, DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	pow2 := Materialize(tensor.U8, po[0].Shape, po[0].Expected)
	if bad := bitwiseFaults(o, pow2); len(bad) == 0 {
		t.Error("a pow2-convention cache passes a check that declares amax")
	}
}

// TestKVCacheWriteDTypes: an F8_E4M3-typed cache_after over U8 bytes, and a
// non-saturating writer.
func TestKVCacheWriteDTypes(t *testing.T) {
	k, _ := Lookup("kv_cache_write")
	// L = 2 plus the 64-wide rope of writeInputs; k_scale 0.5: 300 -> 600
	before := tensor.New(tensor.U8, 1, 2, 66)
	in := writeInputs("fp8_e4m3", "", before, []float64{300, 1}, 2, []int64{1}, 0.5)
	for _, c := range []struct {
		sat  string
		out  tensor.DType
		want float64
	}{{"true", tensor.U8, 0x7E}, {"false", tensor.U8, 0x7F}, {"true", tensor.F8E4M3, 448}} {
		in.Params["fp8_saturate"] = c.sat
		prec, err := PrecisionFrom(in.Params)
		if err != nil {
			t.Fatal(err)
		}
		outs, err := Evaluate(context.Background(), k, in, prec, map[string]tensor.DType{"cache_after": c.out})
		if err != nil {
			t.Fatal(err)
		}
		if got := outs[0].Expected.At(66); got != c.want || outs[0].DType != c.out {
			t.Errorf("saturate=%s as %s: %v (%s), want %v", c.sat, c.out, got, outs[0].DType, c.want)
		}
	}
}

func TestKVCacheInputErrors(t *testing.T) {
	k, _ := Lookup("kv_cache_write")
	g, _ := Lookup("kv_cache_gather")
	base := func() Inputs {
		return writeInputs("fp8_e4m3", "", tensor.New(tensor.U8, 2, 4, 66), []float64{1, 2}, 2, []int64{9}, 1)
	}
	gather := func(table, lens []int64, rows int) Inputs {
		return Inputs{Tensors: map[string]*tensor.Tensor{
			"cache":       tensor.New(tensor.BF16, 4, 16, 576),
			"block_table": tensor.FromInt64s(tensor.I32, []int{rows, len(table) / rows}, table),
			"seq_lens":    tensor.FromInt64s(tensor.I32, []int{rows}, lens),
		}, Params: Params{"kv_cache_dtype": "bf16"}}
	}
	for _, c := range []struct {
		name string
		k    Kernel
		in   Inputs
		edit func(Inputs)
		want string
	}{
		{"slot outside", k, base(), nil, "slot_mapping[0] = 9 is outside the cache (NB*P = 2*4 = 8)"},
		{"no k_scale", k, base(), func(in Inputs) { delete(in.Tensors, "k_scale") }, "tensor k_scale is missing"},
		{"bad kind", k, base(), func(in Inputs) { in.Params["kv_cache_dtype"] = "fp8" }, "parameter kv_cache_dtype = \"fp8\""},
		{"page size", k, base(), func(in Inputs) { in.Params["page_size"] = "64" }, "tensor cache_before has shape [2 4 66]; kv_cache_dtype fp8_e4m3 with page_size 64"},
		{"slot dtype", k, base(), func(in Inputs) { in.Tensors["slot_mapping"] = tensor.New(tensor.F32, 1) }, "tensor slot_mapping has dtype F32"},
		{"block outside", g, gather([]int64{0, 9412}, []int64{20}, 1), nil, "block_table[0,1] = 9412 is outside the cache (NB = 4)"},
		{"capacity", g, gather([]int64{0, 1, 2, 3}, []int64{1, 40}, 2), nil, "seq_lens[1] = 40 exceeds the block table's capacity 2*16 = 32"},
	} {
		if c.edit != nil {
			c.edit(c.in)
		}
		_, err := Evaluate(context.Background(), c.k, c.in, DefaultPrecision(), nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", c.name, err, c.want)
		}
	}
}

// TestKVCacheGather: fp8_e4m3 with k_scale 0.1 gathered to bf16: code 0x38
// (1.0) gives fp32 0.1 = 0x3DCCCCCD, stored as bf16 0x3DCD = 0.10009765625
// (Expected), while Exact is 0.100000001490116... Coordinates name the
// request, token and page of each row.
func TestKVCacheGather(t *testing.T) {
	g, _ := Lookup("kv_cache_gather")
	cache := tensor.New(tensor.U8, 3, 2, 4)
	for i := range cache.Data {
		cache.Data[i] = 0x38
	}
	in := Inputs{Tensors: map[string]*tensor.Tensor{
		"cache":       cache,
		"block_table": tensor.FromInt64s(tensor.I32, []int{2, 2}, []int64{2, -1, 1, 0}),
		"seq_lens":    tensor.FromInt64s(tensor.I32, []int{2}, []int64{1, 3}),
		"k_scale":     tensor.FromFloat64s(tensor.F32, []int{1}, []float64{0.1}),
	}, Params: Params{"kv_cache_dtype": "fp8_e4m3", "page_size": "2"}}
	outs, err := Evaluate(context.Background(), g, in, DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	o := outs[0]
	if o.DType != tensor.BF16 || o.Shape[0] != 4 || o.Shape[1] != 4 {
		t.Fatalf("gathered %s %v, want BF16 [4 4]", o.DType, o.Shape)
	}
	if o.Expected.At(0) != 0.10009765625 || o.Exact.At(0) != 0.100000001490116119384765625 {
		t.Errorf("row 0: expected %v exact %v", o.Expected.At(0), o.Exact.At(0))
	}
	// row 3 = request 1 token 2: page 1 of its table = block 0, offset 0
	c := o.Coords.Name([]int{3, 1})
	want := []Coord{{Kind: "row", Value: 3}, {Kind: "dim", Value: 1}, {Kind: "request", Value: 1}, {Kind: "token", Value: 2}, {Kind: "page", Value: 1}, {Kind: "page_offset", Value: 0}, {Kind: "block", Value: 0}, {Kind: "part", Value: 0}}
	for i := range want {
		if i >= len(c) || c[i] != want[i] {
			t.Fatalf("coords %v, want %v", c, want)
		}
	}
}

// TestCacheValuesOnDemand: the on-demand references of the cache kernels
// read, in sequential and in scattered order (the kept entry or row must be
// replaced, not reused), as the whole caches and gathers that kvcache
// materializes: cache_after as kvcache.Write's After and Exact, gathered as
// kvcache.Gather's rows (fp32 products rounded to bf16 for Expected).
func TestCacheValuesOnDemand(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	order := func(n int) []int {
		idx := make([]int, 0, 2*n)
		for i := 0; i < n; i++ {
			idx = append(idx, i)
		}
		return append(idx, rng.Perm(n)...)
	}
	same := func(a, b float64) bool { return a == b || (math.IsNaN(a) && math.IsNaN(b)) }
	for _, kind := range []string{"bf16", "fp16", "fp8_e4m3", "fp8_ds_mla"} {
		l := 8
		if kind == "fp8_ds_mla" {
			l = 512
		}
		lay, err := kvcache.NewLayout(kvcache.Kind(kind), l, 64, 4)
		if err != nil {
			t.Fatal(err)
		}
		before := tensor.New(lay.CacheDTypes()[0], 5, 4, lay.EntrySize())
		for i := range before.Data {
			before.Data[i] = byte(rng.IntN(256))
		}
		if kind == "bf16" || kind == "fp16" { // random bytes make NaNs; keep them finite
			for i := 0; i < before.Len(); i++ {
				before.SetFloat64(i, float64(rng.IntN(100))/8)
			}
		}
		slots := []int64{17, -1, 3, 4, 12, 0}
		kv := make([]float64, len(slots)*l)
		for i := range kv {
			kv[i] = rng.NormFloat64()
		}
		in := writeInputs(kind, "amax", before, kv, l, slots, 0.03)
		w, err := kvcache.Write(before, in.Tensors["kv_c"], in.Tensors["k_pe"], slots, lay, float64(float32(0.03)))
		if err != nil {
			t.Fatal(err)
		}
		k, _ := Lookup("kv_cache_write")
		outs, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil)
		if err != nil {
			t.Fatal(err)
		}
		o := outs[0]
		if o.Expected.Len() != before.Len() || o.Exact.Len() != before.Len() {
			t.Fatalf("%s: %d/%d values for a cache of %d", kind, o.Expected.Len(), o.Exact.Len(), before.Len())
		}
		for _, i := range order(before.Len()) {
			if got, want := o.Expected.At(i), w.After.Float64At(i); !same(got, want) {
				t.Fatalf("%s: cache_after expected[%d] = %v, want %v", kind, i, got, want)
			}
			if got, want := o.Exact.At(i), w.Exact.Float64At(i); !same(got, want) {
				t.Fatalf("%s: cache_after exact[%d] = %v, want %v", kind, i, got, want)
			}
		}
		if got := Materialize(o.DType, o.Shape, o.Expected); string(got.Data) != string(w.After.Data) {
			t.Errorf("%s: the materialized cache_after differs from kvcache.Write's", kind)
		}

		// Gather the written cache back, two requests over scattered blocks.
		cache := w.After
		table := []int64{4, 0, 2, 1, 3, 0}
		lens := []int64{10, 7}
		g, _ := Lookup("kv_cache_gather")
		gin := Inputs{Tensors: map[string]*tensor.Tensor{
			"cache":       cache,
			"block_table": tensor.FromInt64s(tensor.I32, []int{2, 3}, table),
			"seq_lens":    tensor.FromInt64s(tensor.I32, []int{2}, lens),
			"k_scale":     tensor.FromFloat64s(tensor.F32, []int{}, []float64{0.03}),
		}, Params: Params{"kv_cache_dtype": kind}}
		gouts, err := Evaluate(context.Background(), g, gin, DefaultPrecision(), nil)
		if err != nil {
			t.Fatal(err)
		}
		c, err := kvcache.New(cache, kvcache.Layout{Kind: lay.Kind, L: gouts[0].Shape[1] - 64, R: 64, PageSize: 4, DSScale: kvcache.ScaleAmax}, float64(float32(0.03)))
		if err != nil {
			t.Fatal(err)
		}
		pages, err := kvcache.NewPages(gin.Tensors["block_table"], gin.Tensors["seq_lens"], 4, 5)
		if err != nil {
			t.Fatal(err)
		}
		exact, _ := kvcache.Gather(c, pages, tensor.F64)
		expected, _ := kvcache.Gather(c, pages, tensor.F32)
		o = gouts[0]
		if o.Expected.Len() != len(exact) {
			t.Fatalf("%s: gathered has %d values, kvcache.Gather %d", kind, o.Expected.Len(), len(exact))
		}
		for _, i := range order(len(exact)) {
			if got, want := o.Exact.At(i), exact[i]; !same(got, want) {
				t.Fatalf("%s: gathered exact[%d] = %v, want %v", kind, i, got, want)
			}
			// stored in the default dst: the model's dtype, fp16 for an fp16 cache
			want := formats.RoundBF16(expected[i])
			if kind == "fp16" {
				want = formats.RoundFP16(expected[i])
			}
			if got := o.Expected.At(i); !same(got, want) {
				t.Fatalf("%s: gathered expected[%d] = %v, want %v", kind, i, got, want)
			}
		}
	}
}

// TestFP16Cache: an fp16 cache through the contracts (reference/CONTRACTS.md
// §3.4, §3.5): kv_cache_dtype fp16, or auto over an F16 cache, written from
// bf16, fp16 or fp32 tokens with one round to nearest even, and gathered to
// every dst dtype. The token values and their fp16 codes are those of
// reference/kvcache's TestWriteFP16ByHand: bf16 65536 rounds to +inf in
// fp16 (its exact value stays finite, for Compare to name an overflow),
// f32 1+3·2^-11 ties to 0x3C02 = 1.001953125.
func TestFP16Cache(t *testing.T) {
	w, _ := Lookup("kv_cache_write")
	g, _ := Lookup("kv_cache_gather")
	for _, c := range []struct {
		name      string
		kind      string
		tok       tensor.DType
		x         float64
		want, exa float64 // cache_after's expected and exact value at the token
	}{
		{"bf16 into fp16", "fp16", tensor.BF16, 65280, 65280, 65280},
		{"bf16 overflows fp16", "fp16", tensor.BF16, 65536, math.Inf(1), 65536},
		{"f32 tie to even", "fp16", tensor.F32, 1 + 0x3p-11, 1.001953125, 1 + 0x3p-11},
		{"fp16 copied, auto", "auto", tensor.F16, 0x1p-24, 0x1p-24, 0x1p-24},
	} {
		before := tensor.FromFloat64s(tensor.F16, []int{1, 2, 2}, []float64{-7, -7, -7, -7})
		in := Inputs{Tensors: map[string]*tensor.Tensor{
			"kv_c":         tensor.FromFloat64s(c.tok, []int{1, 1}, []float64{c.x}),
			"k_pe":         tensor.FromFloat64s(c.tok, []int{1, 1}, []float64{0.5}),
			"slot_mapping": tensor.FromInt64s(tensor.I64, []int{1}, []int64{1}),
			"cache_before": before,
		}, Params: Params{"kv_cache_dtype": c.kind}}
		outs, err := Evaluate(context.Background(), w, in, DefaultPrecision(), nil)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		o := outs[0]
		if o.DType != tensor.F16 {
			t.Errorf("%s: cache_after is %s, want F16", c.name, o.DType)
		}
		if got, exa := o.Expected.At(2), o.Exact.At(2); got != c.want || exa != c.exa {
			t.Errorf("%s: token value expected %v exact %v, want %v and %v", c.name, got, exa, c.want, c.exa)
		}
		if got := o.Expected.At(0); got != -7 {
			t.Errorf("%s: an unwritten slot reads %v, want cache_before's -7", c.name, got)
		}
	}

	// The gather of an fp16 cache to each dst: fp16 0x3C01 = 1 + 2^-10
	// widens exactly; bf16 rounds it to 1 (2^-10 is below half of bf16's
	// 2^-7 ulp), fp32 and fp16 keep it.
	cache := tensor.FromFloat64s(tensor.F16, []int{2, 1, 2}, []float64{1 + 0x1p-10, -3, 5, 6})
	for _, c := range []struct {
		kind string
		dst  tensor.DType // "" = the default, the cache's own F16
		want []float64
	}{
		{"fp16", "", []float64{5, 6, 1 + 0x1p-10, -3}},
		{"auto", tensor.F16, []float64{5, 6, 1 + 0x1p-10, -3}},
		{"fp16", tensor.BF16, []float64{5, 6, 1, -3}},
		{"fp16", tensor.F32, []float64{5, 6, 1 + 0x1p-10, -3}},
	} {
		in := Inputs{Tensors: map[string]*tensor.Tensor{
			"cache":       cache,
			"block_table": tensor.FromInt64s(tensor.I32, []int{1, 2}, []int64{1, 0}),
			"seq_lens":    tensor.FromInt64s(tensor.I32, []int{1}, []int64{2}),
		}, Params: Params{"kv_cache_dtype": c.kind}}
		var od OutDTypes
		if c.dst != "" {
			od = OutDTypes{"gathered": c.dst}
		}
		outs, err := Evaluate(context.Background(), g, in, DefaultPrecision(), od)
		if err != nil {
			t.Fatalf("gather %s to %q: %v", c.kind, c.dst, err)
		}
		o := outs[0]
		if want := c.dst; (want == "" && o.DType != tensor.F16) || (want != "" && o.DType != want) {
			t.Errorf("gather %s to %q: gathered is %s", c.kind, c.dst, o.DType)
		}
		for i, want := range c.want {
			if got := o.Expected.At(i); got != want {
				t.Errorf("gather %s to %q: element %d = %v, want %v", c.kind, c.dst, i, got, want)
			}
			if exa := o.Exact.At(i); exa != []float64{5, 6, 1 + 0x1p-10, -3}[i] {
				t.Errorf("gather %s to %q: exact element %d = %v, want the cache's value", c.kind, c.dst, i, exa)
			}
		}
	}

	// auto names the cache's own dtype and nothing else.
	for _, c := range []struct {
		cache *tensor.Tensor
		want  string
	}{
		{tensor.New(tensor.U8, 2, 1, 2), "parameter kv_cache_dtype = auto means the cache's own dtype (BF16 or F16), but tensor cache is U8: an fp8 cache needs kv_cache_dtype fp8_e4m3 or fp8_ds_mla"},
		{tensor.New(tensor.F32, 2, 1, 2), "tensor cache has dtype F32; the contract wants BF16 or F16 or U8 or F8_E4M3"},
	} {
		in := Inputs{Tensors: map[string]*tensor.Tensor{
			"cache":       c.cache,
			"block_table": tensor.FromInt64s(tensor.I32, []int{1, 2}, []int64{1, 0}),
			"seq_lens":    tensor.FromInt64s(tensor.I32, []int{1}, []int64{2}),
		}, Params: Params{"kv_cache_dtype": "auto"}}
		if _, err := Evaluate(context.Background(), g, in, DefaultPrecision(), nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("auto over a %s cache: got %v, want an error containing %q", c.cache.DType, err, c.want)
		}
	}
}
