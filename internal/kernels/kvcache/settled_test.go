package kvcache

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/kvcache"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// TestSettledVouchesForItsValues: wherever the cache outputs' references
// vouch for a run of their values by bytes (kernel.Settler), those bytes,
// decoded in the dtype they name, are the values ReadBlock reads (bit for
// bit where finite, the same special value where not), over caches that
// hold every 16-bit code (subnormals, -0, infinities, NaNs with payloads)
// or every byte; runs are 1 to n values long; and they vouch exactly where
// the references are bytes of the capture: every entry of cache_after no
// token was written to (whole blocks of DeepSeek-V4's block-split cache)
// and, in a bf16 or fp16 cache, every entry written
// from tokens of its dtype (not from f32 ones), every written entry of an
// fp8_e4m3 or fp8_ds_mla cache (its computed bytes), every row of a bf16 or
// fp16 gather (exact, and
// expected when stored as the cache's dtype or F32), and nothing else.
func TestSettledVouchesForItsValues(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 70))
	const nb, p = 8, 16
	for _, kind := range []string{"bf16", "fp16", "fp8_e4m3", "fp8_ds_mla", "fp8_ds_mla_model1"} {
		l := 512
		e := l + 64
		switch kind {
		case "fp8_ds_mla":
			e = 656
		case "fp8_ds_mla_model1":
			l, e = kvcache.M1Nope, kvcache.M1EntryBytes
		}
		cd := map[string]tensor.DType{"bf16": tensor.BF16, "fp16": tensor.F16}[kind]
		if cd == "" {
			cd = tensor.U8
		}
		before := tensor.New(cd, nb, p, e)
		if cd.Size() == 2 { // every code once, then random ones
			for i := 0; i < before.Len(); i++ {
				binary.LittleEndian.PutUint16(before.Data[2*i:], uint16(i))
				if i >= 1<<16 {
					binary.LittleEndian.PutUint16(before.Data[2*i:], uint16(rng.Uint32()))
				}
			}
		} else {
			for i := range before.Data {
				before.Data[i] = byte(i * 7)
			}
		}
		slots := []int64{0, 5, 6, 7, 40, -1, 41, 100, 127}
		written := 8
		kv := make([]float64, len(slots)*l)
		for i := range kv {
			kv[i] = rng.NormFloat64()
		}
		conv := "amax"
		if kind == "fp8_ds_mla_model1" {
			conv = "pow2"
		}
		in := writeInputs(kind, conv, before, kv, l, slots, 0.03)
		if cd == tensor.F16 {
			in.Tensors["kv_c"] = tensor.FromFloat64s(tensor.F16, []int{len(slots), l}, kv)
			in.Tensors["k_pe"] = tensor.FromFloat64s(tensor.F16, []int{len(slots), 64}, make([]float64, len(slots)*64))
		}
		if kind != "fp8_e4m3" {
			delete(in.Tensors, "k_scale")
		}
		k, _ := Lookup("kv_cache_write")
		outs, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil)
		if err != nil {
			t.Fatal(err)
		}
		// Unwritten entries, and written ones where they are copies of
		// tokens of the cache's dtype (an f32 token is rounded) or bytes
		// computed from them (the fp8 layouts' codes and scales).
		want := (nb*p - written) * e
		switch kind {
		case "bf16", "fp16", "fp8_e4m3", "fp8_ds_mla":
			want = nb * p * e
		case "fp8_ds_mla_model1": // whole blocks: 1, 3, 4 and 5 hold no written slot
			want = 4 * p * e
		}
		vouched(t, kind+" cache_after", outs[0], want, want)
		if kind == "bf16" || kind == "fp16" {
			in.Tensors["kv_c"] = tensor.FromFloat64s(tensor.F32, []int{len(slots), l}, kv)
			f32, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil)
			if err != nil {
				t.Fatal(err)
			}
			vouched(t, kind+" cache_after from f32 tokens", f32[0], (nb*p-written)*e, (nb*p-written)*e)
		}

		if kind == "fp8_ds_mla_model1" {
			continue // kv_cache_gather refuses a block-split cache
		}
		g, _ := Lookup("kv_cache_gather")
		table := []int64{3, 0, 6, 1, 7, 2}
		gin := Inputs{Tensors: map[string]*tensor.Tensor{
			"cache":       before,
			"block_table": tensor.FromInt64s(tensor.I32, []int{2, 3}, table),
			"seq_lens":    tensor.FromInt64s(tensor.I32, []int{2}, []int64{40, 33}),
			"k_scale":     tensor.FromFloat64s(tensor.F32, []int{}, []float64{0.03}),
		}, Params: Params{"kv_cache_dtype": kind}}
		if kind != "fp8_e4m3" {
			delete(gin.Tensors, "k_scale")
		}
		scales := []float64{0.03}
		if kind == "fp8_e4m3" {
			scales = []float64{0.03, 1, 0.5, 4}
		}
		for _, ks := range scales {
			gin.Tensors["k_scale"] = tensor.FromFloat64s(tensor.F32, []int{}, []float64{ks})
			if kind != "fp8_e4m3" {
				delete(gin.Tensors, "k_scale")
			}
			if ks != 0.03 {
				// no NaN code: every row is one of finite products
				finite := before.Clone()
				for i, c := range finite.Data {
					if c&0x7F == 0x7F {
						finite.Data[i] = c - 1
					}
				}
				gin.Tensors["cache"] = finite
			}
			for _, out := range []tensor.DType{tensor.BF16, tensor.F16, tensor.F32} {
				gouts, err := Evaluate(context.Background(), g, gin, DefaultPrecision(), OutDTypes{"gathered": out})
				if err != nil {
					t.Fatal(err)
				}
				o := gouts[0]
				// The fp8 layouts' values are products with a scale: with a
				// per-tensor power of two (fp8_e4m3) every finite code's
				// product is a 16-bit value exactly, and every row (of
				// finite codes) is settled as those codes; with 0.03 none
				// is. A
				// 16-bit cache's are its bytes' exactly, and as expected
				// unless the dst is the other 16-bit dtype (a rounding).
				wantExact, wantExpected := 0, 0
				switch {
				case cd.Size() == 2:
					wantExact = o.Exact.Len()
					if out == cd || out == tensor.F32 {
						wantExpected = wantExact
					}
				case ks != 0.03 && out != tensor.F32:
					wantExact, wantExpected = o.Exact.Len(), o.Exact.Len()
				}
				vouched(t, fmt.Sprintf("%s (k_scale %g) gathered as %s", kind, ks, out), o, wantExact, wantExpected)
			}
		}
	}
}

