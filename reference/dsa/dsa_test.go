package dsa

import (
	"context"
	"math"
	"math/rand"
	"strings"
	"testing"

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
		{"batch", Input{Q: tensor.New(tensor.BF16, 2, 2, 4), KCache: kc, Weights: tensor.New(tensor.F32, 2, 2), Pages: pg}, 0, "tensor seq_lens has 1 entries but q has 2 requests"},
	} {
		if _, err := Compute(context.Background(), c.in, c.maxSeq); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", c.name, err, c.want)
		}
	}
}
