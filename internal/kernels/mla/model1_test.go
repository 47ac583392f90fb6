package mla

import (
	"context"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	. "github.com/kcheck-dev/kcheck/internal/kernel"
	_ "github.com/kcheck-dev/kcheck/internal/kernels/kvcache" // kv_cache_gather, refused below
	_ "github.com/kcheck-dev/kcheck/internal/kernels/transfer"
	"github.com/kcheck-dev/kcheck/internal/signature"
	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/kvcache"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// model1Inputs is a DeepSeek-V4 sparse decode: B = 1, H = 64 heads (one of
// FlashMLA's two, audit F11), d_qk = 512, a fp8_ds_mla_model1 cache of nb
// blocks of p tokens written by the kv_cache_write reference, topk indices
// with -1 padding (FlashMLA's only invalid index, audit F10/F15). It returns
// the tokens' bf16 values [slots, 512] too.
func model1Inputs(t *testing.T, rng *rand.Rand, nb, p, topk int) (Inputs, []float64) {
	t.Helper()
	return v4Inputs(t, rng, kvcache.FP8DSMLAModel1, nb, p, topk)
}

// v4Inputs is model1Inputs over either DeepSeek-V4 cache kind.
func v4Inputs(t *testing.T, rng *rand.Rand, kind kvcache.Kind, nb, p, topk int) (Inputs, []float64) {
	t.Helper()
	const d = kvcache.M1Nope + kvcache.M1Rope
	slots := nb * p
	tok := make([]float64, slots*d)
	for i := range tok {
		tok[i] = formats.RoundBF16(rng.NormFloat64() * math.Ldexp(1, i/64%5-2))
	}
	nope, rope := make([]float64, 0, slots*kvcache.M1Nope), make([]float64, 0, slots*kvcache.M1Rope)
	sm := make([]int64, slots)
	for s := 0; s < slots; s++ {
		nope = append(nope, tok[s*d:s*d+kvcache.M1Nope]...)
		rope = append(rope, tok[s*d+kvcache.M1Nope:(s+1)*d]...)
		sm[s] = int64(s)
	}
	lay, err := kvcache.NewLayout(kind, kvcache.M1Nope, kvcache.M1Rope, p)
	if err != nil {
		t.Fatal(err)
	}
	w, err := kvcache.Write(tensor.New(tensor.U8, nb, p, lay.EntrySize()),
		tensor.FromFloat64s(tensor.BF16, []int{slots, kvcache.M1Nope}, nope),
		tensor.FromFloat64s(tensor.BF16, []int{slots, kvcache.M1Rope}, rope), sm, lay, 0)
	if err != nil {
		t.Fatal(err)
	}
	idx := make([]int64, topk)
	for i, s := range rng.Perm(slots)[:topk-3] {
		idx[i] = int64(s)
	}
	idx[topk-3], idx[topk-2], idx[topk-1] = -1, -1, -1
	q := make([]float64, 64*d)
	for i := range q {
		q[i] = formats.RoundBF16(rng.NormFloat64())
	}
	return Inputs{
		Tensors: map[string]*tensor.Tensor{
			"q":        tensor.FromFloat64s(tensor.BF16, []int{1, 1, 64, d}, q),
			"kv_cache": w.After,
			"indices":  tensor.FromInt64s(tensor.I32, []int{1, 1, topk}, idx),
		},
		// DeepSeek-V4's softmax scale is head_dim^-0.5 (vllm 0.33.0
		// vllm/models/deepseek_v4/attention.py:244)
		Params: Params{"softmax_scale": "0.04419417382415922", "kv_cache_dtype": string(kind), "invalid_index": "minus_one"},
	}, tok
}

// TestMLADecodeSparseModel1: over a DeepSeek-V4 cache the sparse decode's
// out is [B, s_q, H, 512], the whole entry (head_dim_v's default there, as
// FlashMLA's tests/ref.py:90 with d_v = d_qk = 512), and its exact answer is
// the plain float64 softmax attention over the dequantized rows, written
// here with none of the engine's blocking (the reader itself is held to
// FlashMLA's bytes in reference/kvcache). The rope columns 448..511 carry
// real values: planting V = L (head_dim_v's default taken from the latent
// width, as for V3.2) fails on the shape, [1 1 64 448].
func TestMLADecodeSparseModel1(t *testing.T) {
	for _, kind := range []kvcache.Kind{kvcache.FP8DSMLAModel1, kvcache.FP8DSMLAV41} {
		t.Run(string(kind), func(t *testing.T) { testSparseV4(t, kind) })
	}
}

func testSparseV4(t *testing.T, kind kvcache.Kind) {
	rng := rand.New(rand.NewPCG(44, 8))
	const nb, p, topk = 3, 5, 12
	in, _ := v4Inputs(t, rng, kind, nb, p, topk)
	k, _ := Lookup("mla_decode_sparse")
	outs, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	out := outputNamed(t, outs, "out")
	if want := []int{1, 1, 64, 512}; !slices.Equal(out.Shape, want) {
		t.Fatalf("out has shape %v, want %v (V = the whole 512-dim entry)", out.Shape, want)
	}
	lay, _ := kvcache.NewLayout(kind, kvcache.M1Nope, kvcache.M1Rope, p)
	c, err := kvcache.New(in.Tensors["kv_cache"], lay, 0)
	if err != nil {
		t.Fatal(err)
	}
	const d = 512
	q := in.Tensors["q"].Float64s()
	idx := in.Tensors["indices"].Float64s()
	row := make([]float64, d)
	for h := 0; h < 64; h++ {
		var rows [][]float64
		var s []float64
		mx := math.Inf(-1)
		for _, v := range idx {
			if v < 0 {
				continue
			}
			c.RowSlot(int(v), row, tensor.F64)
			dot := 0.0
			for j := range row {
				dot += q[h*d+j] * row[j]
			}
			s = append(s, 0.04419417382415922*dot)
			mx = math.Max(mx, s[len(s)-1])
			rows = append(rows, append([]float64(nil), row...))
		}
		sum := 0.0
		for j := range s {
			s[j] = math.Exp(s[j] - mx)
			sum += s[j]
		}
		ropeSeen := false
		for col := 0; col < d; col++ {
			want := 0.0
			for j, r := range rows {
				want += s[j] / sum * r[col]
			}
			got := out.Exact.At(h*d + col)
			if math.Abs(got-want) > 1e-12*math.Max(1, math.Abs(want)) {
				t.Fatalf("head %d column %d: exact out %v, plain softmax attention %v", h, col, got, want)
			}
			ropeSeen = ropeSeen || col >= kvcache.M1Nope && got != 0
		}
		if !ropeSeen {
			t.Fatalf("head %d: the rope columns of out are all zero", h)
		}
		lse := outputNamed(t, outs, "lse").Exact.At(h)
		if want := mx + math.Log(sum); math.Abs(lse-want) > 1e-12*math.Abs(want) {
			t.Fatalf("head %d: exact lse %v, want %v", h, lse, want)
		}
	}
	if coords := out.Coords.Name([]int{0, 0, 3, 470}); !hasCoord(coords, Coord{Kind: KindPart, Value: int(kvcache.PartRope)}) {
		t.Errorf("out[0,0,3,470] coordinates %v: want part = rope", coords)
	}
	// head_dim_v = 448 is V3.2's convention: declared, it is honoured.
	in.Params["head_dim_v"] = "448"
	outs, err = Evaluate(context.Background(), k, in, DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := outputNamed(t, outs, "out").Shape; got[3] != 448 {
		t.Errorf("head_dim_v = 448: out has shape %v", got)
	}
	in.Params["head_dim_v"] = "513"
	if _, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil); err == nil || !strings.Contains(err.Error(), "head_dim_v = 513") {
		t.Errorf("head_dim_v = 513: error %v, want one naming it", err)
	}
}

// TestModel1SuspectDeclared: a DeepSeek-V4 decode carries the suspect of a
// token-by-token read, under a pattern internal/signature declares, and it
// differs from the correct answer (else it would explain nothing); pages of
// one token carry none, since both addressings are then the same bytes.
func TestModel1SuspectDeclared(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 1))
	in, _ := model1Inputs(t, rng, 3, 4, 10)
	k, _ := Lookup("mla_decode_sparse")
	outs, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	out := outputNamed(t, outs, "out")
	if len(out.Suspects) != 1 || !slices.Contains(signature.SuspectPatterns, out.Suspects[0].Pattern) {
		t.Fatalf("suspects %+v: want one, of a declared pattern (%v)", out.Suspects, signature.SuspectPatterns)
	}
	differ := 0
	for i := 0; i < out.Expected.Len(); i++ {
		if a, b := out.Suspects[0].Values.At(i), out.Expected.At(i); a != b && !(math.IsNaN(a) && math.IsNaN(b)) {
			differ++
		}
	}
	if differ < out.Expected.Len()/2 {
		t.Errorf("the suspect differs from the expected out at %d of %d elements: it would not tell the bug apart", differ, out.Expected.Len())
	}
	in1, _ := model1Inputs(t, rng, 8, 1, 6)
	outs, err = Evaluate(context.Background(), k, in1, DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if s := outputNamed(t, outs, "out").Suspects; len(s) != 0 {
		t.Errorf("pages of one token: %d suspects, want none", len(s))
	}
}

