package compare

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// The three-way policy's targets, on a synthetic decode-attention output
// built to mirror MLA decode: one query per head attends n = 4096 tokens of
// bf16 values, out[h,c] = Σ_j p_hj·v_jc / Σ_j p_hj with p = exp(s - max s).
// The EXACT side is float64; EXPECTED is one correct fp32 kernel (scores'
// exp in fp32, P rounded to bf16 before PV, in-order fp32 accumulation, bf16
// output). Every other correct kernel (other order, 4 splits, exp2, online
// softmax, row sum of rounded P) must pass; bf16 accumulation of PV and a
// corrupted element must fail; an output one bf16 ulp off everywhere must
// pass. The data are seeded and heterogeneous on purpose: heads range from
// a flat softmax to a peaky one, and value channels have different scales
// and nonzero means, as real latent caches do (outlier channels).

const (
	attnH    = 16
	attnL    = 64
	attnN    = 4096
	attnSeed = 20240611
)

type attnData struct {
	n, h int
	s    [][]float32      // scores per head (fp32, as a kernel computes them)
	v    [][attnL]float32 // bf16 values, one row per token
}

func newAttnData() *attnData { return newAttnDataN(attnN, attnH, attnSeed) }

func newAttnDataN(n, heads int, seed uint64) *attnData {
	r := rand.New(rand.NewPCG(seed, 1))
	d := &attnData{n: n, h: heads, s: make([][]float32, heads), v: make([][attnL]float32, n)}
	var sigma, mu [attnL]float64
	for c := range sigma {
		sigma[c] = math.Exp(0.5 * r.NormFloat64())
		mu[c] = 0.3 * r.NormFloat64() * sigma[c]
	}
	for j := range d.v {
		for c := 0; c < attnL; c++ {
			d.v[j][c] = float32(formats.RoundBF16(mu[c] + sigma[c]*r.NormFloat64()))
		}
	}
	for h := 0; h < heads; h++ {
		sh := 0.5 + 2.5*float64(h)/float64(max(heads-1, 1)) // flat (0.5) to peaky (3)
		d.s[h] = make([]float32, n)
		for j := range d.s[h] {
			d.s[h][j] = float32(sh * r.NormFloat64())
		}
	}
	return d
}

func bf16(x float32) float32 { return float32(formats.RoundBF16(float64(x))) }

func maxOf(s []float32) float32 {
	m := float32(math.Inf(-1))
	for _, x := range s {
		m = max(m, x)
	}
	return m
}

func exp32(x float32) float32 { return float32(math.Exp(float64(x))) }

// exact is the float64 reference.
func (d *attnData) exact() []float64 {
	out := make([]float64, d.h*attnL)
	for h := 0; h < d.h; h++ {
		m := float64(maxOf(d.s[h]))
		var l float64
		var acc [attnL]float64
		for j, s := range d.s[h] {
			p := math.Exp(float64(s) - m)
			l += p
			for c := range acc {
				acc[c] += p * float64(d.v[j][c])
			}
		}
		for c := range acc {
			out[h*attnL+c] = acc[c] / l
		}
	}
	return out
}

// kernelOpts describes one emulated kernel.
type kernelOpts struct {
	reverse    bool    // accumulate tokens last to first
	exp2       bool    // p = exp2(s·log2e - m·log2e) in fp32
	sumRounded bool    // row sum over bf16-rounded P
	bf16Acc    bool    // FAULT: PV accumulator in bf16
	fp8P       bool    // FAULT: P rounded to E4M3 instead of bf16
	scale      float32 // FAULT when not 0 or 1: scores scaled (a wrong softmax_scale)
}

// flat is a single-pass fp32 kernel (no splitting, global max).
func (d *attnData) flat(o kernelOpts) []float64 {
	out := make([]float64, d.h*attnL)
	const log2e = float32(math.Log2E)
	for h := 0; h < d.h; h++ {
		scores := d.s[h]
		if o.scale != 0 && o.scale != 1 {
			scores = make([]float32, d.n)
			for j, s := range d.s[h] {
				scores[j] = s * o.scale
			}
		}
		m := maxOf(scores)
		var l float32
		var acc [attnL]float32
		for jj := 0; jj < d.n; jj++ {
			j := jj
			if o.reverse {
				j = d.n - 1 - jj
			}
			var p float32
			if o.exp2 {
				p = float32(math.Exp2(float64(scores[j]*log2e - m*log2e)))
			} else {
				p = exp32(scores[j] - m)
			}
			pb := bf16(p)
			if o.fp8P {
				r, _ := formats.E4M3FN.Round(float64(p), formats.Saturate)
				pb = float32(r)
			}
			if o.sumRounded {
				l += pb
			} else {
				l += p
			}
			for c := range acc {
				acc[c] += float32(pb * d.v[j][c])
				if o.bf16Acc {
					acc[c] = bf16(acc[c])
				}
			}
		}
		for c := range acc {
			out[h*attnL+c] = float64(acc[c] / l)
		}
	}
	return out
}

