package dsa

import (
	"context"
	"encoding/binary"
	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/signature"

	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// dsaInputs is the 2-head example of reference/dsa's hand test with a fourth
// token k3 = (0, 0.5) at block 0 offset 1, so that
//
//	t0 = 0.5*2 = 1, t1 = 2*3 = 6, t2 = 0.5*1 + 2*2 = 4.5,
//	t3: q0·k3 = -0.5 -> 0, q1·k3 = 1.5: 2*1.5 = 3
func dsaInputs() Inputs {
	return Inputs{Tensors: map[string]*tensor.Tensor{
		"q":           tensor.FromFloat64s(tensor.BF16, []int{1, 2, 2}, []float64{2, -1, -1, 3}),
		"k_cache":     tensor.FromFloat64s(tensor.BF16, []int{2, 2, 2}, []float64{1, 1, 0, 0.5, 1, 0, 0, 1}),
		"weights":     tensor.FromFloat64s(tensor.F32, []int{1, 2}, []float64{0.5, 2}),
		"block_table": tensor.FromInt64s(tensor.I32, []int{1, 3}, []int64{1, 0, -1}),
		"seq_lens":    tensor.FromInt64s(tensor.I32, []int{1}, []int64{4}),
	}, Params: Params{"topk": "2", "max_seq": "6"}}
}

func TestDSAIndexer(t *testing.T) {
	k, err := Lookup("dsa_indexer")
	if err != nil {
		t.Fatal(err)
	}
	outs, err := Evaluate(context.Background(), k, dsaInputs(), DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	sc, top := outs[0], outs[1]
	want := []float64{1, 6, 4.5, 3, math.Inf(-1), math.Inf(-1)}
	for i, w := range want {
		if sc.Expected.At(i) != w || sc.Exact.At(i) != w {
			t.Errorf("scores[0,%d] = %v / %v, want %v", i, sc.Expected.At(i), sc.Exact.At(i), w)
		}
	}
	if top.Expected.At(0) != 1 || top.Expected.At(1) != 2 || top.Mode != Bitwise || top.DType != tensor.I32 {
		t.Errorf("topk %v (%v %s), want [1 2] Bitwise I32", top.Expected, top.Mode, top.DType)
	}
	// order is free: [2 1] is the same set; 3 (score 3 < 4.5) is not in it.
	for _, c := range []struct {
		i      int
		actual float64
		want   bool
	}{{0, 2, true}, {1, 1, true}, {1, 3, false}, {1, -1, false}, {0, 4, false}} {
		if got := top.Equivalent(c.i, c.actual); got != c.want {
			t.Errorf("topk[0,%d] = %v: Equivalent %v, want %v", c.i, c.actual, got, c.want)
		}
	}
	// token 3 is block 0 offset 1 of page 1
	cs := sc.Coords.Name([]int{0, 3})
	if cs[2] != (Coord{Kind: "page", Value: 1}) || cs[3] != (Coord{Kind: "page_offset", Value: 1}) || cs[4] != (Coord{Kind: "block", Value: 0}) {
		t.Errorf("coords of token 3: %v", cs)
	}

	// topk and max_seq from the captured outputs when the parameters are absent
	in := dsaInputs()
	in.Params = Params{}
	in.Tensors["scores"] = tensor.New(tensor.F32, 1, 5)
	in.Tensors["topk_indices"] = tensor.New(tensor.I32, 1, 3)
	outs, err = Evaluate(context.Background(), k, in, DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if outs[0].Shape[1] != 5 || outs[1].Shape[1] != 3 {
		t.Errorf("shapes %v %v, want [1 5] [1 3]", outs[0].Shape, outs[1].Shape)
	}
	delete(in.Tensors, "topk_indices")
	if _, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil); err == nil || !strings.Contains(err.Error(), "parameter topk is missing") {
		t.Errorf("no topk: %v", err)
	}
	in = dsaInputs()
	in.Tensors["block_table"] = tensor.FromInt64s(tensor.I32, []int{1, 3}, []int64{1, 7, -1})
	if _, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil); err == nil || !strings.Contains(err.Error(), "block_table[0,1] = 7 is outside the cache (NB = 2)") {
		t.Errorf("block outside: %v", err)
	}
}

// The hand example above in vLLM's fp8 indexer cache (each block: its P·Dk
// e4m3 codes, then its P F32 scales; vllm 0.33.0
// vllm/v1/attention/ops/rocm_aiter_mla_sparse.py:462-479), every key
// stored as codes·scale with a different scale, and an fp8 q: the same
// scores, exactly, by the scale-after-the-head-sum formulation of vLLM's
// kernel. The bytes are laid out here by hand from that layout.
func TestDSAIndexerFP8Cache(t *testing.T) {
	e4m3 := map[float64]byte{0: 0x00, 0.25: 0x28, 0.5: 0x30, 1: 0x38, 4: 0x48}
	block := func(k0, k1 [2]float64, s0, s1 float32) []byte {
		b := []byte{e4m3[k0[0]], e4m3[k0[1]], e4m3[k1[0]], e4m3[k1[1]]}
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(s0))
		return binary.LittleEndian.AppendUint32(b, math.Float32bits(s1))
	}
	// block 0: t2 = (1, 1)·1, t3 = (0, 1)·0.5; block 1: t0 = (4, 0)·0.25, t1 = (0, 0.5)·2
	data := append(block([2]float64{1, 1}, [2]float64{0, 1}, 1, 0.5), block([2]float64{4, 0}, [2]float64{0, 0.5}, 0.25, 2)...)
	for _, qd := range []tensor.DType{tensor.BF16, tensor.F8E4M3} {
		in := dsaInputs()
		in.Tensors["k_cache"] = &tensor.Tensor{DType: tensor.U8, Shape: []int{2, 2, 6}, Data: data}
		in.Tensors["q"] = tensor.FromFloat64s(qd, []int{1, 2, 2}, []float64{2, -1, -1, 3})
		in.Params["k_cache_dtype"] = "fp8_e4m3"
		k, _ := Lookup("dsa_indexer")
		outs, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil)
		if err != nil {
			t.Fatal(err)
		}
		want := []float64{1, 6, 4.5, 3, math.Inf(-1), math.Inf(-1)}
		for i, w := range want {
			if outs[0].Expected.At(i) != w || outs[0].Exact.At(i) != w {
				t.Errorf("q %s: score %d = %v / %v, want %v", qd, i, outs[0].Exact.At(i), outs[0].Expected.At(i), w)
			}
		}
		read, err := indexerRows(in)
		if err != nil {
			t.Fatal(err)
		}
		for i := range data {
			if !read(i) {
				t.Errorf("byte %d of the cache is read by an attended token but Read says not", i)
			}
		}
	}
	// a token no request reads: its codes and scale are free
	in := dsaInputs()
	in.Tensors["k_cache"] = &tensor.Tensor{DType: tensor.U8, Shape: []int{2, 2, 6}, Data: data}
	in.Tensors["seq_lens"] = tensor.FromInt64s(tensor.I32, []int{1}, []int64{3}) // t3 = block 0, offset 1 unread
	in.Params["k_cache_dtype"] = "fp8_e4m3"
	read, err := indexerRows(in)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range map[int]bool{0: true, 1: true, 2: false, 3: false, 4: true, 8: false, 11: false, 12: true, 23: true} {
		if read(i) != want {
			t.Errorf("byte %d: read %v, want %v", i, read(i), want)
		}
	}
	// the shape names the layout
	in.Tensors["k_cache"] = tensor.New(tensor.U8, 2, 2, 2)
	k, _ := Lookup("dsa_indexer")
	if _, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil); err == nil || !strings.Contains(err.Error(), "an fp8 indexer cache is U8 [NB, P = 2, Dk + 4 = 6]") {
		t.Errorf("misshapen fp8 cache: error %v", err)
	}
}

