package mla

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/kvcache"
	"github.com/kcheck-dev/kcheck/reference/splitk"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// bf16Cache stores rows [nb*p][l+r] in a bf16 cache (rounding them to bf16).
func bf16Cache(t testing.TB, nb, p, l, r int, rows []float64) *kvcache.Cache {
	t.Helper()
	lay, err := kvcache.NewLayout(kvcache.BF16, l, r, p)
	if err != nil {
		t.Fatal(err)
	}
	c, err := kvcache.New(tensor.FromFloat64s(tensor.BF16, []int{nb, p, l + r}, rows), lay, 0)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func pagesOf(t testing.TB, table [][]int, seqLens []int, p, nb int) *kvcache.Pages {
	t.Helper()
	mb := 0
	for _, row := range table {
		mb = max(mb, len(row))
	}
	bt := make([]int64, 0, len(table)*mb)
	for _, row := range table {
		for j := 0; j < mb; j++ {
			v := int64(-1)
			if j < len(row) {
				v = int64(row[j])
			}
			bt = append(bt, v)
		}
	}
	sl := make([]int64, len(seqLens))
	for i, v := range seqLens {
		sl[i] = int64(v)
	}
	pg, err := kvcache.NewPages(tensor.FromInt64s(tensor.I32, []int{len(table), mb}, bt),
		tensor.FromInt64s(tensor.I32, []int{len(seqLens)}, sl), p, nb)
	if err != nil {
		t.Fatal(err)
	}
	return pg
}

type handCase struct {
	Name       string
	L, R       int
	PageSize   int `json:"page_size"`
	Cache      [][]float64
	BlockTable [][]int `json:"block_table"`
	SeqLens    []int   `json:"seq_lens"`
	H, SQ      int
	Q          [][]float64
	Scale      float64
	Causal     bool
	Base       string
	Empty      string
	Out        [][]float64
	LSE        []string
	Why        string
}

func TestDecodeHandCases(t *testing.T) {
	b, err := os.ReadFile("testdata/hand.json")
	if err != nil {
		t.Fatal(err)
	}
	var f struct{ Cases []handCase }
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	for _, tc := range f.Cases {
		t.Run(tc.Name, func(t *testing.T) {
			var rows []float64
			for _, r := range tc.Cache {
				rows = append(rows, r...)
			}
			nb := len(tc.Cache) / tc.PageSize
			c := bf16Cache(t, nb, tc.PageSize, tc.L, tc.R, rows)
			var q []float64
			for _, r := range tc.Q {
				q = append(q, r...)
			}
			base, _ := splitk.ParseBase(tc.Base)
			empty, _ := splitk.ParseEmpty(tc.Empty)
			p := &Dense{Q: Query{B: len(tc.SeqLens), SQ: tc.SQ, H: tc.H, D: tc.L + tc.R, Data: q}, Cache: c,
				Pages: pagesOf(t, tc.BlockTable, tc.SeqLens, tc.PageSize, nb)}
			cfg := Config{SoftmaxScale: tc.Scale, Causal: tc.Causal, LSE: splitk.Convention{Base: base, Empty: empty}}
			prec := DefaultPrecision()
			prec.Out = tensor.F32
			ex, xp, err := Decode(context.Background(), p, cfg, prec)
			if err != nil {
				t.Fatal(err)
			}
			for r, want := range tc.Out {
				for l, w := range want {
					if got := ex.Out[r*tc.L+l]; math.Abs(got-w) > 1e-15 {
						t.Errorf("exact out row %d [%d] = %v, want %v (%s)", r, l, got, w, tc.Why)
					}
					// Expected: P rounded to bf16 (relative 2^-9) and fp32 elsewhere.
					if got := xp.Out[r*tc.L+l]; math.Abs(got-w) > 0x1p-8*math.Max(math.Abs(w), 1) {
						t.Errorf("expected out row %d [%d] = %v, want %v within bf16 P rounding", r, l, got, w)
					}
				}
			}
			for i, s := range tc.LSE {
				w, err := strconv.ParseFloat(s, 64)
				if err != nil {
					t.Fatal(err)
				}
				if got := ex.LSE[i]; !(got == w || math.Abs(got-w) <= 1e-15*math.Abs(w)) {
					t.Errorf("exact lse[%d] = %v, want %v (%s)", i, got, w, tc.Why)
				}
				if got := xp.LSE[i]; !(got == w || math.Abs(got-w) <= 4*0x1p-24*math.Max(math.Abs(w), 1)) {
					t.Errorf("expected lse[%d] = %v, want %v within fp32 rounding", i, got, w)
				}
			}
		})
	}
}

// randomBF16 returns n bf16-representable values ~ N(0, sd²).
func randomBF16(rng *rand.Rand, n int, sd float64) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = formats.RoundBF16(sd * rng.NormFloat64())
	}
	return v
}

