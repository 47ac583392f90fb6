package mla

import (
	"context"
	. "github.com/kcheck-dev/kcheck/internal/kernel"
	_ "github.com/kcheck-dev/kcheck/internal/kernels/splitk" // mla_decode's partials feed splitk_combine in the tests
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// mlaInputs is a small paged decode: B = 2 requests (seq_lens 5 and 0... or
// as given), H heads, D = L + R, pages of 4 tokens in a cache of nb blocks.
func mlaInputs(rng *rand.Rand, seqLens []int, sq, h, l, r, nb int) Inputs {
	const p = 4
	d := l + r
	bf := func(shape []int) *tensor.Tensor {
		v := make([]float64, tensor.NumElements(shape))
		for i := range v {
			v[i] = formats.RoundBF16(rng.NormFloat64())
		}
		return tensor.FromFloat64s(tensor.BF16, shape, v)
	}
	mb := 1
	for _, n := range seqLens {
		mb = max(mb, (n+p-1)/p)
	}
	perm := rng.Perm(nb)
	table := make([]int64, len(seqLens)*mb)
	next := 0
	for b, n := range seqLens {
		for j := 0; j < mb; j++ {
			table[b*mb+j] = -1
			if j*p < n {
				table[b*mb+j] = int64(perm[next])
				next++
			}
		}
	}
	sl := make([]int64, len(seqLens))
	for i, n := range seqLens {
		sl[i] = int64(n)
	}
	return Inputs{
		Tensors: map[string]*tensor.Tensor{
			"q":           bf([]int{len(seqLens), sq, h, d}),
			"kv_cache":    bf([]int{nb, p, d}),
			"block_table": tensor.FromInt64s(tensor.I32, []int{len(seqLens), mb}, table),
			"seq_lens":    tensor.FromInt64s(tensor.I32, []int{len(seqLens)}, sl),
		},
		Params: Params{"softmax_scale": "0.25", "kv_cache_dtype": "bf16", "page_size": "4", "latent_dim": "12"},
	}
}

func outputNamed(t *testing.T, outs []Output, name string) Output {
	t.Helper()
	for _, o := range outs {
		if o.Name == name {
			return o
		}
	}
	t.Fatalf("no output %s", name)
	return Output{}
}

// TestMLADecodeContractPartialsCombine runs mla_decode with split-K partials
// through the contract, then feeds its exact partials (flattened to [N, S, L])
// to splitk_combine: the combine must give mla_decode's own out and lse.
func TestMLADecodeContractPartialsCombine(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	in := mlaInputs(rng, []int{9, 0, 23}, 1, 3, 12, 4, 12)
	in.Params["num_splits"] = "4"
	in.Params["lse_base"] = "2"
	k, err := Lookup("mla_decode")
	if err != nil {
		t.Fatal(err)
	}
	outs, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	out, lse := outputNamed(t, outs, "out"), outputNamed(t, outs, "lse")
	po, pl := outputNamed(t, outs, "partial_out"), outputNamed(t, outs, "partial_lse")
	if got := po.Shape; len(got) != 5 || got[3] != 4 || got[4] != 12 {
		t.Fatalf("partial_out shape %v, want [3 1 3 4 12]", got)
	}
	if out.DType != tensor.BF16 || lse.DType != tensor.F32 || out.Reduction != 23 {
		t.Errorf("out %s lse %s reduction %d; want BF16, F32, 23 (max seq_len)", out.DType, lse.DType, out.Reduction)
	}
	n := 3 * 1 * 3
	comb, _ := Lookup("splitk_combine")
	couts, err := Evaluate(context.Background(), comb, Inputs{
		Tensors: map[string]*tensor.Tensor{
			"partial_out": Materialize(tensor.F32, []int{n, 4, 12}, po.Exact),
			"partial_lse": Materialize(tensor.F32, []int{n, 4}, pl.Exact),
		},
		Params: Params{"lse_base": "2"},
	}, DefaultPrecision(), map[string]tensor.DType{"out": tensor.F32})
	if err != nil {
		t.Fatal(err)
	}
	cout, clse := outputNamed(t, couts, "out"), outputNamed(t, couts, "lse")
	// The partials were stored as F32 for the combine, so agreement is to
	// fp32 rounding of the partials, not 1e-13 (reference/mla tests that).
	for i, v := range Float64s(out.Exact) {
		if math.Abs(cout.Exact.At(i)-v) > 1e-6*math.Max(math.Abs(v), 1) {
			t.Fatalf("combined out[%d] = %v, mla_decode %v", i, cout.Exact.At(i), v)
		}
	}
	for i, v := range Float64s(lse.Exact) { // s_q = 1: [B, H, 1] and [B·1·H] agree in order
		if !(clse.Exact.At(i) == v || math.Abs(clse.Exact.At(i)-v) <= 1e-6*math.Abs(v)) {
			t.Fatalf("combined lse[%d] = %v, mla_decode %v", i, clse.Exact.At(i), v)
		}
	}
	// request 1 is empty: lse -inf (default lse_empty), partials -inf
	if !math.IsInf(lse.Exact.At(3), -1) || !math.IsInf(pl.Exact.At(3*4), -1) {
		t.Errorf("empty request: lse %v partial %v, want -inf", lse.Exact.At(3), pl.Exact.At(3*4))
	}
	// coordinates: request 2, head 1, latent 5
	c := out.Coords.Name([]int{2, 0, 1, 5})
	want := []Coord{{Kind: "request", Value: 2}, {Kind: "q_pos", Value: 0}, {Kind: "head", Value: 1}, {Kind: "latent", Value: 5},
		{Kind: "context_len", Value: 23}, {Kind: "visible", Value: 23}, {Kind: "last_page_fill", Value: 3}, {Kind: "head_tile", Value: 0}, {Kind: "tile128", Value: 0}}
	if len(c) != len(want) {
		t.Fatalf("coords %v, want %v", c, want)
	}
	for i := range want {
		if c[i] != want[i] {
			t.Fatalf("coords %v, want %v", c, want)
		}
	}
	// split 1 of request 2: ceil(23/4) = 6 tokens a split, [6, 12)
	pc := po.Coords.Name([]int{2, 0, 1, 1, 0})
	if pc[5] != (Coord{Kind: "context_len", Value: 23}) || pc[6] != (Coord{Kind: "split_start", Value: 6}) || pc[7] != (Coord{Kind: "split_len", Value: 6}) {
		t.Errorf("partial coords %v", pc)
	}
}

func TestMLADecodeProduceAndNoise(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	in := mlaInputs(rng, []int{40}, 2, 2, 12, 4, 10)
	in.Params["causal"] = "true"
	k, _ := Lookup("mla_decode")
	res, err := Produce(context.Background(), k, in, DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if res["out"].DType != tensor.BF16 || len(res["out"].Shape) != 4 || res["lse"].Shape[2] != 2 {
		t.Fatalf("produced out %s %v lse %v", res["out"].DType, res["out"].Shape, res["lse"].Shape)
	}
	outs, _ := Evaluate(context.Background(), k, in, DefaultPrecision(), nil)
	o := outputNamed(t, outs, "out")
	vmax := 0.0 // largest |value| in the cache
	for _, v := range in.Tensors["kv_cache"].Float64s() {
		vmax = math.Max(vmax, math.Abs(v))
	}
	for i := 0; i < o.Exact.Len(); i++ {
		// bf16 output rounding (2^-9 of |out|) plus bf16 P: each p_j off by
		// at most 2^-9 relative, so Σ p_j v_j moves by at most 2^-9 Σ p_j |v_j|
		// <= 2^-9 max |v| (and fp32 noise far below).
		if d := math.Abs(o.Expected.At(i) - o.Exact.At(i)); d > 0x1p-9*math.Abs(o.Exact.At(i))+0x1p-9*vmax*1.01 {
			t.Errorf("out[%d]: expected %v exact %v", i, o.Expected.At(i), o.Exact.At(i))
		}
	}
}

func TestMLADecodeInputErrors(t *testing.T) {
	k, _ := Lookup("mla_decode")
	in := mlaInputs(rand.New(rand.NewPCG(9, 9)), []int{5, 0}, 1, 2, 12, 4, 6)
	if _, err := Evaluate(context.Background(), k, in, DefaultPrecision(), map[string]tensor.DType{"partial_out": tensor.F32}); err == nil ||
		!strings.Contains(err.Error(), "tensor partial_out is present but nothing says how many splits") {
		t.Errorf("partials without S: error %v", err)
	}
	for _, tc := range []struct {
		name string
		mod  func(in Inputs)
		want string
	}{
		{"missing softmax_scale", func(in Inputs) { delete(in.Params, "softmax_scale") }, "softmax_scale is missing"},
		{"block outside the cache", func(in Inputs) { in.Tensors["block_table"].SetInt64(1, 99) }, "block_table[0,1] = 99 is outside the cache (NB = 6)"},
		{"seq_len beyond the table", func(in Inputs) { in.Tensors["seq_lens"].SetInt64(0, 13) }, "seq_lens[0] = 13 exceeds"},
		{"q D differs", func(in Inputs) {
			in.Tensors["q"] = tensor.New(tensor.BF16, 2, 1, 2, 15)
		}, "tensor q has D = 15 but tensor kv_cache rows hold 16"},
		{"q B differs", func(in Inputs) { in.Tensors["q"] = tensor.New(tensor.BF16, 3, 1, 2, 16) }, "q has B = 3"},
		{"split_bounds decreasing", func(in Inputs) {
			in.Tensors["split_bounds"] = tensor.FromInt64s(tensor.I32, []int{2, 3}, []int64{0, 6, 5, 0, 0, 0})
		}, "split_bounds[0,2] = 5 is below"},
		{"split_bounds not covering", func(in Inputs) {
			in.Tensors["split_bounds"] = tensor.FromInt64s(tensor.I32, []int{2, 3}, []int64{0, 2, 4, 0, 0, 0})
		}, "split_bounds[0,2] = 4 but seq_lens[0] = 5"},
		{"num_splits disagrees with split_bounds", func(in Inputs) {
			in.Params["num_splits"] = "3"
			in.Tensors["split_bounds"] = tensor.FromInt64s(tensor.I32, []int{2, 3}, []int64{0, 2, 5, 0, 0, 0})
		}, "num_splits = 3 but tensor split_bounds has S+1 = 3"},
		{"fp8 without k_scale", func(in Inputs) {
			in.Params["kv_cache_dtype"] = "fp8_e4m3"
			in.Tensors["kv_cache"] = tensor.New(tensor.U8, 6, 4, 16)
		}, "k_scale"},
		{"bad lse_base", func(in Inputs) { in.Params["lse_base"] = "10" }, "lse_base"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := mlaInputs(rand.New(rand.NewPCG(9, 9)), []int{5, 0}, 1, 2, 12, 4, 6)
			tc.mod(in)
			_, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// Spec 8.1: S is the split dimension of the captured partials. A capture
// whose partial_out and partial_lse give S, with neither split_bounds nor
// num_splits, gets the partials that num_splits = S gives; a split_bounds
// tensor, a num_splits parameter or the other partial that says otherwise
// is an error naming both.
func TestMLADecodeSplitCountFromShape(t *testing.T) {
	k, _ := Lookup("mla_decode")
	inputs := func() Inputs { return mlaInputs(rand.New(rand.NewPCG(9, 10)), []int{9, 0, 23}, 1, 3, 12, 4, 12) }
	shapes := func(s int) map[string][]int {
		return map[string][]int{"out": {3, 1, 3, 12}, "lse": {3, 3, 1}, "partial_out": {3, 1, 3, s, 12}, "partial_lse": {3, 1, 3, s}}
	}
	partials := map[string]tensor.DType{"partial_out": tensor.F32, "partial_lse": tensor.F32}
	want := inputs()
	want.Params["num_splits"] = "4"
	ref, err := Evaluate(context.Background(), k, want, DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		shapes map[string][]int
	}{
		{"both partials", shapes(4)},
		{"partial_out alone", map[string][]int{"partial_out": {3, 1, 3, 4, 12}}},
		{"partial_lse alone", map[string][]int{"partial_lse": {3, 1, 3, 4}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := inputs()
			in.OutputShapes = tc.shapes
			dtypes := map[string]tensor.DType{}
			for name := range tc.shapes {
				dtypes[name] = partials[name]
			}
			outs, err := Evaluate(context.Background(), k, in, DefaultPrecision(), dtypes)
			if err != nil {
				t.Fatalf("S from the shape: %v", err)
			}
			for _, name := range []string{"out", "lse", "partial_out", "partial_lse"} {
				got, exp := outputNamed(t, outs, name), outputNamed(t, ref, name)
				if !slices.Equal(got.Shape, exp.Shape) || !sameBits(Float64s(got.Expected), Float64s(exp.Expected)) || !sameBits(Float64s(got.Exact), Float64s(exp.Exact)) {
					t.Errorf("%s: shape %v, want %v (num_splits = 4), or different values", name, got.Shape, exp.Shape)
				}
			}
		})
	}
	for _, tc := range []struct {
		name   string
		shapes map[string][]int
		mod    func(in Inputs)
		want   string
	}{
		{"num_splits disagrees", shapes(4), func(in Inputs) { in.Params["num_splits"] = "2" },
			"parameter num_splits = 2 but tensor partial_out has S = 4 splits (shape [3 1 3 4 12])"},
		{"split_bounds disagree", shapes(4), func(in Inputs) {
			in.Tensors["split_bounds"] = tensor.FromInt64s(tensor.I32, []int{3, 3}, []int64{0, 5, 9, 0, 0, 0, 0, 12, 23})
		}, "tensor split_bounds has S+1 = 3 columns but tensor partial_out has S = 4 splits"},
		{"partial_lse disagrees", map[string][]int{"partial_out": {3, 1, 3, 4, 12}, "partial_lse": {3, 1, 3, 2}}, func(Inputs) {},
			"tensor partial_lse has S = 2 splits (shape [3 1 3 2]) but tensor partial_out has S = 4 splits"},
		{"partial_out of the wrong rank", map[string][]int{"partial_out": {9, 4, 12}}, func(Inputs) {},
			"tensor partial_out has shape [9 4 12]; the contract wants [B, s_q, H, S, L]"},
		{"no split", shapes(0), func(Inputs) {}, "S = 0 splits, want at least 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := inputs()
			in.OutputShapes = tc.shapes
			tc.mod(in)
			_, err := Evaluate(context.Background(), k, in, DefaultPrecision(), partials)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// sameBits reports whether a and b hold the same float64 bits (NaN where NaN).
func sameBits(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float64bits(a[i]) != math.Float64bits(b[i]) {
			return false
		}
	}
	return true
}

// splitk_combine's S is partial_out's split dimension; a num_splits
// parameter that says otherwise is an error (reference/CONTRACTS.md §3.6.1).
func TestSplitKCombineNumSplitsAgrees(t *testing.T) {
	k, _ := Lookup("splitk_combine")
	in := Inputs{Tensors: map[string]*tensor.Tensor{
		"partial_out": tensor.New(tensor.F32, 2, 3, 4), "partial_lse": tensor.New(tensor.F32, 2, 3),
	}, Params: Params{"num_splits": "3"}}
	if _, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil); err != nil {
		t.Fatalf("num_splits = S: %v", err)
	}
	in.Params["num_splits"] = "4"
	if _, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil); err == nil || !strings.Contains(err.Error(), "parameter num_splits = 4 but tensor partial_out has S = 3 splits (shape [2 3 4])") {
		t.Fatalf("num_splits = 4 over S = 3: error %v", err)
	}
}

func TestMLADecodeSparseContract(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	in := mlaInputs(rng, []int{8}, 1, 2, 12, 4, 4)
	dense, _ := Lookup("mla_decode")
	douts, err := Evaluate(context.Background(), dense, in, DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	// the same 8 tokens by slot, with a -1 and an out-of-cache slot mixed in
	var idx []int64
	for tk := 0; tk < 8; tk++ {
		blk := in.Tensors["block_table"].Int64At(tk / 4)
		idx = append(idx, blk*4+int64(tk%4))
		if tk == 3 {
			idx = append(idx, -1, 4*4)
		}
	}
	sin := Inputs{Tensors: map[string]*tensor.Tensor{
		"q": in.Tensors["q"], "kv_cache": in.Tensors["kv_cache"],
		"indices": tensor.FromInt64s(tensor.I32, []int{1, 1, len(idx)}, idx),
	}, Params: in.Params}
	sparse, _ := Lookup("mla_decode_sparse")
	souts, err := Evaluate(context.Background(), sparse, sin, DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"out", "lse"} {
		d, s := outputNamed(t, douts, name), outputNamed(t, souts, name)
		for i := 0; i < d.Exact.Len(); i++ {
			if d.Exact.At(i) != s.Exact.At(i) || d.Expected.At(i) != s.Expected.At(i) {
				t.Fatalf("%s[%d]: sparse %v/%v dense %v/%v", name, i, s.Exact.At(i), s.Expected.At(i), d.Exact.At(i), d.Expected.At(i))
			}
		}
	}
	if c := outputNamed(t, souts, "out").Coords.Name([]int{0, 0, 1, 0}); c[4] != (Coord{Kind: "context_len", Value: 8}) {
		t.Errorf("sparse coords %v: context_len should count the 8 attended slots", c)
	}
	sin.Params["topk"] = "7"
	if _, err := Evaluate(context.Background(), sparse, sin, DefaultPrecision(), nil); err == nil || !strings.Contains(err.Error(), "topk = 7") {
		t.Errorf("topk mismatch: error %v", err)
	}
	delete(sin.Params, "topk")
	// FlashMLA masks only -1 (audit F10): under its convention the
	// out-of-cache slot 16 is a bad input, named, and -1 alone is not.
	sin.Params["invalid_index"] = "minus_one"
	if _, err := Evaluate(context.Background(), sparse, sin, DefaultPrecision(), nil); err == nil || !strings.Contains(err.Error(), "indices[0,0,5] = 16 is outside the cache (16 slots) and not -1") {
		t.Errorf("out-of-cache slot under invalid_index = minus_one: error %v", err)
	}
	onlyMinusOne := slices.DeleteFunc(slices.Clone(idx), func(v int64) bool { return v == 16 })
	sin.Tensors["indices"] = tensor.FromInt64s(tensor.I32, []int{1, 1, len(onlyMinusOne)}, onlyMinusOne)
	if _, err := Evaluate(context.Background(), sparse, sin, DefaultPrecision(), nil); err != nil {
		t.Errorf("-1 under invalid_index = minus_one: %v", err)
	}
}

func TestSplitKCombineContract(t *testing.T) {
	k, err := Lookup("splitk_combine")
	if err != nil {
		t.Fatal(err)
	}
	// row 0: lse 0 and ln 3 over o = (1,0), (0,1): out (1/4, 3/4), lse ln 4.
	// row 1: both splits empty: out 0, lse_empty = +inf.
	ninf := math.Inf(-1)
	in := Inputs{Tensors: map[string]*tensor.Tensor{
		"partial_out": tensor.FromFloat64s(tensor.F32, []int{2, 2, 2}, []float64{1, 0, 0, 1, 0, 0, 0, 0}),
		"partial_lse": tensor.FromFloat64s(tensor.F32, []int{2, 2}, []float64{0, math.Log(3), ninf, ninf}),
	}, Params: Params{"lse_empty": "+inf"}}
	outs, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	out, lse := outputNamed(t, outs, "out"), outputNamed(t, outs, "lse")
	if out.DType != tensor.BF16 {
		t.Errorf("default out dtype %s, want BF16", out.DType)
	}
	want := []float64{0.25, 0.75, 0, 0}
	for i, w := range want {
		if math.Abs(out.Exact.At(i)-w) > 1e-7 || out.Expected.At(i) != w { // 0.25, 0.75 exact in bf16
			t.Errorf("out[%d] = %v / %v, want %v", i, out.Exact.At(i), out.Expected.At(i), w)
		}
	}
	if math.Abs(lse.Exact.At(0)-math.Log(4)) > 1e-7 || !math.IsInf(lse.Exact.At(1), 1) || !math.IsInf(lse.Expected.At(1), 1) {
		t.Errorf("lse = %v / %v, want ln 4 and +inf", lse.Exact, lse.Expected)
	}
	if c := out.Coords.Name([]int{1, 0}); c[2] != (Coord{Kind: "splits_used", Value: 0}) {
		t.Errorf("coords %v: row 1 uses no split", c)
	}
	for _, tc := range []struct {
		name string
		mod  func(in Inputs)
		want string
	}{
		{"S disagrees", func(in Inputs) { in.Tensors["partial_lse"] = tensor.New(tensor.F32, 2, 3) }, "partial_lse has shape [2 3]"},
		{"+inf partial lse", func(in Inputs) { in.Tensors["partial_lse"].SetFloat64(1, math.Inf(1)) }, "partial_lse[0,1] = +Inf"},
		{"bad lse_empty", func(in Inputs) { in.Params["lse_empty"] = "zero" }, "lse_empty"}, // a finite number is a sentinel (FlashInfer's -5e4); a word is not
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := Inputs{Tensors: map[string]*tensor.Tensor{
				"partial_out": tensor.New(tensor.F32, 2, 2, 2),
				"partial_lse": tensor.New(tensor.F32, 2, 2),
			}, Params: Params{}}
			tc.mod(in)
			_, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// FlashMLA's topk_length and attn_sink (deepseek-ai/FlashMLA@9241ae3
// tests/ref.py:72-98): a topk_length of k is the same decode as the indices
// past k set to -1; a sink scales out by exp(lse)/(exp(lse)+exp(sink)) and
// leaves lse alone (+inf gives out 0, -inf changes nothing). The sink's
// factor is recomputed here from the definition, in float64, by a softmax
// over the one token plus the sink (no reference code involved).
func TestMLADecodeSparseSinkAndTopKLength(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	in := mlaInputs(rng, []int{8, 8}, 1, 2, 12, 4, 8)
	var idx []int64
	for b := 0; b < 2; b++ {
		for tk := 0; tk < 8; tk++ {
			idx = append(idx, in.Tensors["block_table"].Int64At(b*2+tk/4)*4+int64(tk%4))
		}
	}
	sparse, _ := Lookup("mla_decode_sparse")
	run := func(ix []int64, extra map[string]*tensor.Tensor) (out, lse Output) {
		t.Helper()
		ts := map[string]*tensor.Tensor{"q": in.Tensors["q"], "kv_cache": in.Tensors["kv_cache"],
			"indices": tensor.FromInt64s(tensor.I32, []int{2, 1, 8}, ix)}
		for k, v := range extra {
			ts[k] = v
		}
		outs, err := Evaluate(context.Background(), sparse, Inputs{Tensors: ts, Params: in.Params}, DefaultPrecision(), nil)
		if err != nil {
			t.Fatal(err)
		}
		return outputNamed(t, outs, "out"), outputNamed(t, outs, "lse")
	}
	same := func(what string, a, b Output) {
		t.Helper()
		for i := 0; i < a.Exact.Len(); i++ {
			if a.Exact.At(i) != b.Exact.At(i) || a.Expected.At(i) != b.Expected.At(i) {
				t.Fatalf("%s: element %d %v/%v vs %v/%v", what, i, a.Exact.At(i), a.Expected.At(i), b.Exact.At(i), b.Expected.At(i))
			}
		}
	}

	// topk_length [5, 0]: request 0 keeps 5 indices, request 1 none.
	cut := slices.Clone(idx)
	for i := range cut {
		if b, k := i/8, i%8; b == 0 && k >= 5 || b == 1 {
			cut[i] = -1
		}
	}
	o1, l1 := run(idx, map[string]*tensor.Tensor{"topk_length": tensor.FromInt64s(tensor.I32, []int{2}, []int64{5, 0})})
	o2, l2 := run(cut, nil)
	same("topk_length out", o1, o2)
	same("topk_length lse", l1, l2)

	base, baseLSE := run(idx, nil)
	for _, tc := range []struct {
		name string
		sink []float64
	}{{"finite", []float64{0.5, -3}}, {"+inf and -inf", []float64{math.Inf(1), math.Inf(-1)}}} {
		o, l := run(idx, map[string]*tensor.Tensor{"attn_sink": tensor.FromFloat64s(tensor.F32, []int{2}, tc.sink)})
		same(tc.name+": lse", l, baseLSE)
		for i := 0; i < o.Exact.Len(); i++ {
			b, h := i/(2*12), i/12%2
			lse := baseLSE.Exact.At(b*2 + h) // [B, H, s_q = 1]
			sink := float64(float32(tc.sink[h]))
			// softmax over the tokens and the sink: the tokens' share of the mass
			share := 1.0
			switch {
			case math.IsInf(sink, 1):
				share = 0
			case !math.IsInf(sink, -1):
				share = math.Exp(lse) / (math.Exp(lse) + math.Exp(sink))
			}
			want := base.Exact.At(i) * share
			if got := o.Exact.At(i); math.Abs(got-want) > 1e-12*math.Max(1, math.Abs(want)) {
				t.Fatalf("%s: out[%d] = %v, want %v (share %v)", tc.name, i, got, want, share)
			}
			// the expected answer applies the same factor, in fp32, before
			// its one rounding to bf16: within a bf16 ulp of the scaled
			// expected answer without the sink
			wantXP := base.Expected.At(i) * share
			if d := math.Abs(o.Expected.At(i) - wantXP); d > math.Abs(wantXP)/128+1e-30 {
				t.Fatalf("%s: expected out[%d] = %v, %v away from %v", tc.name, i, o.Expected.At(i), d, wantXP)
			}
		}
	}

	for _, tc := range []struct {
		name string
		t    map[string]*tensor.Tensor
		want string
	}{
		{"topk_length too long", map[string]*tensor.Tensor{"topk_length": tensor.FromInt64s(tensor.I32, []int{2}, []int64{9, 1})}, "topk_length[0] = 9 is outside [0, topk = 8]"},
		{"topk_length shape", map[string]*tensor.Tensor{"topk_length": tensor.FromInt64s(tensor.I32, []int{1}, []int64{1})}, "topk_length"},
		{"attn_sink shape", map[string]*tensor.Tensor{"attn_sink": tensor.FromFloat64s(tensor.F32, []int{3}, []float64{0, 0, 0})}, "attn_sink"},
		{"extra scope without its indices", map[string]*tensor.Tensor{"extra_k_cache": in.Tensors["kv_cache"]}, "extra_k_cache is present but extra_indices_in_kvcache is not"},
	} {
		ts := map[string]*tensor.Tensor{"q": in.Tensors["q"], "kv_cache": in.Tensors["kv_cache"],
			"indices": tensor.FromInt64s(tensor.I32, []int{2, 1, 8}, idx)}
		for k, v := range tc.t {
			ts[k] = v
		}
		if _, err := Evaluate(context.Background(), sparse, Inputs{Tensors: ts, Params: in.Params}, DefaultPrecision(), nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.want)
		}
	}
}

// TestMLADecodeFP16: an fp16 cache under mla_decode (reference/CONTRACTS.md
// §3.6): fp16 q over it, or bf16 q where an engine mixes them, with
// kv_cache_dtype fp16 or auto; out defaults to the query's dtype for an F16
// query; the lse and the partials may be stored in F16 or BF16 and are
// rounded to it. Every case's expected answer stays within its dtype's
// rounding of the exact one (half an ulp of the output plus P's rounding,
// as TestMLADecodeProduceAndNoise bounds it).
func TestMLADecodeFP16(t *testing.T) {
	k, _ := Lookup("mla_decode")
	for _, c := range []struct {
		name    string
		q, kind string
		od      OutDTypes
		wantOut tensor.DType
		wantLSE tensor.DType
	}{
		{"fp16 q over fp16", "F16", "fp16", nil, tensor.F16, tensor.F32},
		{"bf16 q over fp16, auto", "BF16", "auto", nil, tensor.BF16, tensor.F32},
		{"lse in fp16, partials in bf16", "F16", "fp16", OutDTypes{"lse": tensor.F16, "partial_out": tensor.BF16, "partial_lse": tensor.BF16}, tensor.F16, tensor.F16},
		{"lse in bf16", "BF16", "auto", OutDTypes{"lse": tensor.BF16}, tensor.BF16, tensor.BF16},
	} {
		rng := rand.New(rand.NewPCG(9, 10))
		in := mlaInputs(rng, []int{13, 6}, 1, 3, 12, 4, 8)
		for _, name := range []string{"q", "kv_cache"} {
			d := tensor.DType(c.q)
			if name == "kv_cache" {
				d = tensor.F16
			}
			src := in.Tensors[name]
			in.Tensors[name] = tensor.FromFloat64s(d, src.Shape, src.Float64s())
		}
		in.Params["kv_cache_dtype"] = c.kind
		in.Params["num_splits"] = "2"
		in.Params["p_dtype"] = "f16"
		prec, err := PrecisionFrom(in.Params)
		if err != nil {
			t.Fatal(err)
		}
		outs, err := Evaluate(context.Background(), k, in, prec, c.od)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if o, l := outputNamed(t, outs, "out"), outputNamed(t, outs, "lse"); o.DType != c.wantOut || l.DType != c.wantLSE {
			t.Errorf("%s: out %s, lse %s; want %s, %s", c.name, o.DType, l.DType, c.wantOut, c.wantLSE)
		}
		for _, o := range outs {
			if want, ok := c.od[o.Name]; ok && o.DType != want {
				t.Errorf("%s: %s is %s, want %s", c.name, o.Name, o.DType, want)
			}
			// the rounding to o.DType: half an ulp (2^-11 for F16, 2^-8 for
			// BF16, relative), plus fp16 P's 2^-11 of the largest value
			// for the outputs (|v| < 5 here), fp32 noise far below
			u := map[tensor.DType]float64{tensor.F16: 0x1p-11, tensor.BF16: 0x1p-8, tensor.F32: 0x1p-22}[o.DType]
			for i := 0; i < o.Exact.Len(); i++ {
				x, e := o.Exact.At(i), o.Expected.At(i)
				if math.IsInf(x, 0) && x == e {
					continue // an empty split's -inf
				}
				if e != roundToDType(o.DType, e) {
					t.Fatalf("%s: %s[%d] = %v is not a %s value", c.name, o.Name, i, e, o.DType)
				}
				if d := math.Abs(e - x); d > u*math.Abs(x)+0x1p-11*5+1e-6 {
					t.Errorf("%s: %s[%d]: expected %v, exact %v", c.name, o.Name, i, e, x)
				}
			}
		}
	}
	// auto names the cache's own 16-bit dtype only
	in := mlaInputs(rand.New(rand.NewPCG(9, 10)), []int{13, 6}, 1, 3, 12, 4, 8)
	in.Tensors["kv_cache"] = tensor.New(tensor.U8, 8, 4, 16)
	in.Tensors["k_scale"] = tensor.FromFloat64s(tensor.F32, []int{}, []float64{1})
	in.Params["kv_cache_dtype"] = "auto"
	if _, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil); err == nil || !strings.Contains(err.Error(), "kv_cache_dtype = auto means the cache's own dtype (BF16 or F16), but tensor kv_cache is U8") {
		t.Errorf("auto over a U8 cache: %v", err)
	}
}

// roundToDType is v rounded to d, as the reference rounds an output.
func roundToDType(d tensor.DType, v float64) float64 {
	switch d {
	case tensor.F16:
		return formats.RoundFP16(v)
	case tensor.BF16:
		return formats.RoundBF16(v)
	case tensor.F32:
		return float64(float32(v))
	}
	return v
}

// A request that sees no token: out 0 (the contract), or NaN where
// empty_row = nan declares a stage 2 that divides its zero accumulator by
// its zero sum (vLLM's and SGLang's Triton decode); lse is lse_empty
// either way, and the request that sees tokens is unchanged.
func TestMLADecodeEmptyRow(t *testing.T) {
	k, _ := Lookup("mla_decode")
	base := mlaInputs(rand.New(rand.NewPCG(7, 8)), []int{5, 0}, 1, 2, 12, 4, 4)
	zero, err := Evaluate(context.Background(), k, base, DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		emptyRow string
		wantOut  func(float64) bool
		err      string
	}{
		{"zero", func(v float64) bool { return v == 0 }, ""},
		{"nan", math.IsNaN, ""},
		{"maybe", nil, `parameter empty_row = "maybe": want zero or nan`},
	} {
		t.Run(tc.emptyRow, func(t *testing.T) {
			in := Inputs{Tensors: base.Tensors, Params: Params{}}
			for key, v := range base.Params {
				in.Params[key] = v
			}
			in.Params["empty_row"] = tc.emptyRow
			outs, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			out, lse := outputNamed(t, outs, "out"), outputNamed(t, outs, "lse")
			half := out.Exact.Len() / 2 // request 1's rows: 2 heads of L = 12
			want := outputNamed(t, zero, "out")
			for i := 0; i < out.Exact.Len(); i++ {
				for _, v := range []struct{ got, zero Values }{{out.Exact, want.Exact}, {out.Expected, want.Expected}} {
					if i >= half && !tc.wantOut(v.got.At(i)) {
						t.Fatalf("out[%d] = %v for the empty request", i, v.got.At(i))
					}
					if i < half && v.got.At(i) != v.zero.At(i) {
						t.Fatalf("out[%d] = %v, %v with empty_row = zero: the request with tokens changed", i, v.got.At(i), v.zero.At(i))
					}
				}
			}
			for i := lse.Exact.Len() / 2; i < lse.Exact.Len(); i++ {
				if !math.IsInf(lse.Exact.At(i), -1) || !math.IsInf(lse.Expected.At(i), -1) {
					t.Fatalf("lse[%d] = %v / %v for the empty request, want -inf", i, lse.Exact.At(i), lse.Expected.At(i))
				}
			}
		})
	}
}
