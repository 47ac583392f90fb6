package signature

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/kernel"
)

// A large output is profiled from a sample of its clean elements, but every
// failing element is in the largest values and the failing counts, at its
// own coordinate, and the counts estimate the whole.
func TestProfileSampling(t *testing.T) {
	const n = 100000
	o := kernel.Output{Name: "out", Shape: []int{n}, Coords: kernel.Coords{Axes: []kernel.CoordKind{kernel.KindToken}}}
	excess := make(kernel.Dense, n)
	for i := range excess {
		excess[i] = 0.5
	}
	excess[7], excess[50303] = 10, math.Inf(1)
	for _, p := range []*Profile{
		NewProfile(o, excess, Options{MaxElements: 1000}),
		func() *Profile {
			_, p := AnalyzeProfile(o, excess, Options{MaxElements: 1000, Profile: true})
			return p
		}(),
	} {
		if p.Rate != 0.01 {
			t.Fatalf("rate %v, want 0.01", p.Rate)
		}
		tok := p.Coords()[0]
		var count float64
		fails, found := 0, map[int]float64{}
		for j, v := range tok.Values {
			count += tok.Count[j]
			fails += tok.Failing[j]
			if tok.Failing[j] > 0 {
				found[v] = tok.Max[j]
			}
		}
		if math.Abs(count-n) > 0.1*n || fails != 2 || found[7] != 10 || !math.IsInf(found[50303], 1) || len(tok.Values) > 2000 {
			t.Errorf("count %.0f (want about %d), failing %d (want 2), failing values %v, %d values kept", count, n, fails, found, len(tok.Values))
		}
	}
}

// TestVisitsAreTheSampledAndWeighted: collect's elements are those the
// definition picks, in index order, each with InSample's choice: every
// element where the weighted ones are unknown or nothing is sampled, else
// the weighted and the sampled, across the blocks the sample bits are
// made in.
func TestVisitsAreTheSampledAndWeighted(t *testing.T) {
	defer func(b int) { sampleBlock = b }(sampleBlock)
	sampleBlock = 3 // words: blocks of 192 elements, whose edges the sizes below cross
	r := rand.New(rand.NewPCG(3, 3))
	for _, N := range []int{0, 1, 63, 64, 65, 191, 192, 193, 1000, 5000} {
		for _, rate := range []float64{1, 0.5, 0.01, 1e-5} {
			for _, withWeights := range []bool{false, true} {
				var weighted []uint64
				if withWeights {
					weighted = make([]uint64, (N+63)/64)
					for w := range weighted {
						if r.IntN(4) == 0 {
							weighted[w] = r.Uint64() & r.Uint64()
						}
					}
					if N%64 != 0 && len(weighted) > 0 {
						weighted[len(weighted)-1] &= 1<<(N%64) - 1
					}
				}
				var want []int
				for i := 0; i < N; i++ {
					if weighted != nil && rate < 1 && weighted[i>>6]>>(i&63)&1 == 0 && !InSample(i, rate) {
						continue
					}
					want = append(want, i)
				}
				k := 0
				for i, sampled := range visits(N, weighted, rate) {
					if k >= len(want) || i != want[k] {
						t.Fatalf("N=%d rate=%g weights=%v: visit %d is element %d; want %v", N, rate, withWeights, k, i, want[k:min(k+1, len(want))])
					}
					if sampled != InSample(i, rate) {
						t.Fatalf("N=%d rate=%g: element %d sampled %v; InSample says %v", N, rate, i, sampled, !sampled)
					}
					k++
				}
				if k != len(want) {
					t.Fatalf("N=%d rate=%g weights=%v: %d visits, want %d", N, rate, withWeights, k, len(want))
				}
			}
		}
	}
}