// paged builds the same B sequences twice: once in pages of p tokens
// scattered through a cache in shuffled order (with the unused pages filled
// with NaN, as FlashMLA's tests poison them, so a stray read shows), once
// contiguously with page size = the longest sequence, one block a request.
func paged(t testing.TB, rng *rand.Rand, seqLens []int, p, l, r int) (pagedC *kvcache.Cache, pagedP *kvcache.Pages, contC *kvcache.Cache, contP *kvcache.Pages) {
	d := l + r
	tmax := 1
	for _, n := range seqLens {
		tmax = max(tmax, n)
	}
	seqs := make([][]float64, len(seqLens))
	for b, n := range seqLens {
		seqs[b] = randomBF16(rng, n*d, 1)
	}
	// contiguous
	cont := make([]float64, len(seqLens)*tmax*d)
	var contTable [][]int
	for b := range seqLens {
		copy(cont[b*tmax*d:], seqs[b])
		contTable = append(contTable, []int{b})
	}
	contC = bf16Cache(t, len(seqLens), tmax, l, r, cont)
	contP = pagesOf(t, contTable, seqLens, tmax, len(seqLens))
	// paged: enough blocks plus 3 spare, handed out in random order
	need := 0
	for _, n := range seqLens {
		need += (n + p - 1) / p
	}
	nb := need + 3
	perm := rng.Perm(nb)
	rows := make([]float64, nb*p*d)
	for i := range rows {
		rows[i] = math.NaN()
	}
	var table [][]int
	next := 0
	for b, n := range seqLens {
		var tb []int
		for j := 0; j*p < n; j++ {
			blk := perm[next]
			next++
			tb = append(tb, blk)
			for o := 0; o < p && j*p+o < n; o++ {
				copy(rows[(blk*p+o)*d:(blk*p+o+1)*d], seqs[b][(j*p+o)*d:(j*p+o+1)*d])
			}
		}
		if len(tb) == 0 {
			tb = []int{perm[nb-1]}
		}
		table = append(table, tb)
	}
	pagedC = bf16Cache(t, nb, p, l, r, rows)
	pagedP = pagesOf(t, table, seqLens, p, nb)
	return
}

func sameBits(t *testing.T, what string, a, b []float64) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%s: lengths %d and %d", what, len(a), len(b))
	}
	for i := range a {
		if math.Float64bits(a[i]) != math.Float64bits(b[i]) && !(math.IsNaN(a[i]) && math.IsNaN(b[i])) {
			t.Fatalf("%s[%d]: %v vs %v (not bit-identical)", what, i, a[i], b[i])
		}
	}
}

func noNaN(t *testing.T, what string, v []float64) {
	t.Helper()
	for i, x := range v {
		if math.IsNaN(x) {
			t.Fatalf("%s[%d] is NaN: a NaN-poisoned unused page was read", what, i)
		}
	}
}

// TestPagedEqualsContiguous: decoding through a shuffled block table of small
// pages gives bit-identical results to the same sequences stored
// contiguously (page size = seq_len), for both answers; lengths hit 0, 1,
// P-1, P, P+1 and several blocks of the online softmax.
func TestPagedEqualsContiguous(t *testing.T) {
	const seed = 11
	rng := rand.New(rand.NewPCG(seed, 2))
	for _, p := range []int{1, 4, 16} {
		seqLens := []int{0, 1, p - 1, p, p + 1, 3*Block + 5}
		pc, pp, cc, cp := paged(t, rng, seqLens, p, 12, 4)
		for _, causal := range []bool{false, true} {
			q := Query{B: len(seqLens), SQ: 2, H: 3, D: 16}
			q.Data = randomBF16(rng, q.B*q.SQ*q.H*q.D, 1)
			cfg := Config{SoftmaxScale: 0.25, Causal: causal, LSE: splitk.DefaultConvention()}
			ex1, xp1, err := Decode(context.Background(), &Dense{Q: q, Cache: pc, Pages: pp}, cfg, DefaultPrecision())
			if err != nil {
				t.Fatal(err)
			}
			ex2, xp2, err := Decode(context.Background(), &Dense{Q: q, Cache: cc, Pages: cp}, cfg, DefaultPrecision())
			if err != nil {
				t.Fatal(err)
			}
			noNaN(t, "paged exact out", ex1.Out)
			sameBits(t, "exact out", ex1.Out, ex2.Out)
			sameBits(t, "exact lse", ex1.LSE, ex2.LSE)
			sameBits(t, "expected out", xp1.Out, xp2.Out)
			sameBits(t, "expected lse", xp1.LSE, xp2.LSE)
		}
	}
}

