package mla

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"math"
	"os"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/kvcache"
	"github.com/kcheck-dev/kcheck/reference/splitk"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// TestSparseModel1MatchesFlashMLARef: DeepSeek-V4's sparse decode, V = the
// whole 512-dim row, against FlashMLA's own reference (tests/ref.py
// ref_sparse_attn_decode over tests/quant.py's MODEL1 caches:
// testdata/flashmla_ref_model1*.json, python/tests/gen_model1_ref_vectors.py):
// one cache alone, and as DeepSeek-V4 decodes (a sliding-window cache with
// topk_length and an attention sink, a compressed cache of pages of 2 as
// the extra KV scope with its extra_topk_length).
//
// ref.py computes in fp32 (torch's CPU matmul) and rounds out to bf16, so
// its out is bf16(x) for an x within the fp32 error of the exact answer.
// That error is bounded, element by element, the way Higham bounds a
// computed sum: each score s_j = scale·q·k_j is within γ_D·scale·Σ|q_i k_ij|
// (γ_n = n·u/(1-n·u), u = 2^-24), each weight p_j = exp(s_j - lse) is then
// off by at most p_j·(2δ + 4u) with δ the largest score error, and the
// weighted sum of topk values adds γ_topk·Σ p_j|v_j|. So out[h, c] must lie
// between bf16(exact - b) and bf16(exact + b) with b = (2δ + 4u +
// γ_topk)·Σ_j p_j|v_jc|, and lse within δ + 4u·(|lse| + 1); a sink factor
// f = 1/(1 + exp(sink - lse)) scales the bound and, its derivative in lse
// being at most f, adds (δ + 4u)·|out|. The bound comes
// from the arithmetic, not from these data; most elements are bf16(exact)
// itself. Planting V = L (448) in the engine fails the length check, and a
// reader that leaves the rope dims at zero fails the values.
func TestSparseModel1MatchesFlashMLARef(t *testing.T) {
	for _, name := range []string{"flashmla_ref_model1.json", "flashmla_ref_model1_extra.json"} {
		t.Run(name, func(t *testing.T) { testSparseModel1Ref(t, "testdata/"+name) })
	}
}