// TestDSAIndexerFP16: an fp16 model's query and key cache (k_cache_dtype
// fp16, or auto) give the hand example's scores (every value is exact in
// fp16), and mixing an F16 query with a BF16 cache is read as stored; an
// F32 cache, or a k_cache_dtype the tensor does not have, is refused by
// name.
func TestDSAIndexerFP16(t *testing.T) {
	k, _ := Lookup("dsa_indexer")
	want := []float64{1, 6, 4.5, 3, math.Inf(-1), math.Inf(-1)}
	for _, c := range []struct {
		q, cache tensor.DType
		kind     string
	}{{tensor.F16, tensor.F16, "fp16"}, {tensor.F16, tensor.BF16, "bf16"}, {tensor.BF16, tensor.F16, "auto"}, {tensor.F16, tensor.F16, "auto"}} {
		in := dsaInputs()
		in.Params["k_cache_dtype"] = c.kind
		for name, d := range map[string]tensor.DType{"q": c.q, "k_cache": c.cache} {
			src := in.Tensors[name]
			in.Tensors[name] = tensor.FromFloat64s(d, src.Shape, src.Float64s())
		}
		outs, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil)
		if err != nil {
			t.Fatalf("q %s, k_cache %s: %v", c.q, c.cache, err)
		}
		for i, w := range want {
			if outs[0].Expected.At(i) != w || outs[0].Exact.At(i) != w {
				t.Errorf("q %s, k_cache %s: scores[0,%d] = %v / %v, want %v", c.q, c.cache, i, outs[0].Expected.At(i), outs[0].Exact.At(i), w)
			}
		}
	}
	for _, c := range []struct {
		cache *tensor.Tensor
		kind  string
		want  string
	}{
		{tensor.New(tensor.F32, 2, 2, 2), "bf16", "tensor k_cache has dtype F32; the contract wants BF16 or F16 or U8"},
		{tensor.New(tensor.F16, 2, 2, 2), "bf16", "tensor k_cache has dtype F16; k_cache_dtype bf16 stores BF16"},
		{tensor.New(tensor.U8, 2, 2, 6), "auto", "parameter k_cache_dtype = auto means the cache's own dtype (BF16 or F16), but tensor k_cache is U8"},
	} {
		in := dsaInputs()
		in.Tensors["k_cache"] = c.cache
		in.Params["k_cache_dtype"] = c.kind
		if _, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("a %s k_cache as %s: %v, want an error containing %q", c.cache.DType, c.kind, err, c.want)
		}
	}
}