// TestDeterministicAcrossWorkers: the unit of work and the worker count do
// not change a single bit.
func TestDeterministicAcrossWorkers(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	seqLens := []int{70, 3, 129}
	pc, pp, _, _ := paged(t, rng, seqLens, 16, 16, 8)
	q := Query{B: 3, SQ: 2, H: 9, D: 24}
	q.Data = randomBF16(rng, q.B*q.SQ*q.H*q.D, 1)
	var ref *Outputs
	for _, w := range []int{1, 2, 3, 7, 64} {
		cfg := Config{SoftmaxScale: 0.3, Causal: true, LSE: splitk.DefaultConvention(), Workers: w}
		ex, xp, err := Decode(context.Background(), &Dense{Q: q, Cache: pc, Pages: pp}, cfg, DefaultPrecision())
		if err != nil {
			t.Fatal(err)
		}
		if ref == nil {
			ref = xp
			_ = ex
			continue
		}
		sameBits(t, "expected out", ref.Out, xp.Out)
		sameBits(t, "expected lse", ref.LSE, xp.LSE)
	}
}

// TestPartialsCombineToUnsplit: split-K partials combined by the splitk
// reference give the unsplit exact decode to 1e-13 relative, with default
// bounds (S > seq_len included), explicit bounds with empty splits, causal
// s_q = 2 and both lse bases.
func TestPartialsCombineToUnsplit(t *testing.T) {
	rng := rand.New(rand.NewPCG(99, 1))
	seqLens := []int{0, 1, 5, 17, 200}
	pc, pp, _, _ := paged(t, rng, seqLens, 16, 20, 4)
	q := Query{B: len(seqLens), SQ: 2, H: 3, D: 24}
	q.Data = randomBF16(rng, q.B*q.SQ*q.H*q.D, 1)
	const L = 20
	custom := func(s int) []int {
		// first and a middle split empty, the rest uneven
		var out []int
		for _, n := range seqLens {
			row := make([]int, s+1)
			for k := 2; k < s; k++ {
				row[k] = min(n, (k-1)*(n/3+1))
			}
			row[s/2] = row[s/2-1]
			row[s] = n
			out = append(out, row...)
		}
		return out
	}
	for _, base := range []splitk.Base{splitk.BaseE, splitk.Base2} {
		for _, causal := range []bool{false, true} {
			for _, tc := range []struct {
				s      int
				bounds []int
			}{{1, nil}, {3, nil}, {7, nil}, {300, nil}, {6, custom(6)}} {
				cfg := Config{SoftmaxScale: 0.2, Causal: causal, LSE: splitk.Convention{Base: base, Empty: math.Inf(1)}}
				p := &Dense{Q: q, Cache: pc, Pages: pp}
				ex, _, err := Decode(context.Background(), p, cfg, DefaultPrecision())
				if err != nil {
					t.Fatal(err)
				}
				pex, _, err := DecodePartials(context.Background(), p, cfg, DefaultPrecision(), tc.s, tc.bounds)
				if err != nil {
					t.Fatal(err)
				}
				n := q.B * q.SQ * q.H
				cx, _, err := splitk.Combine(context.Background(), pex.Out, pex.LSE, n, tc.s, L, cfg.LSE, tensor.F32, tensor.F32)
				if err != nil {
					t.Fatal(err)
				}
				for r := 0; r < n; r++ {
					b, i, h := r/(q.SQ*q.H), r/q.H%q.SQ, r%q.H
					scale := 0.0
					for l := 0; l < L; l++ {
						scale = math.Max(scale, math.Abs(ex.Out[r*L+l]))
					}
					for l := 0; l < L; l++ {
						if d := math.Abs(cx.Out[r*L+l] - ex.Out[r*L+l]); d > 1e-13*scale {
							t.Fatalf("S=%d base %v causal %v row (b%d,i%d,h%d) out[%d]: combined %v unsplit %v",
								tc.s, base, causal, b, i, h, l, cx.Out[r*L+l], ex.Out[r*L+l])
						}
					}
					want := ex.LSE[(b*q.H+h)*q.SQ+i]
					got := cx.LSE[r]
					if !(got == want || math.Abs(got-want) <= 1e-13*math.Abs(want)) {
						t.Fatalf("S=%d base %v causal %v row (b%d,i%d,h%d): combined lse %v unsplit %v", tc.s, base, causal, b, i, h, got, want)
					}
				}
				// empty partials carry lse -inf even though lse_empty is +inf
				for r := 0; r < n; r++ {
					b := r / (q.SQ * q.H)
					if seqLens[b] == 0 && !math.IsInf(pex.LSE[r*tc.s], -1) {
						t.Fatalf("empty partial lse = %v, want -inf", pex.LSE[r*tc.s])
					}
				}
			}
		}
	}
}

