package mla

import (
	"context"
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
	lay, err := kvcache.NewLayout(kvcache.FP8DSMLAModel1, kvcache.M1Nope, kvcache.M1Rope, p)
	if err != nil {
		t.Fatal(err)
	}
	w, err := kvcache.Write(tensor.New(tensor.U8, nb, p, kvcache.M1EntryBytes),
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
		Params: Params{"softmax_scale": "0.04419417382415922", "kv_cache_dtype": "fp8_ds_mla_model1", "invalid_index": "minus_one"},
	}, tok
}

// TestMLADecodeSparseModel1: over a DeepSeek-V4 cache the sparse decode's
// out is [B, s_q, H, 512], the whole entry (head_dim_v's default there, as
// FlashMLA's tests/ref.py:91 with d_v = d_qk = 512), and its exact answer is
// the plain float64 softmax attention over the dequantized rows, written
// here with none of the engine's blocking (the reader itself is held to
// FlashMLA's bytes in reference/kvcache). The rope columns 448..511 carry
// real values: planting V = L (head_dim_v's default taken from the latent
// width, as for V3.2) fails on the shape, [1 1 64 448].
func TestMLADecodeSparseModel1(t *testing.T) {
	rng := rand.New(rand.NewPCG(44, 8))
	const nb, p, topk = 3, 5, 12
	in, _ := model1Inputs(t, rng, nb, p, topk)
	k, _ := Lookup("mla_decode_sparse")
	outs, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	out := outputNamed(t, outs, "out")
	if want := []int{1, 1, 64, 512}; !equalInts(out.Shape, want) {
		t.Fatalf("out has shape %v, want %v (V = the whole 512-dim entry)", out.Shape, want)
	}
	lay, _ := kvcache.NewLayout(kvcache.FP8DSMLAModel1, kvcache.M1Nope, kvcache.M1Rope, p)
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
	rng := rand.New(rand.NewPCG(3, 9))
	in, _ := model1Inputs(t, rng, 2, 4, 6)
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
			"block_table": tables["block_table"], "seq_lens": tables["seq_lens"]}, Params: Params{"softmax_scale": "0.1", "kv_cache_dtype": "fp8_ds_mla_model1"}}},
		{"kv_cache_gather", Inputs{Tensors: map[string]*tensor.Tensor{"cache": cache,
			"block_table": tables["block_table"], "seq_lens": tables["seq_lens"]}, Params: Params{"kv_cache_dtype": "fp8_ds_mla_model1"}}},
		{"kv_cache_transfer", Inputs{Tensors: map[string]*tensor.Tensor{"src_cache": cache, "dst_cache_before": cache,
			"src_block_table": tables["block_table"], "dst_block_table": tables["block_table"], "seq_lens": tables["seq_lens"]},
			Params: Params{"kv_cache_dtype": "fp8_ds_mla_model1"}}},
	} {
		k, err := Lookup(c.kernel)
		if err != nil {
			t.Fatal(err)
		}
		_, err = Evaluate(context.Background(), k, c.in, DefaultPrecision(), nil)
		if err == nil || !strings.Contains(err.Error(), "kernel "+c.kernel+" does not read") || !strings.Contains(err.Error(), "fp8_ds_mla_model1") {
			t.Errorf("%s over fp8_ds_mla_model1: error %v, want one naming the kernel and the layout", c.kernel, err)
		}
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func hasCoord(cs []Coord, want Coord) bool {
	for _, c := range cs {
		if c == want {
			return true
		}
	}
	return false
}