// splits is flash-decoding: 4 splits, each with its own max, P rounded to
// bf16 relative to it, an fp32 partial output and lse, combined in fp32.
func (d *attnData) splits(S int) []float64 {
	out := make([]float64, d.h*attnL)
	for h := 0; h < d.h; h++ {
		po := make([][attnL]float32, S)
		lse := make([]float32, S)
		for s := 0; s < S; s++ {
			lo, hi := s*d.n/S, (s+1)*d.n/S
			m := maxOf(d.s[h][lo:hi])
			var l float32
			var acc [attnL]float32
			for j := lo; j < hi; j++ {
				p := exp32(d.s[h][j] - m)
				l += p
				pb := bf16(p)
				for c := range acc {
					acc[c] += float32(pb * d.v[j][c])
				}
			}
			for c := range acc {
				po[s][c] = acc[c] / l
			}
			lse[s] = m + float32(math.Log(float64(l)))
		}
		M := maxOf(lse)
		var wsum float32
		var acc [attnL]float32
		for s := 0; s < S; s++ {
			w := exp32(lse[s] - M)
			wsum += w
			for c := range acc {
				acc[c] += float32(w * po[s][c])
			}
		}
		for c := range acc {
			out[h*attnL+c] = float64(acc[c] / wsum)
		}
	}
	return out
}

// online is FlashAttention's online softmax over blocks of 64 tokens: P is
// rounded to bf16 relative to the running max, and the accumulator and row
// sum are rescaled when the max grows.
func (d *attnData) online(block int) []float64 {
	out := make([]float64, d.h*attnL)
	for h := 0; h < d.h; h++ {
		m := float32(math.Inf(-1))
		var l float32
		var acc [attnL]float32
		for b := 0; b < d.n; b += block {
			mNew := max(m, maxOf(d.s[h][b:b+block]))
			scale := exp32(m - mNew)
			l *= scale
			for c := range acc {
				acc[c] *= scale
			}
			for j := b; j < b+block; j++ {
				p := exp32(d.s[h][j] - mNew)
				l += p
				pb := bf16(p)
				for c := range acc {
					acc[c] += float32(pb * d.v[j][c])
				}
			}
			m = mNew
		}
		for c := range acc {
			out[h*attnL+c] = float64(acc[c] / l)
		}
	}
	return out
}

// stepBF16 moves a bf16 value one code away from zero (up > 0) or toward it.
func stepBF16(x float64, up int) float64 {
	b := formats.BF16FromFloat64(x)
	if b&0x7FFF == 0 && up < 0 {
		b ^= 0x8000 // from ±0 toward zero means crossing to the other sign's least subnormal
		up = 1
	}
	if up > 0 {
		b++
	} else {
		b--
	}
	return float64(formats.BF16Decode(b))
}

func attnOutput(exact, expected []float64) kernel.Output {
	return kernel.Output{Name: "out", Shape: []int{attnH, attnL}, DType: tensor.BF16,
		Exact: kernel.Dense(exact), Expected: kernel.Dense(expected), Mode: kernel.Numeric, Reduction: attnN,
		Coords: kernel.Coords{Axes: []kernel.CoordKind{"head", "latent"}}}
}

// step moves a value of dtype dt one code away from zero (up > 0) or toward it.
func step(dt tensor.DType, x float64, up int) float64 {
	if dt == tensor.F32 {
		f := float32(x)
		if up > 0 {
			return float64(math.Nextafter32(f, float32(math.Copysign(math.Inf(1), x))))
		}
		return float64(math.Nextafter32(f, float32(math.Copysign(math.Inf(1), -x))))
	}
	return stepBF16(x, up)
}

func roundTo(dt tensor.DType, v []float64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		if dt == tensor.BF16 {
			out[i] = formats.RoundBF16(x)
		} else {
			out[i] = float64(float32(x))
		}
	}
	return out
}