// TestAbsorbedEqualsUnabsorbed: MLA with explicit per-head keys and values
// (k = W_UK·c, v = W_UV·c) equals the absorbed decode (q' = W_UK^T·q_nope over
// the latent cache, out = W_UV·latent_out), to 1e-12.
func TestAbsorbedEqualsUnabsorbed(t *testing.T) {
	rng := rand.New(rand.NewPCG(2025, 3))
	const (
		H, dn, dv, L, R = 3, 5, 6, 8, 4 // heads, qk_nope, v_head_dim, kv_lora_rank, rope
		T, P            = 37, 8
		scale           = 0.31
	)
	wuk := make([][]float64, H) // [H][dn*L]: k_nope = W_UK[h] · c
	wuv := make([][]float64, H) // [H][dv*L]: v = W_UV[h] · c
	for h := range wuk {
		wuk[h] = randomBF16(rng, dn*L, 0.5)
		wuv[h] = randomBF16(rng, dv*L, 0.5)
	}
	c := randomBF16(rng, T*L, 1)   // latent c_kv
	kpe := randomBF16(rng, T*R, 1) // rope keys, shared by the heads
	qn := make([][]float64, H)     // q_nope [dn]
	qp := make([][]float64, H)     // q_pe [R]
	for h := range qn {
		qn[h] = randomBF16(rng, dn, 1)
		qp[h] = randomBF16(rng, R, 1)
	}
	// un-absorbed, per head: explicit K and V
	wantO := make([][]float64, H)
	wantLSE := make([]float64, H)
	for h := 0; h < H; h++ {
		sc := make([]float64, T)
		for j := 0; j < T; j++ {
			s := 0.0
			for a := 0; a < dn; a++ {
				k := 0.0
				for x := 0; x < L; x++ {
					k += wuk[h][a*L+x] * c[j*L+x]
				}
				s += qn[h][a] * k
			}
			for x := 0; x < R; x++ {
				s += qp[h][x] * kpe[j*R+x]
			}
			sc[j] = scale * s
		}
		m := math.Inf(-1)
		for _, s := range sc {
			m = math.Max(m, s)
		}
		den := 0.0
		wantO[h] = make([]float64, dv)
		for j, s := range sc {
			e := math.Exp(s - m)
			den += e
			for a := 0; a < dv; a++ {
				v := 0.0
				for x := 0; x < L; x++ {
					v += wuv[h][a*L+x] * c[j*L+x]
				}
				wantO[h][a] += e * v
			}
		}
		for a := range wantO[h] {
			wantO[h][a] /= den
		}
		wantLSE[h] = m + math.Log(den)
	}
	// absorbed: q' = [W_UK^T q_nope | q_pe] over rows [c | k_pe]
	rows := make([]float64, 0, T*(L+R))
	for j := 0; j < T; j++ {
		rows = append(rows, c[j*L:(j+1)*L]...)
		rows = append(rows, kpe[j*R:(j+1)*R]...)
	}
	nb := (T + P - 1) / P
	rows = append(rows, make([]float64, nb*P*(L+R)-len(rows))...)
	cache := bf16Cache(t, nb, P, L, R, rows)
	table := make([]int, nb)
	for i := range table {
		table[i] = i
	}
	q := Query{B: 1, SQ: 1, H: H, D: L + R}
	for h := 0; h < H; h++ {
		for x := 0; x < L; x++ {
			s := 0.0
			for a := 0; a < dn; a++ {
				s += wuk[h][a*L+x] * qn[h][a]
			}
			q.Data = append(q.Data, s)
		}
		q.Data = append(q.Data, qp[h]...)
	}
	ex, _, err := Decode(context.Background(), &Dense{Q: q, Cache: cache, Pages: pagesOf(t, [][]int{table}, []int{T}, P, nb)},
		Config{SoftmaxScale: scale, LSE: splitk.DefaultConvention()}, DefaultPrecision())
	if err != nil {
		t.Fatal(err)
	}
	worst := 0.0
	for h := 0; h < H; h++ {
		if d := math.Abs(ex.LSE[h] - wantLSE[h]); d > 1e-12*math.Abs(wantLSE[h]) {
			t.Errorf("head %d: absorbed lse %v, un-absorbed %v", h, ex.LSE[h], wantLSE[h])
		}
		for a := 0; a < dv; a++ {
			o := 0.0
			for x := 0; x < L; x++ {
				o += wuv[h][a*L+x] * ex.Out[h*L+x]
			}
			d := math.Abs(o - wantO[h][a])
			worst = math.Max(worst, d)
			if d > 1e-12*math.Max(math.Abs(wantO[h][a]), 1) {
				t.Errorf("head %d v[%d]: absorbed %v, un-absorbed %v", h, a, o, wantO[h][a])
			}
		}
	}
	t.Logf("absorbed vs un-absorbed: max |Δo| = %.3g", worst)
}