// TestModel1RefusedByOtherReaders: every other kernel that takes a cache
// kind says it does not read DeepSeek-V4's cache, naming itself and the
// layout, instead of misreading block-split bytes.
func TestModel1RefusedByOtherReaders(t *testing.T) {
	for _, kind := range []kvcache.Kind{kvcache.FP8DSMLAModel1, kvcache.FP8DSMLAV41} {
		t.Run(string(kind), func(t *testing.T) { testV4Refused(t, kind) })
	}
}

func testV4Refused(t *testing.T, kind kvcache.Kind) {
	rng := rand.New(rand.NewPCG(3, 9))
	in, _ := v4Inputs(t, rng, kind, 2, 4, 6)
	cache := in.Tensors["kv_cache"]
	tables := map[string]*tensor.Tensor{
		"block_table": tensor.FromInt64s(tensor.I32, []int{1, 2}, []int64{1, 0}),
		"seq_lens":    tensor.FromInt64s(tensor.I32, []int{1}, []int64{6}),
	}
	for _, c := range []struct {
		kernel string
		in     Inputs
	}{
		{"mla_decode", Inputs{Tensors: map[string]*tensor.Tensor{"q": in.Tensors["q"], "kv_cache": cache,
			"block_table": tables["block_table"], "seq_lens": tables["seq_lens"]}, Params: Params{"softmax_scale": "0.1", "kv_cache_dtype": string(kind)}}},
		{"kv_cache_gather", Inputs{Tensors: map[string]*tensor.Tensor{"cache": cache,
			"block_table": tables["block_table"], "seq_lens": tables["seq_lens"]}, Params: Params{"kv_cache_dtype": string(kind)}}},
		{"kv_cache_transfer", Inputs{Tensors: map[string]*tensor.Tensor{"src_cache": cache, "dst_cache_before": cache,
			"src_block_table": tables["block_table"], "dst_block_table": tables["block_table"], "seq_lens": tables["seq_lens"]},
			Params: Params{"kv_cache_dtype": string(kind)}}},
	} {
		k, err := Lookup(c.kernel)
		if err != nil {
			t.Fatal(err)
		}
		_, err = Evaluate(context.Background(), k, c.in, DefaultPrecision(), nil)
		if err == nil || !strings.Contains(err.Error(), "kernel "+c.kernel+" does not read") || !strings.Contains(err.Error(), string(kind)) {
			t.Errorf("%s over fp8_ds_mla_model1: error %v, want one naming the kernel and the layout", c.kernel, err)
		}
	}
}

