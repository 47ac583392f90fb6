package compare

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"math"
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// The cache kernels' captures for the bulk path's tests: a cache of
// cacheBlocks pages of cachePage tokens (tens of parallel chunks), written
// to or gathered from, in every layout.
const (
	cacheBlocks = 12
	cachePage   = 16
)

// cacheDTypeOf is the cache tensor's dtype for a layout, and the tokens'.
func cacheDTypeOf(kind string, u8 bool) (cache, tokens tensor.DType) {
	switch kind {
	case "bf16":
		return tensor.BF16, tensor.BF16
	case "fp16":
		return tensor.F16, tensor.F16
	}
	if u8 {
		return tensor.U8, tensor.BF16
	}
	return tensor.F8E4M3, tensor.BF16
}

// randomCache is a cache of the layout's bytes: normal values for the
// 16-bit layouts, with a NaN, an infinity, subnormals and -0 in entries
// seeded at fixed places; random bytes for the fp8 ones (an F8_E4M3 cache
// then holds NaN codes too).
func randomCache(rng *rand.Rand, kind string, d tensor.DType) *tensor.Tensor {
	e := map[string]int{"fp8_ds_mla": 656, "fp8_ds_mla_model1": 584}[kind]
	if e == 0 {
		e = 576
	}
	c := tensor.New(d, cacheBlocks, cachePage, e)
	if d.Size() == 1 {
		for i := range c.Data {
			c.Data[i] = byte(rng.Uint32())
			if d == tensor.F8E4M3 && c.Data[i]&0x7F == 0x7F {
				c.Data[i] ^= 1 // no NaN but the one planted below
			}
		}
		if d == tensor.F8E4M3 {
			c.Data[3*e+5] = 0x7F
		}
		if kind == "fp8_ds_mla" { // tile scales a writer could store
			for s := 0; s < cacheBlocks*cachePage; s++ {
				for tile := 0; tile < 4; tile++ {
					binary.LittleEndian.PutUint32(c.Data[s*e+512+4*tile:], math.Float32bits(float32(0.01+0.01*rng.Float64())))
				}
			}
		}
		return c
	}
	for i := 0; i < c.Len(); i++ {
		c.SetFloat64(i, rng.NormFloat64())
	}
	for i, v := range map[int]float64{1*e + 3: math.NaN(), 7*e + 9: math.Inf(-1), 9*e + 1: 3e-41, 9*e + 2: math.Copysign(0, -1)} {
		c.SetFloat64(i, v)
	}
	if d == tensor.F16 {
		c.SetFloat64(9*e+1, 3e-6) // an fp16 subnormal
	}
	return c
}

// cacheWriteOutput is kv_cache_write's reference over a random cache: 90
// tokens, pages 2 to 6 filled (a token in ten padded) and the rest
// scattered.
func cacheWriteOutput(t *testing.T, rng *rand.Rand, kind string, u8 bool) kernel.Output {
	t.Helper()
	cd, td := cacheDTypeOf(kind, u8)
	before := randomCache(rng, kind, cd)
	var slots []int64
	for s := 2 * cachePage; s < 7*cachePage; s++ {
		slots = append(slots, int64(s))
	}
	for len(slots) < 90 {
		s := int64(7*cachePage + rng.IntN((cacheBlocks-7)*cachePage))
		dup := false
		for _, x := range slots {
			dup = dup || x == s
		}
		if !dup {
			slots = append(slots, s)
		}
	}
	for i := range slots {
		if i%10 == 3 {
			slots[i] = -1
		}
	}
	n := len(slots)
	l := 512
	if kind == "fp8_ds_mla_model1" {
		l = 448
	}
	kv, pe := make([]float64, n*l), make([]float64, n*64)
	for i := range kv {
		kv[i] = rng.NormFloat64()
	}
	for i := range pe {
		pe[i] = rng.NormFloat64()
	}
	in := kernel.Inputs{Tensors: map[string]*tensor.Tensor{
		"kv_c":         tensor.FromFloat64s(td, []int{n, l}, kv),
		"k_pe":         tensor.FromFloat64s(td, []int{n, 64}, pe),
		"slot_mapping": tensor.FromInt64s(tensor.I64, []int{n}, slots),
		"cache_before": before,
		"k_scale":      tensor.FromFloat64s(tensor.F32, []int{}, []float64{0.02}),
	}, Params: kernel.Params{"kv_cache_dtype": kind}}
	if kind != "fp8_e4m3" {
		delete(in.Tensors, "k_scale")
	}
	if kind == "fp8_ds_mla_model1" {
		in.Params["ds_mla_scale"] = "pow2" // E8M0 scales
	}
	return evaluate(t, "kv_cache_write", in, nil)
}