// errStats returns max |a-b| / max |b| and the RMS of a-b over RMS of b.
func errStats(a, b []float64) (maxRel, rmsRel float64) {
	var mx, mb, se, sb float64
	for i := range a {
		d := math.Abs(a[i] - b[i])
		mx = math.Max(mx, d)
		mb = math.Max(mb, math.Abs(b[i]))
		se += d * d
		sb += b[i] * b[i]
	}
	return mx / mb, math.Sqrt(se / sb)
}

// TestExpectedNoiseAndBF16Accumulation measures the Expected answer's distance
// from Exact at 4096 tokens: small for the declared fp32 accumulation, far
// larger when the accumulator is bf16 (the precision fault the three-way
// verdict must catch).
func TestExpectedNoiseAndBF16Accumulation(t *testing.T) {
	rng := rand.New(rand.NewPCG(4096, 1))
	const T, P, L, R, H = 4096, 64, 64, 16, 4
	rows := randomBF16(rng, T*(L+R), 1)
	nb := T / P
	table := make([]int, nb)
	for i := range table {
		table[i] = i
	}
	cache := bf16Cache(t, nb, P, L, R, rows)
	q := Query{B: 1, SQ: 1, H: H, D: L + R, Data: randomBF16(rng, H*(L+R), 1)}
	p := &Dense{Q: q, Cache: cache, Pages: pagesOf(t, [][]int{table}, []int{T}, P, nb)}
	cfg := Config{SoftmaxScale: 1 / math.Sqrt(L+R), LSE: splitk.DefaultConvention()}
	res := map[string][2]float64{}
	for _, acc := range []tensor.DType{tensor.F32, tensor.BF16} {
		for _, out := range []tensor.DType{tensor.F32, tensor.BF16} {
			prec := DefaultPrecision()
			prec.Acc, prec.Out = acc, out
			ex, xp, err := Decode(context.Background(), p, cfg, prec)
			if err != nil {
				t.Fatal(err)
			}
			mr, rr := errStats(xp.Out, ex.Out)
			res[string(acc)+"/"+string(out)] = [2]float64{mr, rr}
			lm, _ := errStats(xp.LSE, ex.LSE)
			t.Logf("acc %s out %s: out max rel %.3g rms rel %.3g; lse max rel %.3g", acc, out, mr, rr, lm)
		}
	}
	f32, bf := res["F32/F32"], res["BF16/F32"]
	if f32[0] > 0x1p-7 {
		t.Errorf("fp32 accumulation: Expected within %.3g of Exact; P rounding alone should keep it under 2^-7", f32[0])
	}
	ratio := bf[1] / f32[1]
	t.Logf("RMS error ratio bf16 acc / fp32 acc at %d tokens: %.1f (max-error ratio %.1f); with a bf16 output: %.1f",
		T, ratio, bf[0]/f32[0], res["BF16/BF16"][1]/res["F32/BF16"][1])
	if ratio < 10 {
		t.Errorf("bf16 accumulation at %d tokens deviates only %.1fx more than fp32: the fault would hide in the noise", T, ratio)
	}
}

