package cuda_test

import (
	"github.com/kcheck-dev/kcheck/internal/evidence"
	"math"
	"strconv"
	"testing"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/cuda"
	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/splitk"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// A CPU model of mla_decode.cu's dense bf16 decode and of splitk_combine,
// operation for operation in fp32 (float32 conversions stop Go from fusing
// anything the kernel does not): 32-token tiles (MLA_BN), scores by m16n8k16
// MMAs (16 exact products summed, then one fp32 rounding a k-step), scaled to
// log2 units before the max, the running max updated once a tile, P =
// ex2(s - m) (exp2 correctly rounded: ex2.approx is within 2 ulp of it),
// the row sum in the kernel's shuffle and warp order, P rounded to bf16, PV
// by two k16 MMAs a tile, out = O * fl(1/l). It stands in for the CUDA
// kernel until the cuda-emu backend runs the source itself; what it cannot
// know (the MMA's internal sum order, ex2.approx's last bits) is below the
// tolerance either way.

const (
	modelD, modelL, modelBN = 576, 512, 32
	modelLog2E, modelLn2    = float32(1.4426950408889634), float32(0.6931471805599453)
)

func mma16(acc float32, a, b []float32) float32 {
	s := 0.0
	for i := range a {
		s += float64(a[i]) * float64(b[i])
	}
	return float32(float64(acc) + s)
}

func exp2f(x float32) float32 { return splitk.Exp2F32(x) }

type modelRow struct {
	out []float32 // normalized O, fp32
	lse float32   // in base e
}

// modelSplit is one CTA row: query q over cache rows toks.
func modelSplit(q []float32, toks [][]float32, scaleLog2 float32) modelRow {
	mRun, lRun := float32(math.Inf(-1)), float32(0)
	acc := make([]float32, modelL)
	sc, pr := make([]float32, modelBN), make([]float32, modelBN)
	pb := make([]float32, modelBN)
	for t0 := 0; t0 < len(toks); t0 += modelBN {
		tmax := float32(math.Inf(-1))
		for j := 0; j < modelBN; j++ {
			sc[j] = float32(math.Inf(-1))
			if t0+j < len(toks) {
				s := float32(0)
				for ks := 0; ks < modelD; ks += 16 {
					s = mma16(s, q[ks:ks+16], toks[t0+j][ks:ks+16])
				}
				sc[j] = float32(s * scaleLog2)
			}
			tmax = max(tmax, sc[j])
		}
		mNew := max(mRun, tmax)
		mUse := mNew
		if math.IsInf(float64(mNew), -1) {
			mUse = 0
		}
		alpha := exp2f(float32(mRun - mUse))
		mRun = mNew
		for j := range pr {
			pr[j] = exp2f(float32(sc[j] - mUse))
			pb[j] = float32(formats.RoundBF16(float64(pr[j])))
		}
		// Four warps of 8 tokens; a thread holds 2, the quad adds by
		// xor-shuffles 1 then 2; the warps' sums are added in order.
		var w [4]float32
		for wn := range w {
			p := pr[8*wn : 8*wn+8]
			s0, s1, s2, s3 := float32(p[0]+p[1]), float32(p[2]+p[3]), float32(p[4]+p[5]), float32(p[6]+p[7])
			w[wn] = float32(float32(s0+s1) + float32(s2+s3))
		}
		tsum := float32(float32(float32(w[0]+w[1])+w[2]) + w[3])
		lRun = float32(math.FMA(float64(lRun), float64(alpha), float64(tsum)))
		for c := range acc {
			acc[c] = float32(acc[c] * alpha)
		}
		var v [16]float32
		for kk := 0; kk < modelBN; kk += 16 {
			for c := range acc {
				for j := 0; j < 16; j++ {
					v[j] = 0
					if t0+kk+j < len(toks) {
						v[j] = toks[t0+kk+j][c]
					}
				}
				acc[c] = mma16(acc[c], pb[kk:kk+16], v[:])
			}
		}
	}
	r := modelRow{out: make([]float32, modelL), lse: float32(math.Inf(-1))}
	if !(lRun > 0) {
		return r
	}
	inv := float32(1 / lRun)
	for c := range acc {
		r.out[c] = float32(acc[c] * inv)
	}
	r.lse = float32(float32(mRun+float32(math.Log2(float64(lRun)))) * modelLn2)
	return r
}

// modelCombine is splitk_combine_impl for one row, base e.
func modelCombine(parts []modelRow) modelRow {
	m := float32(math.Inf(-1))
	for _, p := range parts {
		m = max(m, p.lse)
	}
	r := modelRow{out: make([]float32, modelL), lse: float32(math.Inf(-1))}
	if math.IsInf(float64(m), -1) {
		return r
	}
	wsum := float32(0)
	for _, p := range parts {
		if !math.IsInf(float64(p.lse), -1) {
			wsum = float32(wsum + exp2f(float32(float32(p.lse-m)*modelLog2E)))
		}
	}
	inv := float32(1 / wsum)
	for c := range r.out {
		a := float32(0)
		for _, p := range parts {
			if math.IsInf(float64(p.lse), -1) {
				continue
			}
			w := float32(exp2f(float32(float32(p.lse-m)*modelLog2E)) * inv)
			a = float32(math.FMA(float64(w), float64(p.out[c]), float64(a)))
		}
		r.out[c] = a
	}
	r.lse = float32(m + float32(math.Log(float64(wsum))))
	return r
}

// TestMLAModelJudgedWithItsBlock runs the model on the inconclusive
// shape (bf16 cache, 128 heads, 259 tokens, 5 splits of 52) and judges it
// three-way: with the declared softmax_block = 32 every output passes on its
// merits; the same outputs judged against the 64-token model are logged
// (the issue saw partial_out 1.0-1.7x over tolerance there).
func TestMLAModelJudgedWithItsBlock(t *testing.T) {
	if testing.Short() {
		t.Skip("a 128-head, 259-token decode modelled in fp32 (about 10 s)")
	}
	const name, S = "mla_decode/deepseek-v3/tp1/bf16/p64/ctx-4P+3", 5
	var c *cases.Case
	all, err := cases.Catalog()
	if err != nil {
		t.Fatal(err)
	}
	for i := range all {
		if all[i].Name == name {
			c = &all[i]
		}
	}
	if c == nil {
		t.Fatalf("catalog case %s is gone", name)
	}
	in, err := c.Inputs()
	if err != nil {
		t.Fatal(err)
	}
	meta, err := c.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	qt, kc, bt, sl := in.Tensors["q"], in.Tensors["kv_cache"], in.Tensors["block_table"], in.Tensors["seq_lens"]
	B, SQ, H := qt.Shape[0], qt.Shape[1], qt.Shape[2]
	P, maxBlocks := kc.Shape[1], bt.Shape[1]
	if SQ != 1 || qt.Shape[3] != modelD || kc.DType != tensor.BF16 {
		t.Fatalf("case %s: q %v, cache %s: the model is for s_q = 1, D = 576, a bf16 cache", name, qt.Shape, kc.DType)
	}
	scale, err := strconv.ParseFloat(meta["softmax_scale"], 64)
	if err != nil {
		t.Fatal(err)
	}
	scaleLog2 := float32(scale * math.Log2E) // as run_mla.go passes it
	qv, kv, table, lens := qt.Float64s(), kc.Float64s(), bt.Float64s(), sl.Float64s()
	f32s := func(v []float64) []float32 {
		o := make([]float32, len(v))
		for i, x := range v {
			o[i] = float32(x)
		}
		return o
	}
	out := make([]float64, B*H*modelL)
	lse := make([]float64, B*H)
	pOut := make([]float64, B*H*S*modelL)
	pLSE := make([]float64, B*H*S)
	for b := 0; b < B; b++ {
		n := int(lens[b])
		toks := make([][]float32, n)
		for tk := range toks {
			blk := int(table[b*maxBlocks+tk/P])
			toks[tk] = f32s(kv[(blk*P+tk%P)*modelD : (blk*P+tk%P+1)*modelD])
		}
		per := (n + S - 1) / S
		for h := 0; h < H; h++ {
			q := f32s(qv[(b*H+h)*modelD : (b*H+h+1)*modelD])
			parts := make([]modelRow, S)
			for s := range parts {
				lo, hi := min(n, s*per), min(n, s*per+per)
				parts[s] = modelSplit(q, toks[lo:hi], scaleLog2)
				r := (b*H+h)*S + s
				for cc, v := range parts[s].out {
					pOut[r*modelL+cc] = float64(v)
				}
				pLSE[r] = float64(parts[s].lse)
			}
			comb := modelCombine(parts)
			for cc, v := range comb.out {
				out[(b*H+h)*modelL+cc] = formats.RoundBF16(float64(v))
			}
			lse[b*H+h] = float64(comb.lse)
		}
	}
	outputs := map[string]*tensor.Tensor{
		"out":         tensor.FromFloat64s(tensor.BF16, []int{B, 1, H, modelL}, out),
		"lse":         tensor.FromFloat64s(tensor.F32, []int{B, H, 1}, lse),
		"partial_out": tensor.FromFloat64s(tensor.F32, []int{B, 1, H, S, modelL}, pOut),
		"partial_lse": tensor.FromFloat64s(tensor.F32, []int{B, 1, H, S}, pLSE),
	}
	judge := func(block string) check.Result {
		cap := evidence.Capture{Name: name, Metadata: map[string]string{}, Tensors: map[string]*tensor.Tensor{}}
		for k, v := range meta {
			cap.Metadata[k] = v
		}
		pm, _ := cuda.PrecisionMeta("mla_decode", true)
		for k, v := range pm {
			cap.Metadata[k] = v
		}
		cap.Metadata["num_splits"] = strconv.Itoa(S)
		cap.Metadata["softmax_block"] = block
		for k, v := range in.Tensors {
			cap.Tensors[k] = v
		}
		for k, v := range outputs {
			cap.Tensors[k] = v
		}
		return check.Run(t.Context(), cap, check.Options{})
	}
	if pm, _ := cuda.PrecisionMeta("mla_decode", true); pm["softmax_block"] != "32" {
		t.Fatalf("the cuda backend declares softmax_block %q for mla_decode, want 32 (MLA_BN)", pm["softmax_block"])
	}
	for _, block := range []string{"32", "64"} {
		r := judge(block)
		if r.Error != nil {
			t.Fatalf("softmax_block %s: %s", block, *r.Error)
		}
		for _, ch := range r.Checks {
			t.Logf("softmax_block %s: %s %s (%s)", block, ch.Tensor, ch.Verdict, ch.Reason)
		}
		if block == "32" && r.Verdict != check.Pass {
			t.Errorf("the model of the 32-token kernel, judged with softmax_block 32: %s, want pass", r.Verdict)
		}
		t.Logf("softmax_block %s: %s", block, r.Verdict)
	}
}