// vouched holds o's references' Settled runs to their values, and the
// number of values each vouches for to wantExact and wantExpected.
func vouched(t *testing.T, name string, o Output, wantExact, wantExpected int) {
	t.Helper()
	n := o.Exact.Len()
	for _, ref := range []struct {
		side string
		v    Values
		want int
	}{{"exact", o.Exact, wantExact}, {"expected", o.Expected, wantExpected}} {
		s, ok := ref.v.(Settler)
		if !ok {
			t.Fatalf("%s: the %s reference is not a Settler", name, ref.side)
		}
		for _, step := range []int{1, 700, 4096, n} {
			got := 0
			vals := make([]float64, step)
			for lo := 0; lo < n; {
				d, b, m := s.Settled(lo, min(step, n-lo))
				if m < 1 || m > min(step, n-lo) {
					t.Fatalf("%s %s: Settled(%d, %d) returns a run of %d", name, ref.side, lo, min(step, n-lo), m)
				}
				if b != nil {
					if len(b) != m*d.Size() {
						t.Fatalf("%s %s: a run of %d %s values in %d bytes", name, ref.side, m, d, len(b))
					}
					enc := &tensor.Tensor{DType: d, Shape: []int{m}, Data: b}
					ReadBlock(ref.v, lo, vals[:m])
					for k := 0; k < m; k++ {
						a, w := enc.Float64At(k), vals[k]
						if math.Float64bits(a) != math.Float64bits(w) && !(math.IsNaN(a) && math.IsNaN(w)) {
							t.Fatalf("%s %s: element %d is %v (%#x); its bytes say %v", name, ref.side, lo+k, w, math.Float64bits(w), a)
						}
					}
					got += m
				}
				lo += m
			}
			if got != ref.want {
				t.Errorf("%s %s, runs of at most %d: %d values vouched for, want %d", name, ref.side, step, got, ref.want)
			}
		}
	}
}