func TestSparseMatchesDense(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	seqLens := []int{13, 40}
	pc, pp, _, _ := paged(t, rng, seqLens, 8, 12, 4)
	const H, SQ = 2, 2
	q := Query{B: 2, SQ: SQ, H: H, D: 16, Data: randomBF16(rng, 2*SQ*H*16, 1)}
	cfg := Config{SoftmaxScale: 0.25, LSE: splitk.DefaultConvention()}
	exD, xpD, err := Decode(context.Background(), &Dense{Q: q, Cache: pc, Pages: pp}, cfg, DefaultPrecision())
	if err != nil {
		t.Fatal(err)
	}
	// indices: every token's slot in order, with -1 and out-of-cache slots
	// interleaved; topk = longest + padding
	const topk = 60
	slotsOut := int64(pc.Slots())
	idx := make([]int64, 0, 2*SQ*topk)
	for b, n := range seqLens {
		for i := 0; i < SQ; i++ {
			row := make([]int64, 0, topk)
			for tk := 0; tk < n; tk++ {
				if tk%5 == 2 {
					row = append(row, -1)
				}
				if tk%7 == 3 {
					row = append(row, slotsOut+int64(tk))
				}
				blk, off := pp.Locate(b, tk)
				row = append(row, int64(blk*8+off))
			}
			for len(row) < topk {
				row = append(row, -1)
			}
			idx = append(idx, row[:topk]...)
		}
	}
	exS, xpS, err := DecodeSparse(context.Background(), &Sparse{Q: q, Cache: pc, TopK: topk, Indices: idx}, cfg, DefaultPrecision())
	if err != nil {
		t.Fatal(err)
	}
	sameBits(t, "sparse exact out", exS.Out, exD.Out)
	sameBits(t, "sparse exact lse", exS.LSE, exD.LSE)
	sameBits(t, "sparse expected out", xpS.Out, xpD.Out)
	sameBits(t, "sparse expected lse", xpS.LSE, xpD.LSE)

	// all not attended: out 0, lse_empty
	for i := range idx {
		idx[i] = -1
	}
	cfg.LSE.Empty = math.Inf(1)
	exS, _, err = DecodeSparse(context.Background(), &Sparse{Q: q, Cache: pc, TopK: topk, Indices: idx}, cfg, DefaultPrecision())
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range exS.Out {
		if v != 0 {
			t.Fatalf("out[%d] = %v with no attended slot", i, v)
		}
	}
	for i, v := range exS.LSE {
		if !math.IsInf(v, 1) {
			t.Fatalf("lse[%d] = %v with no attended slot, want +inf", i, v)
		}
	}
}

