package mla

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/formats"
)

// ScoreNoise against what it models, measured: the rms error of fp32
// sums of the same D products in random orders, one product at a time.
// The model must not be below the measurement (a correct kernel would then
// fail). For fp32 vectors it may be above it by the ‖q‖∞·‖k‖₂ bound on
// ‖q∘k‖₂ (about 3x for Gaussian vectors) and the u²/3 taken for a
// rounding's variance (up to √2), not by orders of magnitude (which would
// hide real lse bugs). bf16 vectors make 16-bit products, whose addition to
// a partial sum less than 2^8 times larger is exact: most of the roundings
// the model counts do not happen, and it is only an upper bound there.
func TestScoreNoiseMatchesMeasuredFP32Sums(t *testing.T) {
	const d, orders = 576, 400
	for _, tc := range []struct {
		name  string
		mean  float64 // added to every k_d: a nonzero-mean product
		bf16  bool    // q and k rounded to bf16
		ratio float64 // the most the model may exceed the measurement by
	}{
		{"fp32, zero-mean products", 0, false, 10},
		{"fp32, products of one sign", 1.5, false, 10},
		{"bf16, zero-mean products", 0, true, 50},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(5, 6))
			q, k := make([]float64, d), make([]float64, d)
			var exact float64
			for i := range d {
				q[i] = float64(float32(math.Abs(rng.NormFloat64()) + tc.mean))
				k[i] = float64(float32(rng.NormFloat64() + tc.mean))
				if tc.bf16 {
					q[i], k[i] = formats.RoundBF16(q[i]), formats.RoundBF16(k[i])
				}
				exact += q[i] * k[i] // each product exact in float64 (at most 48 bits)
			}
			perm := make([]int, d)
			for i := range perm {
				perm[i] = i
			}
			var se float64
			for range orders {
				rng.Shuffle(d, func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
				var acc float32
				for _, i := range perm {
					acc += float32(q[i] * k[i])
				}
				se += (float64(acc) - exact) * (float64(acc) - exact)
			}
			measured := math.Sqrt(se / orders)
			model := ScoreNoise(0x1p-24, d, normInf(q)*norm2(k), exact)
			t.Logf("score %.4g: measured rms %.3g, model %.3g (%.2fx)", exact, measured, model, model/measured)
			if model < measured || model > tc.ratio*measured {
				t.Errorf("model %.3g against measured %.3g: want at least it and within %gx", model, measured, tc.ratio)
			}
		})
	}
}