// cacheGatherOutput is kv_cache_gather's reference over a random cache:
// three requests over a shuffled block table, gathered to out ("" for the
// default dtype).
func cacheGatherOutput(t *testing.T, rng *rand.Rand, kind string, out tensor.DType, kScale float64) kernel.Output {
	t.Helper()
	cd, _ := cacheDTypeOf(kind, true)
	cache := randomCache(rng, kind, cd)
	seqLens := []int64{40, 70, 21}
	perm := rng.Perm(cacheBlocks)
	maxBlocks := 5
	table := make([]int64, 3*maxBlocks)
	k := 0
	for b, s := range seqLens {
		for p := 0; p < maxBlocks; p++ {
			table[b*maxBlocks+p] = -1
			if p*cachePage < int(s) {
				table[b*maxBlocks+p] = int64(perm[k])
				k++
			}
		}
	}
	in := kernel.Inputs{Tensors: map[string]*tensor.Tensor{
		"cache":       cache,
		"block_table": tensor.FromInt64s(tensor.I32, []int{3, maxBlocks}, table),
		"seq_lens":    tensor.FromInt64s(tensor.I32, []int{3}, seqLens),
		"k_scale":     tensor.FromFloat64s(tensor.F32, []int{}, []float64{kScale}),
	}, Params: kernel.Params{"kv_cache_dtype": kind, "page_size": strconv.Itoa(cachePage)}}
	if kind != "fp8_e4m3" {
		delete(in.Tensors, "k_scale")
	}
	var od kernel.OutDTypes
	if out != "" {
		od = kernel.OutDTypes{"gathered": out}
	}
	return evaluate(t, "kv_cache_gather", in, od)
}

func evaluate(t *testing.T, name string, in kernel.Inputs, od kernel.OutDTypes) kernel.Output {
	t.Helper()
	k, err := kernel.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	outs, err := kernel.Evaluate(context.Background(), k, in, kernel.DefaultPrecision(), od)
	if err != nil {
		t.Fatal(err)
	}
	return outs[0]
}

// The planted faults of a cache capture (its expected output materialized,
// then changed in place). e is the entry's or row's length.
var cacheFaults = []struct {
	name  string
	plant func(a *tensor.Tensor, e int)
}{
	{"pass", func(*tensor.Tensor, int) {}},
	// one bit of one value's exponent, where the bulk path would account
	// for it
	{"stray_bit", func(a *tensor.Tensor, e int) { a.Data[(11*e+17)*a.DType.Size()+a.DType.Size()-1] ^= 0x40 }},
	// every entry or row from the third page on holds its successor's
	{"shifted_by_one", func(a *tensor.Tensor, e int) {
		sz := a.DType.Size()
		lo := 2 * cachePage * e * sz
		copy(a.Data[lo:], a.Data[lo+e*sz:(7*cachePage+1)*e*sz])
	}},
	// a NaN where a finite value is expected
	{"nan", func(a *tensor.Tensor, e int) {
		if a.DType == tensor.U8 {
			a.Data[13*e+5] ^= 0xFF // no NaN in bytes
			return
		}
		a.SetFloat64(13*e+5, math.NaN())
	}},
}