// TestFP8CachesMatchBF16OfSameValues: an fp8 cache whose dequantized values
// are exact in bf16 (power-of-two scales) decodes exactly like a bf16 cache
// holding those values, in both answers: the fp8 read path is wired right.
func TestFP8CachesMatchBF16OfSameValues(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 6))
	for _, tc := range []struct {
		kind kvcache.Kind
		l, r int
	}{{kvcache.FP8E4M3, 24, 8}, {kvcache.FP8DSMLA, 512, 64}} {
		const T, P = 20, 8
		nb := (T + P - 1) / P
		lay, err := kvcache.NewLayout(tc.kind, tc.l, tc.r, P)
		if err != nil {
			t.Fatal(err)
		}
		lay.DSScale = kvcache.ScalePow2
		before := tensor.New(tensor.U8, nb, P, lay.EntrySize())
		kvc := tensor.FromFloat64s(tensor.BF16, []int{T, tc.l}, randomBF16(rng, T*tc.l, 1))
		kpe := tensor.FromFloat64s(tensor.BF16, []int{T, tc.r}, randomBF16(rng, T*tc.r, 1))
		slots := make([]int64, T)
		for i := range slots {
			slots[i] = int64(i)
		}
		w, err := kvcache.Write(before, kvc, kpe, slots, lay, 0.25)
		if err != nil {
			t.Fatal(err)
		}
		fc, err := kvcache.New(w.After, lay, 0.25)
		if err != nil {
			t.Fatal(err)
		}
		d := tc.l + tc.r
		rows := make([]float64, nb*P*d)
		for s := 0; s < nb*P; s++ {
			fc.RowSlot(s, rows[s*d:(s+1)*d], tensor.F64)
		}
		for i, v := range rows {
			if formats.RoundBF16(v) != v {
				t.Fatalf("%s: dequantized value %d = %v is not exact in bf16; the test needs power-of-two scales", tc.kind, i, v)
			}
		}
		bc := bf16Cache(t, nb, P, tc.l, tc.r, rows)
		table := [][]int{{0, 1, 2}}
		q := Query{B: 1, SQ: 1, H: 2, D: d, Data: randomBF16(rng, 2*d, 0.2)}
		cfg := Config{SoftmaxScale: 0.1, LSE: splitk.DefaultConvention()}
		ex1, xp1, err := Decode(context.Background(), &Dense{Q: q, Cache: fc, Pages: pagesOf(t, table, []int{T}, P, nb)}, cfg, DefaultPrecision())
		if err != nil {
			t.Fatal(err)
		}
		ex2, xp2, err := Decode(context.Background(), &Dense{Q: q, Cache: bc, Pages: pagesOf(t, table, []int{T}, P, nb)}, cfg, DefaultPrecision())
		if err != nil {
			t.Fatal(err)
		}
		sameBits(t, string(tc.kind)+" exact out", ex1.Out, ex2.Out)
		sameBits(t, string(tc.kind)+" expected out", xp1.Out, xp2.Out)
		sameBits(t, string(tc.kind)+" expected lse", xp1.LSE, xp2.LSE)
	}
}