// nextNInputs is the hand example as an MTP step of next_n = 2 whose two
// query rows repeat q and w: row 0 is the query at position 2 and sees
// t0..t2 (scores 1, 6, 4.5), row 1 at position 3 sees all four (t3 = 3).
func nextNInputs(topkIndex string) Inputs {
	in := dsaInputs()
	in.Tensors["q"] = tensor.FromFloat64s(tensor.BF16, []int{2, 2, 2}, []float64{2, -1, -1, 3, 2, -1, -1, 3})
	in.Tensors["weights"] = tensor.FromFloat64s(tensor.F32, []int{2, 2}, []float64{0.5, 2, 0.5, 2})
	in.Params = Params{"topk": "3", "max_seq": "4", "next_n": "2", "topk_index": topkIndex}
	return in
}

// TestDSAIndexerNextN: row 0 of an MTP step scores only the tokens up to
// its own position and keeps t0 where row 1 keeps t3; as global slots
// (block_table [1 0], P = 2: t0 = 2, t1 = 3, t2 = 0, t3 = 1) a slot is
// judged as the token it holds, and the suspect an indexer without the
// causal limit leaves is offered to the signature.
func TestDSAIndexerNextN(t *testing.T) {
	k, _ := Lookup("dsa_indexer")
	inf := math.Inf(-1)
	for _, c := range []struct {
		index string
		top   []float64
		// (row, value, accepted)
		judge [][3]float64
	}{
		{"request", []float64{1, 2, 0, 1, 2, 3}, [][3]float64{{0, 3, 0}, {0, 0, 1}, {1, 3, 1}, {1, 0, 0}, {0, -1, 0}}},
		{"global_slot", []float64{3, 0, 2, 3, 0, 1}, [][3]float64{{0, 1, 0}, {0, 2, 1}, {1, 1, 1}, {1, 2, 0}, {0, 5, 0}, {1, -1, 0}}},
	} {
		outs, err := Evaluate(context.Background(), k, nextNInputs(c.index), DefaultPrecision(), nil)
		if err != nil {
			t.Fatal(err)
		}
		sc, top := outs[0], outs[1]
		for i, w := range []float64{1, 6, 4.5, inf, 1, 6, 4.5, 3} {
			if sc.Expected.At(i) != w || sc.Exact.At(i) != w {
				t.Errorf("%s: scores[%d,%d] = %v / %v, want %v", c.index, i/4, i%4, sc.Expected.At(i), sc.Exact.At(i), w)
			}
		}
		for i, w := range c.top {
			if top.Expected.At(i) != w || top.Exact.At(i) != w {
				t.Errorf("%s: topk[%d,%d] = %v / %v, want %v", c.index, i/3, i%3, top.Expected.At(i), top.Exact.At(i), w)
			}
		}
		for _, j := range c.judge {
			if got := top.Equivalent(int(j[0])*3, j[1]); got != (j[2] == 1) {
				t.Errorf("%s: row %v entry %v: accepted %v, want %v", c.index, j[0], j[1], got, j[2] == 1)
			}
		}
		// the suspect: row 0 sees t3 (3 < 4.5, so its top-3 becomes 1 2 3)
		if len(sc.Suspects) != 1 || sc.Suspects[0].Values.At(3) != 3 || len(top.Suspects) != 1 {
			t.Fatalf("%s: suspects %v / %v, want one each", c.index, sc.Suspects, top.Suspects)
		}
		if sus, want := top.Suspects[0].Values.At(2), c.top[5]; sus != want {
			t.Errorf("%s: the suspect's topk[0,2] = %v, want %v (row 0 picks its future t3)", c.index, sus, want)
		}
		if cs := sc.Coords.Name([]int{1, 3}); cs[len(cs)-1] != (Coord{Kind: KindQPos, Value: 1}) {
			t.Errorf("%s: coords of row 1: %v, want q_pos 1 last", c.index, cs)
		}
	}
	// next_n = 1 has no suspect (there is no future to see)
	outs, err := Evaluate(context.Background(), k, dsaInputs(), DefaultPrecision(), nil)
	if err != nil || len(outs[0].Suspects)+len(outs[1].Suspects) != 0 {
		t.Errorf("next_n 1: suspects %v (%v)", outs, err)
	}
	for _, c := range []struct {
		name, param, value, want string
	}{
		{"next_n 0", "next_n", "0", "parameter next_n = 0: want at least 1"},
		{"next_n 3", "next_n", "3", "tensor q has 2 rows but seq_lens has 1 requests of next_n = 3 queries (3 rows)"},
		{"next_n 1", "next_n", "1", "tensor seq_lens has 1 entries but q has 2 rows (next_n = 1"},
		{"next_n text", "next_n", "two", "next_n"},
		{"topk_index", "topk_index", "slots", "topk_index"},
	} {
		in := nextNInputs("request")
		in.Params[c.param] = c.value
		if _, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", c.name, err, c.want)
		}
	}
}