// TestThreeWayAttentionTargets runs the targets with a bf16 output (where
// the output rounding dominates the floor) and an fp32 one (where the bf16
// rounding of P does, so the bound rests on the floor's row × column scale).
func TestThreeWayAttentionTargets(t *testing.T) {
	d := newAttnData()
	exact := d.exact()
	for _, dt := range []tensor.DType{tensor.BF16, tensor.F32} {
		t.Run(string(dt), func(t *testing.T) { attentionTargets(t, d, exact, dt) })
	}
}

func attentionTargets(t *testing.T, d *attnData, exact []float64, dt tensor.DType) {
	expected := roundTo(dt, d.flat(kernelOpts{}))
	o := attnOutput(exact, expected)
	o.DType = dt

	// (e) corrupted element: the largest |exact| of head 5 with the top
	// mantissa bit of its bf16 form flipped (a 25-50% change of a
	// typical-size value).
	corrupt := append([]float64(nil), expected...)
	ci := 5 * attnL
	for c := 0; c < attnL; c++ {
		if math.Abs(exact[5*attnL+c]) > math.Abs(exact[ci]) {
			ci = 5*attnL + c
		}
	}
	corrupt[ci] = float64(formats.BF16Decode(formats.BF16FromFloat64(corrupt[ci]) ^ 0x0040))

	// (f) one ulp off everywhere: away from exact (the worst case), and in
	// a random direction.
	away := make([]float64, len(expected))
	random := make([]float64, len(expected))
	r := rand.New(rand.NewPCG(attnSeed, 2))
	for i, e := range expected {
		// Away from exact: up in magnitude when expected is already on the
		// far side of exact from zero, down otherwise.
		dir := -1
		if (e >= exact[i]) == (e >= 0) {
			dir = 1
		}
		away[i] = step(dt, e, dir)
		random[i] = step(dt, e, 2*r.IntN(2)-1)
	}

	cases := []struct {
		name   string
		actual []float64
		want   Verdict
	}{
		{"(b) expected itself", expected, Pass},
		{"(c) reverse order", d.flat(kernelOpts{reverse: true}), Pass},
		{"(c) 4 splits combined", d.splits(4), Pass},
		{"(c) 16 splits combined", d.splits(16), Pass},
		{"(c) exp2 of log2e-scaled scores", d.flat(kernelOpts{exp2: true}), Pass},
		{"(c) online softmax, 64-token blocks", d.online(64), Pass},
		{"(c) row sum of bf16-rounded P", d.flat(kernelOpts{sumRounded: true}), Pass},
		{"(c) exp2 + reverse + rounded row sum", d.flat(kernelOpts{exp2: true, reverse: true, sumRounded: true}), Pass},
		{"(d) FAULT bf16 PV accumulation", d.flat(kernelOpts{bf16Acc: true}), Fail},
		{"(d) FAULT P rounded to e4m3", d.flat(kernelOpts{fp8P: true}), Fail},
		{"(d) FAULT softmax_scale 1% off", d.flat(kernelOpts{scale: 1.01}), Fail},
		{"(e) FAULT one corrupted element", corrupt, Fail},
		{"(f) 1 ulp away from exact everywhere", away, Pass},
		{"(f) 1 ulp in a random direction everywhere", random, Pass},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			act := tensor.FromFloat64s(dt, []int{attnH, attnL}, tc.actual)
			c, err := Compare(o, act, ThreeWay{}, Options{WorstK: 3})
			if err != nil {
				t.Fatal(err)
			}
			m := c.Metrics
			t.Logf("%s %-42s %-5s max err/tol %7.3f  rmse/bound %6.3f  cos/bound %7.3f  over %3d  rmse %.3g floor %.3g",
				dt, tc.name, c.Verdict, float64(m.MaxExcess), float64(m.RMSERatio), float64(m.CosDiffRatio), m.OverTol,
				float64(m.RMSE), float64(m.FloorRMSE))
			if c.Verdict != tc.want {
				t.Errorf("verdict %s (%s), want %s\ntolerance: %s", c.Verdict, c.Reason, tc.want, c.Tolerance)
			}
			if tc.want == Pass && c.Signature != nil {
				t.Errorf("a passing check carries a signature %+v", c.Signature)
			}
			if tc.want == Fail && c.Signature == nil {
				t.Errorf("a failing check carries no signature")
			}
			if c.Signature != nil {
				t.Logf("signature %s: %s", c.Signature.Pattern, c.Signature.Detail)
			}
		})
	}
	// The corrupted element must be the worst one reported.
	act := tensor.FromFloat64s(dt, []int{attnH, attnL}, corrupt)
	c, _ := Compare(o, act, ThreeWay{}, Options{})
	if len(c.Worst) == 0 || c.Worst[0].Flat != ci || c.Worst[0].Coords[0] != (Coord{"head", 5}) {
		t.Errorf("worst elements %+v, want flat index %d (head 5) first", c.Worst, ci)
	}
}