func TestInputErrors(t *testing.T) {
	c := bf16Cache(t, 2, 4, 4, 0, make([]float64, 2*4*4))
	good := func() *Dense {
		return &Dense{Q: Query{B: 1, SQ: 1, H: 1, D: 4, Data: make([]float64, 4)}, Cache: c,
			Pages: pagesOf(t, [][]int{{0, 1}}, []int{6}, 4, 2)}
	}
	cfg := Config{SoftmaxScale: 0.5, LSE: splitk.DefaultConvention()}
	for _, tc := range []struct {
		name string
		mod  func(p *Dense, cfg *Config)
		want string
	}{
		{"q D differs from the cache", func(p *Dense, _ *Config) { p.Q.D = 5; p.Q.Data = make([]float64, 5) }, "tensor q has D = 5"},
		{"softmax_scale NaN", func(_ *Dense, c *Config) { c.SoftmaxScale = math.NaN() }, "softmax_scale"},
		{"block outside the cache", func(p *Dense, _ *Config) { p.Pages.Table[1] = 7 }, "block_table[0,1] = 7 is outside the cache (NB = 2)"},
		{"seq_len beyond the table", func(p *Dense, _ *Config) { p.Pages.SeqLens[0] = 9 }, "seq_lens[0] = 9 exceeds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, cf := good(), cfg
			tc.mod(p, &cf)
			_, _, err := Decode(context.Background(), p, cf, DefaultPrecision())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
	for _, tc := range []struct {
		name   string
		s      int
		bounds []int
		want   string
	}{
		{"not starting at 0", 2, []int{1, 3, 6}, "split_bounds[0,0] = 1"},
		{"decreasing", 2, []int{0, 4, 3}, "split_bounds[0,2] = 3 is below"},
		{"not covering seq_len", 2, []int{0, 3, 5}, "split_bounds[0,2] = 5 but seq_lens[0] = 6"},
		{"wrong S", 3, []int{0, 3, 6}, "split_bounds has 3 entries"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := DecodePartials(context.Background(), good(), cfg, DefaultPrecision(), tc.s, tc.bounds)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestDefaultBounds(t *testing.T) {
	// ceil(10/4) = 3 a split: [0,3) [3,6) [6,9) [9,10); ceil(2/4) = 1: two
	// splits of one token and two empty ones; seq_len 0: all empty.
	got := DefaultBounds([]int{10, 2, 0}, 4)
	want := []int{0, 3, 6, 9, 10, 0, 1, 2, 2, 2, 0, 0, 0, 0, 0}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("DefaultBounds = %v, want %v", got, want)
		}
	}
}

// A decode stops soon after its context is done, even inside one unit of
// work: one request and one worker make the whole context one unit
// (2^22 tokens on the same page of 4096, seconds of work), which stops between
// its blocks of tokens.
func TestDecodeStopsAtTheDeadline(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	const p, l, r, T = 4096, 64, 16, 1 << 22
	cache := bf16Cache(t, 1, p, l, r, randomBF16(rng, p*(l+r), 1))
	q := Query{B: 1, SQ: 1, H: 16, D: l + r}
	q.Data = randomBF16(rng, q.H*q.D, 1)
	pages := pagesOf(t, [][]int{make([]int, T/p)}, []int{T}, p, 1)
	cfg := Config{SoftmaxScale: 0.3, LSE: splitk.DefaultConvention(), Workers: 1}
	for _, run := range []struct {
		name string
		do   func(ctx context.Context) error
	}{
		{"Decode", func(ctx context.Context) error {
			_, _, err := Decode(ctx, &Dense{Q: q, Cache: cache, Pages: pages}, cfg, DefaultPrecision())
			return err
		}},
		{"DecodePartials", func(ctx context.Context) error {
			_, _, err := DecodePartials(ctx, &Dense{Q: q, Cache: cache, Pages: pages}, cfg, DefaultPrecision(), 1, nil)
			return err
		}},
		{"DecodeSparse", func(ctx context.Context) error {
			// fewer slots: their list is made before the units start
			idx := make([]int64, T/8)
			_, _, err := DecodeSparse(ctx, &Sparse{Q: q, Cache: cache, TopK: T / 8, Indices: idx}, cfg, DefaultPrecision())
			return err
		}},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		start := time.Now()
		err := run.do(ctx)
		took := time.Since(start)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: err = %v, want the deadline", run.name, err)
		}
		if took > 2*time.Second {
			t.Errorf("%s: returned after %v, want soon after the 20ms deadline", run.name, took)
		}
	}
}

// TestHeadGroup: the head group a decode's units take, by the list
// scheduling headGroup models (unit cost n·(decodeCost + g·rows)).
func TestHeadGroup(t *testing.T) {
	for _, c := range []struct {
		name                string
		h                   int
		tokens              []int
		rows, workers, want int
	}{
		// one request on two workers: two halves of the heads, each row
		// decoded twice (eight groups of two decoded it eight times)
		{"batch 1, TP8 heads, 2 workers", 16, []int{131072}, 1, 2, 8},
		{"batch 1, 128 heads, 8 workers", 128, []int{4096}, 1, 8, 16},
		// a long and a short request: halving the heads balances the long one
		{"long and short request", 16, []int{131072, 1024}, 1, 2, 8},
		// two equal requests fill two workers with every head a unit
		{"two equal requests", 16, []int{4096, 4096}, 1, 2, 16},
		// three equal requests on two workers: a third unit on either
		// finishes at 1.5x; cutting heads in halves gives 3 units a worker
		// and no idle tail
		{"three equal requests", 16, []int{4096, 4096, 4096}, 1, 2, 8},
		{"four units a worker already", 16, make8(1000), 2, 2, 16},
		// decoding counts: one head a unit would finish no sooner
		// (3 x 1.5n a worker) than every head a unit (4.5n) and decodes
		// each row four times, not once
		{"three requests, four workers", 4, []int{1000, 1000, 1000}, 1, 4, 4},
		{"one head", 1, []int{100}, 1, 4, 1},
		{"no lists", 16, nil, 1, 2, 1},
		{"no heads", 0, []int{5}, 1, 2, 1},
		{"empty requests", 16, []int{0, 0}, 1, 2, 16},
	} {
		if got := headGroup(c.h, c.tokens, c.rows, c.workers); got != c.want {
			t.Errorf("%s: headGroup(%d, %v, %d, %d) = %d, want %d", c.name, c.h, c.tokens, c.rows, c.workers, got, c.want)
		}
	}
}

func make8(n int) []int { return []int{n, n, n, n, n, n, n, n} }
