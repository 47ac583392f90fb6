package signature

import (
	"math"
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