// TestCacheFastPathMatchesElementPath: a passing and failing captures of
// kv_cache_write and kv_cache_gather in each layout (bf16, fp16, fp8_e4m3
// as U8 and as F8_E4M3, fp8_ds_mla; DeepSeek-V4's block-split
// fp8_ds_mla_model1, written only) and a gather to F32, F16 and BF16 of
// each: the fast path, which accounts for the settled runs whose bytes
// equal the actual's in bulk, gives the same check, bit for bit (metrics,
// worst elements, signature and profile), as the element path, at
// GOMAXPROCS 1, 2 and 8 (the element path's at 1; under the race detector the fast
// path at 8 only); it did take the bulk path wherever a reference
// vouches for bytes of the actual's dtype; and the faults fail.
func TestCacheFastPathMatchesElementPath(t *testing.T) {
	type tc struct {
		name string
		out  func(*testing.T, *rand.Rand) kernel.Output
		bulk bool // the reference vouches for bytes: some elements in bulk
	}
	var cases []tc
	for _, k := range []struct {
		kind string
		u8   bool
	}{{"bf16", false}, {"fp16", false}, {"fp8_e4m3", true}, {"fp8_e4m3", false}, {"fp8_ds_mla", true}, {"fp8_ds_mla_model1", true}} {
		cases = append(cases, tc{"write/" + k.kind + "/" + map[bool]string{true: "u8", false: "typed"}[k.u8],
			func(t *testing.T, r *rand.Rand) kernel.Output { return cacheWriteOutput(t, r, k.kind, k.u8) }, true})
	}
	// An fp8_e4m3 gather's rows are settled through its code table where
	// the per-tensor scale is a power of two (vLLM's default k_scale is
	// 1.0), not with a scale of 0.02.
	for _, g := range []struct {
		kind string
		out  tensor.DType
		ks   float64
		bulk bool
	}{{"bf16", "", 0.02, true}, {"bf16", tensor.F32, 0.02, false}, {"bf16", tensor.F16, 0.02, false}, {"fp16", "", 0.02, true}, {"fp16", tensor.BF16, 0.02, false},
		{"fp8_e4m3", "", 0.02, false}, {"fp8_ds_mla", "", 0.02, false},
		{"fp8_e4m3", "", 1, true}, {"fp8_e4m3", tensor.F16, 0.5, true}, {"fp8_e4m3", tensor.F32, 1, false}} {
		cases = append(cases, tc{"gather/" + g.kind + "/" + string(g.out) + "/k_scale=" + strconv.FormatFloat(g.ks, 'g', -1, 64),
			func(t *testing.T, r *rand.Rand) kernel.Output { return cacheGatherOutput(t, r, g.kind, g.out, g.ks) }, g.bulk})
	}
	for ci, c := range cases {
		o := c.out(t, rand.New(rand.NewPCG(uint64(ci), 17)))
		e := o.Shape[len(o.Shape)-1]
		for _, f := range cacheFaults {
			actual := kernel.Materialize(o.DType, o.Shape, o.Expected)
			f.plant(actual, e)
			var want []byte
			for _, elementPath := range []bool{true, false} {
				for _, procs := range []int{1, 2, 8} {
					if elementPath && procs > 1 {
						break // the element path at GOMAXPROCS 1 is the yardstick
					}
					if raceEnabled && (elementPath || procs < 8) {
						// The race pass needs the parallel fast path only:
						// the element path runs on one goroutine, where the
						// detector finds nothing, and under it each Compare
						// costs about ten times as much. make test's pass
						// without the detector holds every GOMAXPROCS to
						// the element path's bytes.
						continue
					}
					prev := runtime.GOMAXPROCS(procs)
					ch, err := Compare(o, actual, nil, Options{WorstK: 7, Profile: true, ElementPath: elementPath})
					runtime.GOMAXPROCS(prev)
					if err != nil {
						t.Fatalf("%s %s: %v", c.name, f.name, err)
					}
					got, err := json.Marshal(ch)
					if err != nil {
						t.Fatal(err)
					}
					prof, _ := json.Marshal(ch.Profile)
					got = append(got, prof...)
					if elementPath && ch.bulk != 0 {
						t.Errorf("%s %s: the element path accounted for %d elements in bulk", c.name, f.name, ch.bulk)
					}
					if !elementPath && c.bulk != (ch.bulk > 0) {
						t.Errorf("%s %s: %d of %d elements in bulk; want bulk %v", c.name, f.name, ch.bulk, ch.Metrics.N, c.bulk)
					}
					if (f.name == "pass") != (ch.Verdict == Pass) {
						t.Errorf("%s %s, element path %v, GOMAXPROCS %d: verdict %s (%s)", c.name, f.name, elementPath, procs, ch.Verdict, ch.Reason)
					}
					if want == nil {
						want = got
						continue
					}
					if !bytes.Equal(got, want) {
						t.Errorf("%s %s, element path %v, GOMAXPROCS %d: the check differs from the element path's at GOMAXPROCS 1:\n%s\n%s", c.name, f.name, elementPath, procs, got, want)
					}
				}
			}
		}
	}
}

// TestBulkSquaresMatchElementSquares: the bulk path's decoding and summing
// of a run's squares, for every code of every dtype it takes (the finite
// ones) and every start lane, is the element path's: the same values as
// tensor.Float64At, squared and added lane by lane in index order.
func TestBulkSquaresMatchElementSquares(t *testing.T) {
	for _, d := range []tensor.DType{tensor.BF16, tensor.F16, tensor.F8E4M3, tensor.U8} {
		codes := 1 << (8 * d.Size())
		all := tensor.New(d, codes)
		for c := 0; c < codes; c++ {
			if d.Size() == 2 {
				binary.LittleEndian.PutUint16(all.Data[2*c:], uint16(c))
			} else {
				all.Data[c] = byte(c)
			}
		}
		var finiteCodes []byte
		for c := 0; c < codes; c++ {
			v := all.Float64At(c)
			fin := finite(v)
			if got := allFinite(d, all.Data[c*d.Size():(c+1)*d.Size()]); got != fin {
				t.Fatalf("%s code %#x (%v): allFinite %v", d, c, v, got)
			}
			if fin {
				finiteCodes = append(finiteCodes, all.Data[c*d.Size():(c+1)*d.Size()]...)
			}
		}
		n := len(finiteCodes) / d.Size()
		vals := &tensor.Tensor{DType: d, Shape: []int{n}, Data: finiteCodes}
		for i0 := 0; i0 < 4; i0++ {
			for _, cut := range []int{0, 1, 3, 7, n} {
				var got, want [4]float64
				bulkSquares(d, finiteCodes[:cut*d.Size()], i0, &got)
				for k := 0; k < cut; k++ {
					v := vals.Float64At(k)
					want[(i0+k)&3] += v * v
				}
				if got != want {
					t.Errorf("%s, %d codes from lane %d: bulk %v, element by element %v", d, cut, i0, got, want)
				}
			}
		}
	}
	if formats.BF16Decode(0x3F80) != 1 {
		t.Fatal("bf16 decoding")
	}
}