func hasCoord(cs []Coord, want Coord) bool {
	for _, c := range cs {
		if c == want {
			return true
		}
	}
	return false
}

// TestSparseExtraScope: FlashMLA's extra KV scope through the contract, as
// DeepSeek-V4 passes it (a second cache, its own page size): the answer is
// the decode over both scopes' slots in one softmax, which is the decode of
// one cache holding the same rows, here built by writing the extra scope's
// tokens into spare slots of the first cache and indexing them there. The
// inputs FlashMLA refuses are refused, by name.
func TestSparseExtraScope(t *testing.T) {
	rng := rand.New(rand.NewPCG(12, 34))
	const nb, p, xnb, xp, topk, xtopk = 4, 4, 3, 2, 6, 4
	in, tok := v4Inputs(t, rng, kvcache.FP8DSMLAModel1, nb, p, topk)
	// the extra cache: copies of tokens 0..5 of the first, at slots 5..0
	lay, _ := kvcache.NewLayout(kvcache.FP8DSMLAModel1, kvcache.M1Nope, kvcache.M1Rope, xp)
	n := xnb * xp
	nope, rope := make([]float64, 0, n*kvcache.M1Nope), make([]float64, 0, n*kvcache.M1Rope)
	sm := make([]int64, n)
	for s := 0; s < n; s++ {
		row := tok[s*512 : (s+1)*512]
		nope, rope = append(nope, row[:kvcache.M1Nope]...), append(rope, row[kvcache.M1Nope:]...)
		sm[s] = int64(n - 1 - s)
	}
	w, err := kvcache.Write(tensor.New(tensor.U8, xnb, xp, kvcache.M1EntryBytes),
		tensor.FromFloat64s(tensor.BF16, []int{n, kvcache.M1Nope}, nope), tensor.FromFloat64s(tensor.BF16, []int{n, kvcache.M1Rope}, rope), sm, lay, 0)
	if err != nil {
		t.Fatal(err)
	}
	xidx := []int64{5, -1, 0, 3} // extra slot s holds the first cache's slot n-1-s
	in.Tensors["extra_k_cache"] = w.After
	in.Tensors["extra_indices_in_kvcache"] = tensor.FromInt64s(tensor.I32, []int{1, 1, xtopk}, xidx)
	in.Tensors["extra_topk_length"] = tensor.FromInt64s(tensor.I32, []int{1}, []int64{3}) // slot 3 not attended
	k, _ := Lookup("mla_decode_sparse")
	got, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	// the same rows through one cache: the first cache's own slots, then
	// slots n-1-5 = 0 and n-1-0 = 5 (the extra's 5 and 0, -1 skipped, 3 cut)
	one := Inputs{Tensors: map[string]*tensor.Tensor{"q": in.Tensors["q"], "kv_cache": in.Tensors["kv_cache"]}, Params: in.Params}
	idx := append(in.Tensors["indices"].Float64s()[:0:0], in.Tensors["indices"].Float64s()...)
	var all []int64
	for _, v := range idx {
		all = append(all, int64(v))
	}
	all = append(all, int64(n-1-5), int64(n-1-0))
	one.Tensors["indices"] = tensor.FromInt64s(tensor.I32, []int{1, 1, len(all)}, all)
	want, err := Evaluate(context.Background(), k, one, DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"out", "lse"} {
		g, w := outputNamed(t, got, name), outputNamed(t, want, name)
		for i := 0; i < w.Exact.Len(); i++ {
			if g.Exact.At(i) != w.Exact.At(i) || g.Expected.At(i) != w.Expected.At(i) {
				t.Fatalf("%s[%d]: with the extra scope %v/%v, through one cache %v/%v", name, i, g.Exact.At(i), g.Expected.At(i), w.Exact.At(i), w.Expected.At(i))
			}
		}
	}
	if c := outputNamed(t, got, "out").Coords.Name([]int{0, 0, 0, 0}); !hasCoord(c, Coord{Kind: KindContextLen, Value: len(all) - 3}) {
		t.Errorf("coordinates %v: context_len should count both scopes' attended slots (%d)", c, len(all)-3)
	}
	for _, c := range []struct {
		drop, set string
		t         *tensor.Tensor
		want      string
	}{
		{drop: "extra_k_cache", want: "extra_k_cache is not"},
		{drop: "extra_indices_in_kvcache", want: "extra_indices_in_kvcache is not"},
		{set: "extra_indices_in_kvcache", t: tensor.FromInt64s(tensor.I32, []int{1, 1, 2}, []int64{0, 6}), want: "extra_indices_in_kvcache[0,0,1] = 6 is outside extra_k_cache (6 slots)"},
		{set: "extra_topk_length", t: tensor.FromInt64s(tensor.I32, []int{1}, []int64{5}), want: "extra_topk_length[0] = 5 is outside [0, extra topk = 4]"},
	} {
		bad := Inputs{Tensors: maps.Clone(in.Tensors), Params: in.Params}
		if c.drop != "" {
			delete(bad.Tensors, c.drop)
		} else {
			bad.Tensors[c.set] = c.t
		}
		if _, err := Evaluate(context.Background(), k, bad, DefaultPrecision(), nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s%s: error %v, want one containing %q", c.drop, c.set, err, c.want)
		}
	}
}
