package mla

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/compare"
	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// seqFP32LSE is the lse a correct fp32 decode writes whose scores are
// accumulated one product at a time in d order (not Expected's MMA blocks
// of 16): s = fp32(fp32(Σ q·k)·fp32(scale)), m = max s, lse = fp32(m +
// log Σ exp(s - m)), all in fp32, over the first visible(b) tokens.
func seqFP32LSE(in Inputs, scale float64, visible func(b int) int) *tensor.Tensor {
	q, cache, bt := in.Tensors["q"], in.Tensors["kv_cache"], in.Tensors["block_table"]
	B, H, D := q.Shape[0], q.Shape[2], q.Shape[3]
	P, mb := cache.Shape[1], bt.Shape[1]
	out := make([]float64, B*H)
	for b := range B {
		for h := range H {
			n := visible(b)
			s := make([]float32, n)
			m := float32(math.Inf(-1))
			for t := range n {
				row := (int(bt.Float64At(b*mb+t/P))*P + t%P) * D
				var acc float32
				for d := range D {
					acc += float32(q.Float64At((b*H+h)*D+d)) * float32(cache.Float64At(row+d))
				}
				s[t] = acc * float32(scale)
				m = max(m, s[t])
			}
			var sum float32
			for _, x := range s {
				sum += float32(math.Exp(float64(x - m)))
			}
			out[b*H+h] = float64(m + float32(math.Log(float64(sum))))
		}
	}
	return tensor.FromFloat64s(tensor.F32, []int{B, H, 1}, out)
}

// An lse over a few tokens whose scores cancel (Σ_d|q_d·k_d| ≈ 370 for
// scores of tens, as DeepSeek-V3's 576-dim absorbed dots do) is where a
// correct fp32 kernel summing its scores in another order errs by more
// than Expected's own floor: SGLang 0.5.23's Triton decode failed such a
// catalog case at 3.15x (internal/check TestSGLangTritonDecodeWorkerCapture
// holds that capture). Output.Noise (reference/mla ScoreNoise) lets such a
// kernel pass, and still fails an lse off by a softmax scale rounded to
// bf16 (1.7e-4 relative) or one token short.
func TestMLADecodeLSEScoreNoise(t *testing.T) {
	const scale = 0.1352337788608801
	seqLens := []int{3, 2, 4, 3, 2, 4, 3, 2}
	in := mlaInputs(rand.New(rand.NewPCG(11, 12)), seqLens, 1, 16, 512, 64, 12)
	in.Params["softmax_scale"] = "0.1352337788608801"
	in.Params["latent_dim"] = "512"
	k, _ := Lookup("mla_decode")
	outs, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	lse := outputNamed(t, outs, "lse")
	all := func(b int) int { return seqLens[b] }
	for _, tc := range []struct {
		name   string
		actual *tensor.Tensor
		want   compare.Verdict
	}{
		{"sequential fp32 scores", seqFP32LSE(in, scale, all), compare.Pass},
		{"softmax scale rounded to bf16", seqFP32LSE(in, formats.RoundBF16(scale), all), compare.Fail},
		{"the last token not attended", seqFP32LSE(in, scale, func(b int) int { return seqLens[b] - 1 }), compare.Fail},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := compare.Compare(lse, tc.actual, compare.DefaultPolicy(), compare.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if c.Verdict != tc.want {
				t.Errorf("verdict %s (%s), want %s", c.Verdict, c.Reason, tc.want)
			}
			t.Logf("%s: %s", c.Verdict, c.Reason)
		})
	}
}