func testSparseModel1Ref(t *testing.T, path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Source string
		NB     int     `json:"num_blocks"`
		P      int     `json:"page_size"`
		H      int     `json:"heads"`
		D      int     `json:"dim"`
		TopK   int     `json:"topk"`
		Scale  float64 `json:"softmax_scale"`
		XNB    int     `json:"extra_num_blocks"`
		XP     int     `json:"extra_page_size"`
		XTopK  int     `json:"extra_topk"`
	}
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	bytesOf := func(key string) []byte {
		s, _ := raw[key].(string)
		v, err := hex.DecodeString(s)
		if err != nil || len(v) == 0 {
			t.Fatalf("%s: %s: %v", path, key, err)
		}
		return v
	}
	ints := func(key string, n int) []int64 {
		it := &tensor.Tensor{DType: tensor.I32, Shape: []int{n}, Data: bytesOf(key)}
		v := make([]int64, n)
		for i := range v {
			v[i] = it.Int64At(i)
		}
		return v
	}
	lay, err := kvcache.NewLayout(kvcache.FP8DSMLAModel1, kvcache.M1Nope, kvcache.M1Rope, f.P)
	if err != nil {
		t.Fatal(err)
	}
	c, err := kvcache.New(&tensor.Tensor{DType: tensor.U8, Shape: []int{f.NB, f.P, kvcache.M1EntryBytes}, Data: bytesOf("cache_u8")}, lay, 0)
	if err != nil {
		t.Fatal(err)
	}
	q := (&tensor.Tensor{DType: tensor.BF16, Shape: []int{f.H * f.D}, Data: bytesOf("q_bf16")}).Float64s()
	idx := ints("indices_i32", f.TopK)
	refOut := (&tensor.Tensor{DType: tensor.BF16, Shape: []int{f.H * f.D}, Data: bytesOf("out_bf16")}).Float64s()
	refLSE := (&tensor.Tensor{DType: tensor.F32, Shape: []int{f.H}, Data: bytesOf("lse_f32")}).Float64s()

	sp := &Sparse{Q: Query{B: 1, SQ: 1, H: f.H, D: f.D, Data: q}, Cache: c, TopK: f.TopK, Indices: idx}
	if _, ok := raw["extra_cache_u8"]; ok {
		xlay := lay
		xlay.PageSize = f.XP
		xc, err := kvcache.New(&tensor.Tensor{DType: tensor.U8, Shape: []int{f.XNB, f.XP, kvcache.M1EntryBytes}, Data: bytesOf("extra_cache_u8")}, xlay, 0)
		if err != nil {
			t.Fatal(err)
		}
		sp.Extra = &SparseScope{Cache: xc, TopK: f.XTopK, Indices: ints("extra_indices_i32", f.XTopK), TopKLength: ints("extra_topk_length_i32", 1)}
		sp.TopKLength = ints("topk_length_i32", 1)
		sp.AttnSink = (&tensor.Tensor{DType: tensor.F32, Shape: []int{f.H}, Data: bytesOf("attn_sink_f32")}).Float64s()
	}
	cfg := Config{SoftmaxScale: f.Scale, LSE: splitk.Convention{Base: splitk.BaseE, Empty: math.Inf(1)}, ValueDims: f.D}
	ex, _, err := DecodeSparse(context.Background(), sp, cfg, DefaultPrecision())
	if err != nil {
		t.Fatal(err)
	}
	if len(ex.Out) != len(refOut) {
		t.Fatalf("out has %d values, FlashMLA's reference %d: V must be the whole %d-dim row", len(ex.Out), len(refOut), f.D)
	}
	gamma := func(n int) float64 { nu := float64(n) * 0x1p-24; return nu / (1 - nu) }
	const u = 0x1p-24
	var rows [][]float64
	for _, s := range sp.ValidSlots(0, 0) {
		rows = append(rows, make([]float64, f.D))
		c.RowSlot(s, rows[len(rows)-1], tensor.F64)
	}
	for _, s := range sp.ExtraSlots(0, 0) {
		rows = append(rows, make([]float64, f.D))
		sp.Extra.Cache.RowSlot(s, rows[len(rows)-1], tensor.F64)
	}
	if sp.Extra != nil && len(sp.ExtraSlots(0, 0)) == 0 {
		t.Fatal("the extra scope attends nothing: the data do not exercise it")
	}
	bf := func(x float64) float64 { return float64(formats.BF16Decode(formats.BF16Encode(float32(x)))) }
	same, ropeNonzero := 0, 0
	for h := 0; h < f.H; h++ {
		qh := q[h*f.D : (h+1)*f.D]
		delta := 0.0 // the largest fp32 score error
		p := make([]float64, len(rows))
		for j, r := range rows {
			dot, mag := 0.0, 0.0
			for i, x := range r {
				dot += qh[i] * x
				mag += math.Abs(qh[i] * x)
			}
			p[j] = f.Scale * dot
			delta = max(delta, gamma(f.D)*f.Scale*mag)
		}
		lse := math.Inf(-1)
		for _, s := range p {
			lse = math.Max(lse, s)
		}
		sum := 0.0
		for _, s := range p {
			sum += math.Exp(s - lse)
		}
		lse += math.Log(sum)
		for j := range p {
			p[j] = math.Exp(p[j] - lse)
		}
		if d := math.Abs(refLSE[h] - ex.LSE[h]); d > delta+4*u*(math.Abs(ex.LSE[h])+1) {
			t.Errorf("head %d: lse %v, FlashMLA's %v: off by %g, beyond fp32's bound %g", h, ex.LSE[h], refLSE[h], d, delta+4*u*(math.Abs(ex.LSE[h])+1))
		}
		sinkF := 1.0
		if sp.AttnSink != nil {
			sinkF = 1 / (1 + math.Exp(sp.AttnSink[h]-lse))
		}
		for col := 0; col < f.D; col++ {
			mass := 0.0
			for j, r := range rows {
				mass += p[j] * math.Abs(r[col])
			}
			bound := sinkF * (2*delta + 4*u + gamma(len(rows))) * mass
			if sp.AttnSink != nil {
				bound += (delta + 4*u) * math.Abs(ex.Out[h*f.D+col])
			}
			x, got := ex.Out[h*f.D+col], refOut[h*f.D+col]
			if lo, hi := bf(x-bound), bf(x+bound); got < lo || got > hi {
				t.Fatalf("head %d column %d: FlashMLA's out %v is outside bf16([%v ± %g]) = [%v, %v]", h, col, got, x, bound, lo, hi)
			}
			if got == bf(x) {
				same++
			}
			if col >= kvcache.M1Nope && got != 0 {
				ropeNonzero++
			}
		}
	}
	if ropeNonzero == 0 {
		t.Fatal("FlashMLA's out has no nonzero rope column: the data do not exercise V = the whole row")
	}
	t.Logf("%d of %d out elements are bf16(kcheck's exact answer); the rest within fp32's error of it (%s)", same, len(refOut), f.Source)
}