// TestUnitRoundoffTooTightForAttention documents why the provisional policy
// was replaced: it ignores the bf16 rounding of P, so correct kernels fail.
func TestUnitRoundoffTooTightForAttention(t *testing.T) {
	d := newAttnData()
	o := attnOutput(d.exact(), roundTo(tensor.BF16, d.flat(kernelOpts{})))
	act := tensor.FromFloat64s(tensor.BF16, []int{attnH, attnL}, d.splits(4))
	c, err := Compare(o, act, UnitRoundoff{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("unit-roundoff on a correct 4-split kernel: %s, max err/tol %.3g", c.Verdict, float64(c.Metrics.MaxExcess))
	if c.Verdict == Pass {
		t.Errorf("the unit-roundoff policy passes the 4-split kernel; this test documents that it cannot (P is rounded to bf16)")
	}
}

// TestBF16AccumulationGrowsWithContext: the bf16-accumulation fault on
// requests of 256 to 4096 tokens fails, and its signature names the growth
// with the context length (each request's context_len is a derived
// coordinate, as the MLA kernel files provide).
func TestBF16AccumulationGrowsWithContext(t *testing.T) {
	lens := []int{256, 512, 1024, 2048, 4096}
	const heads = 4
	var exact, expected, faulty []float64
	for b, n := range lens {
		d := newAttnDataN(n, heads, attnSeed+uint64(b))
		exact = append(exact, d.exact()...)
		expected = append(expected, roundTo(tensor.BF16, d.flat(kernelOpts{}))...)
		faulty = append(faulty, d.flat(kernelOpts{bf16Acc: true})...)
	}
	shape := []int{len(lens), heads, attnL}
	o := kernel.Output{Name: "out", Shape: shape, DType: tensor.BF16, Exact: kernel.Dense(exact), Expected: kernel.Dense(expected),
		Reduction: lens[len(lens)-1], Coords: kernel.Coords{Axes: []kernel.CoordKind{"request", "head", "latent"},
			Derived: func(dst []kernel.Coord, idx []int) []kernel.Coord {
				return append(dst, kernel.Coord{Kind: "context_len", Value: lens[idx[0]]})
			}}}
	c, err := Compare(o, tensor.FromFloat64s(tensor.BF16, shape, faulty), ThreeWay{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Verdict != Fail || c.Signature == nil || c.Signature.Pattern != "growth_with_context" {
		t.Fatalf("verdict %s signature %+v, want fail with growth_with_context", c.Verdict, c.Signature)
	}
	t.Logf("%s", c.Signature.Detail)
}

// TestAggregateCatchesSystematicBias: every element moved two bf16 ulps
// away from zero stays within the band of its own bound (one ulp plus κ
// times the floor's scale: alone, at most inconclusive), but the tensor's
// rmse leaves ρ·floor + 1 ulp, and the aggregate check makes it a fail.
func TestAggregateCatchesSystematicBias(t *testing.T) {
	d := newAttnData()
	o := attnOutput(d.exact(), roundTo(tensor.BF16, d.flat(kernelOpts{})))
	biased := make([]float64, o.Expected.Len())
	for i, e := range kernel.Float64s(o.Expected) {
		biased[i] = stepBF16(stepBF16(e, 1), 1)
	}
	c, err := Compare(o, tensor.FromFloat64s(tensor.BF16, o.Shape, biased), ThreeWay{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	m := c.Metrics
	t.Logf("2-ulp bias: %s, max err/tol %.3f, rmse/bound %.3f, cos/bound %.3f; %s", c.Verdict, float64(m.MaxExcess), float64(m.RMSERatio), float64(m.CosDiffRatio), c.Reason)
	if c.Verdict != Fail || m.MaxExcess > 2 || m.RMSERatio <= 1 || !strings.Contains(c.Reason, "systematic") {
		t.Errorf("verdict %s (%s), worst err/tol %v, rmse ratio %v: want a fail from the aggregate alone", c.Verdict, c.Reason, m.MaxExcess, m.RMSERatio)
	}
	if c.Signature == nil {
		t.Errorf("no signature for an aggregate failure")
	} else {
		t.Logf("signature %s: %s", c.Signature.Pattern, c.Signature.Detail)
	}
}