// TestSuspectPatternIsDeclared: the suspect's pattern is one the signature
// package names (dsa.go cannot import it: its tests register every family).
func TestSuspectPatternIsDeclared(t *testing.T) {
	if !slices.Contains(signature.SuspectPatterns, futureTokensVisible) {
		t.Errorf("%q is not in signature.SuspectPatterns %v", futureTokensVisible, signature.SuspectPatterns)
	}
}

// TestDSAIndexerScaleFmt: the generator writes the fp8 cache in the
// declared convention (amax when none is declared) and the reader judges
// it under each: a cache is accepted under its own writer and under any,
// refused by name under the other; k_scale_fmt on a 16-bit cache is
// refused.
func TestDSAIndexerScaleFmt(t *testing.T) {
	k, _ := Lookup("dsa_indexer")
	gen := k.(Generator)
	for _, writer := range []string{"any", "amax", "ue8m0"} {
		c := Case{Name: "t", Kernel: "dsa_indexer", Seed: 3, Heads: 4,
			Geometry: Geometry{PageSize: 16, TopK: 8, SeqLens: Contexts{List: []int64{20, 33}}},
			Params:   Params{"k_cache_dtype": "fp8_e4m3", "k_scale_fmt": writer, "topk": "8"}}
		ts, err := gen.Generate(context.Background(), c, NewRNG(c.Seed, 0))
		if err != nil {
			t.Fatal(err)
		}
		written := map[string]string{"any": "amax"}[writer]
		if written == "" {
			written = writer
		}
		for _, read := range []string{"any", "amax", "ue8m0"} {
			in := Inputs{Tensors: ts, Params: Params{"k_cache_dtype": "fp8_e4m3", "k_scale_fmt": read, "topk": "8"}}
			_, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil)
			if ok := read == "any" || read == written; ok != (err == nil) {
				t.Errorf("written %s (%s), read as %s: error %v", writer, written, read, err)
			} else if err != nil && !strings.Contains(err.Error(), "tensor k_cache: request 0 token 0") {
				t.Errorf("written %s, read as %s: %v does not name the first token", writer, read, err)
			}
		}
	}
	in := dsaInputs()
	in.Params["k_scale_fmt"] = "ue8m0"
	if _, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil); err == nil || !strings.Contains(err.Error(), "k_cache_dtype = bf16 has no scales") {
		t.Errorf("k_scale_fmt on a bf16 cache: %v", err)
	}
}

