package dsa

import (
	"context"
	"encoding/binary"
	"math"
	"math/rand"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/kvcache"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

func pages(t *testing.T, table []int64, mb int, lens []int64, p, nb int) *kvcache.Pages {
	t.Helper()
	pg, err := kvcache.NewPages(tensor.FromInt64s(tensor.I32, []int{len(lens), mb}, table),
		tensor.FromInt64s(tensor.I32, []int{len(lens)}, lens), p, nb)
	if err != nil {
		t.Fatal(err)
	}
	return pg
}

// TestTwoHeadsByHand: Hi = 2, Dk = 2, P = 2, one request of 3 tokens on
// blocks [1, 0]. Tokens k0 = (1,0), k1 = (0,1) in block 1, k2 = (1,1) at
// block 0 offset 0; block 0 offset 1 holds NaN that must never be read.
// q0 = (2,-1), q1 = (-1,3), w = (0.5, 2):
//
//	t0: q0·k0 = 2, q1·k0 = -1 -> relu 0: 0.5*2 + 2*0 = 1
//	t1: q0·k1 = -1 -> 0, q1·k1 = 3:      0.5*0 + 2*3 = 6
//	t2: q0·k2 = 1, q1·k2 = 2:            0.5*1 + 2*2 = 4.5
func TestTwoHeadsByHand(t *testing.T) {
	nan := math.NaN()
	kc := tensor.FromFloat64s(tensor.BF16, []int{2, 2, 2}, []float64{1, 1, nan, nan, 1, 0, 0, 1})
	in := Input{
		Q:       tensor.FromFloat64s(tensor.BF16, []int{1, 2, 2}, []float64{2, -1, -1, 3}),
		KCache:  kc,
		Weights: tensor.FromFloat64s(tensor.F32, []int{1, 2}, []float64{0.5, 2}),
		Pages:   pages(t, []int64{1, 0}, 2, []int64{3}, 2, 2),
	}
	s, err := Compute(context.Background(), in, 4)
	if err != nil {
		t.Fatal(err)
	}
	want := []float64{1, 6, 4.5, math.Inf(-1)}
	for i, w := range want {
		if s.Exact[i] != w || s.Expected[i] != w {
			t.Errorf("score[0,%d]: exact %v, expected %v, want %v", i, s.Exact[i], s.Expected[i], w)
		}
	}
	for _, c := range []struct {
		k    int
		want []int32
	}{{1, []int32{1}}, {2, []int32{1, 2}}, {4, []int32{1, 2, 0, -1}}} {
		ex, ep := s.TopK(c.k)
		for j := range c.want {
			if ex[j] != c.want[j] || ep[j] != c.want[j] {
				t.Errorf("top-%d: exact %v, expected %v, want %v", c.k, ex, ep, c.want)
				break
			}
		}
	}
}

// TestAgainstNaiveLoop: the paged scores equal a plain loop over the same
// tokens kept in a contiguous slice (no block table), and the fp32
// evaluation stays within the error bound.
func TestAgainstNaiveLoop(t *testing.T) {
	rng := rand.New(rand.NewSource(5))
	const b, hi, dk, p, nb = 3, 4, 128, 4, 9
	lens := []int64{9, 0, 5}
	table := []int64{8, 2, 5, -1, -1, -1, 0, 7, 3}
	kcv := make([]float64, nb*p*dk)
	for i := range kcv {
		kcv[i] = rng.NormFloat64()
	}
	kc := tensor.FromFloat64s(tensor.BF16, []int{nb, p, dk}, kcv)
	qv := make([]float64, b*hi*dk)
	for i := range qv {
		qv[i] = rng.NormFloat64()
	}
	q := tensor.FromFloat64s(tensor.BF16, []int{b, hi, dk}, qv)
	wv := make([]float64, b*hi)
	for i := range wv {
		wv[i] = rng.Float64() - 0.3
	}
	w := tensor.FromFloat64s(tensor.F32, []int{b, hi}, wv)
	s, err := Compute(context.Background(), Input{Q: q, KCache: kc, Weights: w, Pages: pages(t, table, 3, lens, p, nb)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if s.MaxSeq != 9 {
		t.Fatalf("MaxSeq = %d, want max(seq_lens) = 9", s.MaxSeq)
	}
	worst := 0.0
	for r := 0; r < b; r++ {
		// the request's tokens, contiguous
		var keys [][]float64
		for tk := 0; tk < int(lens[r]); tk++ {
			blk := table[r*3+tk/p]
			base := (int(blk)*p + tk%p) * dk
			k := make([]float64, dk)
			for j := range k {
				k[j] = kc.Float64At(base + j)
			}
			keys = append(keys, k)
		}
		for tk := 0; tk < s.MaxSeq; tk++ {
			got := s.Exact[r*s.MaxSeq+tk]
			if tk >= len(keys) {
				if !math.IsInf(got, -1) || !math.IsInf(s.Expected[r*s.MaxSeq+tk], -1) {
					t.Errorf("request %d token %d past seq_len: %v, want -inf", r, tk, got)
				}
				continue
			}
			want := 0.0
			for h := 0; h < hi; h++ {
				dot := 0.0
				for j := 0; j < dk; j++ {
					dot += q.Float64At((r*hi+h)*dk+j) * keys[tk][j]
				}
				if dot > 0 {
					want += w.Float64At(r*hi+h) * dot
				}
			}
			if math.Abs(got-want) > 1e-12*(1+math.Abs(want)) {
				t.Errorf("request %d token %d: exact %v, naive %v", r, tk, got, want)
			}
			e := math.Abs(s.Expected[r*s.MaxSeq+tk] - got)
			if bd := s.Bound[r*s.MaxSeq+tk]; e > bd {
				t.Errorf("request %d token %d: fp32 error %g above its bound %g", r, tk, e, bd)
			} else if bd > 0 {
				worst = math.Max(worst, e/bd)
			}
		}
	}
	t.Logf("worst fp32 error / bound = %.4f", worst)
}

func TestTopKAccepts(t *testing.T) {
	// request 0: scores 5, 3, 3, 1 (k = 2: the k-th score 3 is held by
	// tokens 1 and 2 alike); request 1: 2 tokens, k = 2 -> no padding;
	// request 2: 1 token -> one -1.
	s := &Scores{B: 3, MaxSeq: 4, SeqLens: []int{4, 2, 1},
		Exact: []float64{5, 3, 3, 1, 7, 8, math.Inf(-1), math.Inf(-1), 0, math.Inf(-1), math.Inf(-1), math.Inf(-1)},
		Bound: []float64{1e-6, 1e-6, 1e-6, 1e-6, 0, 0, 0, 0, 0, 0, 0, 0}}
	s.Expected = s.Exact
	ex, _ := s.TopK(2)
	if want := []int32{0, 1, 1, 0, 0, -1}; !equal(ex, want) { // indices are positions within the request
		t.Fatalf("TopK(2) = %v, want %v (ties by lower index)", ex, want)
	}
	for _, c := range []struct {
		b      int
		actual int64
		want   bool
		why    string
	}{
		{0, 2, true, "score 3 ties the k-th"},
		{0, 3, false, "score 1 is below the k-th by far more than the bound"},
		{0, -1, false, "4 tokens for k = 2: no padding"},
		{0, 4, false, "past seq_len"},
		{1, 2, false, "past seq_len (the -inf column)"},
		{1, 0, true, "all of a short request's tokens are in"},
		{2, -1, true, "1 token for k = 2: one -1"},
		{2, 0, true, "the only token"},
	} {
		if got := s.TopKAccepts(c.b, 2, c.actual); got != c.want {
			t.Errorf("request %d, entry %d: %v, want %v (%s)", c.b, c.actual, got, c.want, c.why)
		}
	}
	// within the noise: 3 - 1.5e-6 is within 2e-6 of the k-th score 3
	s.Exact[3] = 3 - 1.5e-6
	s.kthTok = nil
	if !s.TopKAccepts(0, 2, 3) {
		t.Error("a score within the two bounds of the k-th must be accepted")
	}
}

func equal(a, b []int32) bool {
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

func TestInputErrors(t *testing.T) {
	kc := tensor.New(tensor.BF16, 2, 2, 4)
	q := tensor.New(tensor.BF16, 1, 2, 4)
	w := tensor.New(tensor.F32, 1, 2)
	pg := pages(t, []int64{0, 1}, 2, []int64{3}, 2, 2)
	for _, c := range []struct {
		name   string
		in     Input
		maxSeq int
		want   string
	}{
		{"scores too narrow", Input{Q: q, KCache: kc, Weights: w, Pages: pg}, 2, "seq_lens[0] = 3 exceeds the scores tensor's 2 columns"},
		{"weights shape", Input{Q: q, KCache: kc, Weights: tensor.New(tensor.F32, 1, 3), Pages: pg}, 0, "tensor weights has shape [1 3]"},
		{"k_cache width", Input{Q: q, KCache: tensor.New(tensor.BF16, 2, 2, 8), Weights: w, Pages: pg}, 0, "tensor k_cache has shape [2 2 8]"},
		{"k_cache dtype", Input{Q: q, KCache: tensor.New(tensor.U8, 2, 2, 4), Weights: w, Pages: pg}, 0, "tensor k_cache has dtype U8"},
		{"batch", Input{Q: tensor.New(tensor.BF16, 2, 2, 4), KCache: kc, Weights: tensor.New(tensor.F32, 2, 2), Pages: pg}, 0, "tensor seq_lens has 1 entries but q has 2 rows (next_n = 1"},
	} {
		if _, err := Compute(context.Background(), c.in, c.maxSeq); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", c.name, err, c.want)
		}
	}
}

// TestVisible: the tokens query row n of next_n sees, against vLLM's two
// statements of the rule (vllm 0.33.0): the torch reference's mask
// k < context_len & k <= q_offset with q_offsets = arange(context_len -
// next_n, context_len) (vllm/v1/attention/ops/rocm_aiter_mla_sparse.py:
// 500-538), and the top-k's row ends clamp(seq_len - next_n + 1 + n,
// min=0) (vllm/model_executor/layers/indexer_topk.py:291-297).
func TestVisible(t *testing.T) {
	for _, c := range []struct{ seqLen, nextN, n, want int }{
		{4, 1, 0, 4},
		{4, 3, 0, 2}, {4, 3, 1, 3}, {4, 3, 2, 4},
		{1, 3, 0, 0}, {1, 3, 1, 0}, {1, 3, 2, 1}, // shorter than its queries
		{0, 2, 0, 0}, {0, 2, 1, 0},
	} {
		mask := 0 // count k with k < seqLen and k <= q_offset
		for k := 0; k < c.seqLen; k++ {
			if k <= c.seqLen-c.nextN+c.n {
				mask++
			}
		}
		if got := Visible(c.seqLen, c.nextN, c.n); got != c.want || mask != c.want {
			t.Errorf("Visible(%d, %d, %d) = %d (mask count %d), want %d", c.seqLen, c.nextN, c.n, got, mask, c.want)
		}
	}
}

// TestNextNByHand: the hand example of TestTwoHeadsByHand (scores 1, 6,
// 4.5) as an MTP step of next_n = 2 whose two rows share q and w: row 0
// (the query at position 1) sees t0 and t1, row 1 (position 2) all three.
// AllVisible, the dropped-limit bug, gives row 0 t2 as well.
func TestNextNByHand(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(-1)
	in := Input{
		Q:       tensor.FromFloat64s(tensor.BF16, []int{2, 2, 2}, []float64{2, -1, -1, 3, 2, -1, -1, 3}),
		KCache:  tensor.FromFloat64s(tensor.BF16, []int{2, 2, 2}, []float64{1, 1, nan, nan, 1, 0, 0, 1}),
		Weights: tensor.FromFloat64s(tensor.F32, []int{2, 2}, []float64{0.5, 2, 0.5, 2}),
		Pages:   pages(t, []int64{1, 0}, 2, []int64{3}, 2, 2),
		NextN:   2,
	}
	bug, err := AllVisible(in)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		in   Input
		want []float64
		top2 []int32
	}{
		{"causal", in, []float64{1, 6, inf, inf, 1, 6, 4.5, inf}, []int32{1, 0, 1, 2}},
		{"all visible", bug, []float64{1, 6, 4.5, inf, 1, 6, 4.5, inf}, []int32{1, 2, 1, 2}},
	} {
		s, err := Compute(context.Background(), c.in, 4)
		if err != nil {
			t.Fatal(err)
		}
		for i, w := range c.want {
			if s.Exact[i] != w || s.Expected[i] != w {
				t.Errorf("%s: score[%d,%d]: exact %v, expected %v, want %v", c.name, i/4, i%4, s.Exact[i], s.Expected[i], w)
			}
		}
		if ex, ep := s.TopK(2); !equal(ex, c.top2) || !equal(ep, c.top2) {
			t.Errorf("%s: top-2 %v / %v, want %v", c.name, ex, ep, c.top2)
		}
	}
	// row 0 must not pick its future token t2, whatever its score
	s, _ := Compute(context.Background(), in, 4)
	s.TopK(2)
	if s.TopKAccepts(0, 2, 2) || !s.TopKAccepts(0, 2, 0) || !s.TopKAccepts(1, 2, 2) {
		t.Errorf("row 0 accepts its future token 2, or refuses token 0; or row 1 refuses token 2")
	}
	// per-row lengths override the derived ones, within the request's
	in.RowLens = []int{1, 3}
	if s, err := Compute(context.Background(), in, 4); err != nil || s.SeqLens[0] != 1 || s.Exact[1] != inf || s.Exact[0] != 1 {
		t.Errorf("RowLens [1 3]: %v, %v", s, err)
	}
	in.RowLens = []int{1, 4}
	if _, err := Compute(context.Background(), in, 4); err == nil || !strings.Contains(err.Error(), "tensor seq_lens[0, 1] = 4 is outside [0, 3]") {
		t.Errorf("RowLens past the request: %v", err)
	}
	in.RowLens = nil
	in.NextN = 3
	if _, err := Compute(context.Background(), in, 4); err == nil || !strings.Contains(err.Error(), "tensor q has 2 rows but seq_lens has 1 requests of next_n = 3 queries (3 rows)") {
		t.Errorf("next_n 3 over 2 rows: %v", err)
	}
}

// TestSlots: top-k positions to global slots block·P + offset through the
// block table, -1 kept (vLLM's triton_convert_req_index_to_global_index,
// whose output for these inputs, run under TRITON_INTERPRET=1 with vllm
// 0.33.0, was [[192 65 197 -1], [258 1 128 134]]: P = 64, tables [3 1]
// and [0 2 4]); and back, a slot the row cannot see being no token of it.
func TestSlots(t *testing.T) {
	p := pages(t, []int64{3, 1, -1, 0, 2, 4}, 3, []int64{70, 140}, 64, 5)
	s := &Scores{B: 2, NextN: 1, SeqLens: []int{70, 140}}
	c := NewSlots(p, s)
	got := c.Map([]int32{0, 65, 5, -1, 130, 1, 64, 70}, 4)
	if want := []int32{192, 65, 197, -1, 258, 1, 128, 134}; !equal(got, want) {
		t.Errorf("Map = %v, want %v", got, want)
	}
	for _, tc := range []struct {
		row  int
		slot int64
		tok  int
		ok   bool
	}{
		{0, 192, 0, true}, {0, 65, 65, true}, {1, 258, 130, true},
		{0, 258, 0, false},    // request 1's slot
		{0, 64 + 6, 0, false}, // block 1 offset 6 is token 70: past seq_len 70
		{1, -1, 0, false},
	} {
		tok, ok := c.Token(tc.row, tc.slot)
		if ok != tc.ok || ok && tok != tc.tok {
			t.Errorf("Token(%d, %d) = %d, %v; want %d, %v", tc.row, tc.slot, tok, ok, tc.tok, tc.ok)
		}
	}
	// next_n 2: row 0 of the request sees 69 tokens, so token 69's slot is
	// its future
	c = NewSlots(pages(t, []int64{3, 1}, 2, []int64{70}, 64, 5), &Scores{B: 2, NextN: 2, SeqLens: []int{69, 70}})
	if _, ok := c.Token(0, 64+5); ok {
		t.Errorf("row 0 takes token 69's slot as its own")
	}
	if tok, ok := c.Token(1, 64+5); !ok || tok != 69 {
		t.Errorf("row 1: token %d, %v; want 69", tok, ok)
	}
}

// TestScaleFmt: the declared writer convention of the fp8 cache's scales
// against tokens written each way (vLLM's indexer_k_quant_and_cache:
// scale = max(amax, 1e-4)/448, ue8m0 rounding it up to a power of two;
// vllm 0.33.0 vllm/v1/attention/ops/rocm_aiter_mla_sparse.py:150-158).
// Each token is (its two values as e4m3 codes, its F32 scale); amax =
// largest code · scale. Undeclared (any), every one is read as stored.
func TestScaleFmt(t *testing.T) {
	floorAmax := float32(1e-4) / 448 // 0x1.ad7f2ap-23, not a power of two
	floorUE := float32(0x1p-22)      // 2^ceil(log2(that))
	for _, c := range []struct {
		name        string
		codes       [2]float64
		scale       float32
		amax, ue8m0 string // "" = accepted, else the error
	}{
		{"amax 112: 112/448 = 0.25 is both", [2]float64{448, -3}, 0.25, "", ""},
		{"amax 134.4: 0.3 is amax's", [2]float64{448, 1}, 0.3, "", "not a power of two"},
		{"amax 64: ue8m0's 2^ceil(log2(64/448)) = 0.25", [2]float64{256, -2}, 0.25, "largest code 256, not 448", ""},
		{"largest code 128 under a power of two", [2]float64{128, 1}, 0.25, "not 448", "leaves the largest code in [224, 448]"},
		{"amax below 1e-4: amax's floor", [2]float64{1, 0}, floorAmax, "", "not a power of two"},
		{"amax below 1e-4: ue8m0's floor", [2]float64{1, 0}, floorUE, "not 448", ""},
		{"zero scale", [2]float64{448, 0}, 0, "not a positive finite scale", "not a positive finite scale"},
		{"NaN scale", [2]float64{448, 0}, float32(math.NaN()), "not a positive finite scale", "not a positive finite scale"},
	} {
		// one block, P = 2: token 0 is c, token 1 (not attended) garbage
		b0, _ := formats.E4M3FN.Encode(c.codes[0], formats.Saturate)
		b1, _ := formats.E4M3FN.Encode(c.codes[1], formats.Saturate)
		data := []byte{b0, b1, 0x7f, 0x7f}
		data = binary.LittleEndian.AppendUint32(data, math.Float32bits(c.scale))
		data = binary.LittleEndian.AppendUint32(data, math.Float32bits(0.3))
		in := Input{
			Q:       tensor.FromFloat64s(tensor.BF16, []int{1, 1, 2}, []float64{1, 1}),
			KCache:  &tensor.Tensor{DType: tensor.U8, Shape: []int{1, 2, 6}, Data: data},
			FP8:     true,
			Weights: tensor.FromFloat64s(tensor.F32, []int{1, 1}, []float64{1}),
			Pages:   pages(t, []int64{0}, 1, []int64{1}, 2, 1),
		}
		for fmtName, want := range map[string]string{ScaleAny: "", ScaleAmax: c.amax, ScaleUE8M0: c.ue8m0} {
			if fmtName == ScaleAny && !(c.scale > 0) {
				continue // read as stored: a zero or NaN score, no error
			}
			in.ScaleFmt = fmtName
			s, err := Compute(context.Background(), in, 0)
			switch {
			case want == "" && err != nil:
				t.Errorf("%s as %s: %v", c.name, fmtName, err)
			case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
				t.Errorf("%s as %s: %v, want an error about %q", c.name, fmtName, err, want)
			case want != "" && !strings.Contains(err.Error(), "tensor k_cache: request 0 token 0 (block 0, offset 0)"):
				t.Errorf("%s as %s: %v does not name the token", c.name, fmtName, err)
			case err == nil && s.Exact[0] != math.Max(c.codes[0]+c.codes[1], 0)*float64(c.scale): // relu(q·codes)·scale, q = (1, 1)
				t.Errorf("%s as %s: score %v, want the stored scale's (codes %v · %v)", c.name, fmtName, s.Exact[0], c.codes, c.scale)
			}
		}
	}
	if got := CeilPow2(0x1p-3); got != 0x1p-3 {
		t.Errorf("CeilPow2(2^-3) = %v", got)
	}
	if got := CeilPow2(math.Nextafter(0x1p-3, 1)); got != 0x1p-2 {
		t.Errorf("CeilPow2(2^-3 + ulp) = %v, want 2^-2", got)
	}
	if got := ScaleFloor(ScaleUE8M0); got != float64(floorUE) {
		t.Errorf("ue8m0 floor %v, want 2^-22", got)
	}
}