// TestDSAIndexerPerRowLens: seq_lens [B, next_n], vLLM's per-row lengths
// (CTX_PER_ROW, vllm 0.33.0 rocm_aiter_mla_sparse.py:577-578; the top-k's
// row ends when seq_lens has a value per row, indexer_topk.py:288-289).
// The causal lengths [3 4] give exactly the outputs of seq_lens [4] with
// next_n 2; [2 4] shorten row 0 further (the request's pages hold its
// longest row); a width other than next_n is refused.
func TestDSAIndexerPerRowLens(t *testing.T) {
	k, _ := Lookup("dsa_indexer")
	base, err := Evaluate(context.Background(), k, nextNInputs("global_slot"), DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	in := nextNInputs("global_slot")
	in.Tensors["seq_lens"] = tensor.FromInt64s(tensor.I32, []int{1, 2}, []int64{3, 4})
	rows, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for o := range base {
		for i := 0; i < base[o].Expected.Len(); i++ {
			if a, b := rows[o].Expected.At(i), base[o].Expected.At(i); a != b {
				t.Errorf("%s[%d]: per-row %v, derived %v", base[o].Name, i, a, b)
			}
		}
	}
	read, err := indexerRows(in)
	if err != nil || !read(0) {
		t.Errorf("Read with per-row seq_lens: %v", err)
	}
	in.Tensors["seq_lens"] = tensor.FromInt64s(tensor.I32, []int{1, 2}, []int64{2, 4})
	outs, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	inf := math.Inf(-1)
	for i, w := range []float64{1, 6, inf, inf, 1, 6, 4.5, 3} {
		if outs[0].Expected.At(i) != w {
			t.Errorf("seq_lens [[2 4]]: scores[%d,%d] = %v, want %v", i/4, i%4, outs[0].Expected.At(i), w)
		}
	}
	// row 0 sees 2 tokens of a top-3: one -1 pad (t0 = slot 2, t1 = slot 3)
	if got := []float64{outs[1].Expected.At(0), outs[1].Expected.At(1), outs[1].Expected.At(2)}; got[0] != 3 || got[1] != 2 || got[2] != -1 {
		t.Errorf("seq_lens [[2 4]]: row 0 top-3 slots %v, want [3 2 -1]", got)
	}
	in.Tensors["seq_lens"] = tensor.FromInt64s(tensor.I32, []int{1, 3}, []int64{2, 3, 4})
	if _, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil); err == nil || !strings.Contains(err.Error(), "per-row lengths are an integer [B, next_n = 2]") {
		t.Errorf("seq_lens [1 3] with next_n 2: %v", err)
	}
}
