package signature

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Each case plants a bug's footprint in a background of noise (excess
// uniform in [0, 0.8): every correct element is under its tolerance) and
// asks Analyze to name it. The footprints are what the bugs of DESIGN.md
// leave: a page off-by-one hits offset 0 of every page, a split-K bug one
// split, a nibble swap every other element, a wrong block scale one
// 16-element block, a masking bug the tail of the last page, a head index
// slip one head, bf16 accumulation an error growing with context.

type synth struct {
	shape   []int
	axes    []kernel.CoordKind
	derived func(idx []int) []kernel.Coord
	// bug returns the excess of a faulty element (0: not faulty).
	bug func(idx []int, r *rand.Rand) float64
}

func (s synth) build(seed uint64) (kernel.Output, []float64) {
	r := rand.New(rand.NewPCG(seed, 7))
	N := tensor.NumElements(s.shape)
	ex := make([]float64, N)
	for i := range ex {
		ex[i] = 0.8 * r.Float64()
		if s.bug != nil {
			if b := s.bug(tensor.Unravel(i, s.shape), r); b > 0 {
				ex[i] = b
			}
		}
	}
	o := kernel.Output{Name: "out", Shape: s.shape, Exact: make(kernel.Dense, N), Expected: make(kernel.Dense, N),
		Coords: kernel.Coords{Axes: s.axes, Derived: appending(s.derived)}}
	return o, ex
}

// appending is f as kernel.Coords.Derived, which appends: the cases
// below write their coordinates as one slice each.
func appending(f func(idx []int) []kernel.Coord) func([]kernel.Coord, []int) []kernel.Coord {
	if f == nil {
		return nil
	}
	return func(dst []kernel.Coord, idx []int) []kernel.Coord { return append(dst, f(idx)...) }
}

// Paged token-major layout: token t lives on page t/P at offset t%P.
func paged(P, lastLen int, T int) func(idx []int) []kernel.Coord {
	return func(idx []int) []kernel.Coord {
		t := idx[0]
		fill := 0 // the tokens of the partially filled last page carry its fill
		if t >= T-lastLen {
			fill = lastLen
		}
		return []kernel.Coord{{Kind: kernel.KindPage, Value: t / P}, {Kind: kernel.KindPageOffset, Value: t % P}, {Kind: kernel.KindLastPageFill, Value: fill}}
	}
}

func TestPatterns(t *testing.T) {
	const T, P = 1000, 16 // 62 full pages and a last page of 8 tokens
	tests := []struct {
		name      string
		s         synth
		pattern   string
		coord     string
		topValues []int // the values that must lead Groups
	}{
		{"page off-by-one at offset 0", synth{shape: []int{T, 32}, axes: []kernel.CoordKind{"token", "latent"}, derived: paged(P, 8, T),
			bug: func(idx []int, r *rand.Rand) float64 {
				if idx[0]%P == 0 {
					return 3 + 10*r.Float64()
				}
				return 0
			}}, PageBoundary, "page_offset", []int{0}},
		{"both page edges", synth{shape: []int{T, 32}, axes: []kernel.CoordKind{"token", "latent"}, derived: paged(P, 8, T),
			bug: func(idx []int, r *rand.Rand) float64 {
				if o := idx[0] % P; o == 0 || o == P-1 {
					return 2 + r.Float64()
				}
				return 0
			}}, PageBoundary, "page_offset", nil},
		{"masking past seq_len on the last page", synth{shape: []int{T, 32}, axes: []kernel.CoordKind{"token", "latent"}, derived: paged(P, 8, T),
			bug: func(idx []int, r *rand.Rand) float64 {
				if idx[0] >= T-8 {
					return 5
				}
				return 0
			}}, PartialLastPage, "last_page_fill", []int{8}},
		{"one split-K partial wrong", synth{shape: []int{8, 4, 64}, axes: []kernel.CoordKind{"head", "split", "latent"},
			bug: func(idx []int, r *rand.Rand) float64 {
				if idx[1] == 2 {
					return 1.5 + r.Float64()
				}
				return 0
			}}, SplitBoundary, "split", []int{2}},
		{"swapped nibble order hits odd elements", synth{shape: []int{16, 64}, axes: []kernel.CoordKind{"row", "col"},
			bug: func(idx []int, r *rand.Rand) float64 {
				if idx[1]%2 == 1 && r.Float64() < 0.8 { // some codes happen to be equal
					return 1 + 4*r.Float64()
				}
				return 0
			}}, AlternatingNibble, "col%2", []int{1}},
		{"one 16-element scale block", synth{shape: []int{16, 128}, axes: []kernel.CoordKind{"row", "col"},
			derived: func(idx []int) []kernel.Coord { return []kernel.Coord{{Kind: "block16", Value: idx[1] / 16}} },
			bug: func(idx []int, r *rand.Rand) float64 {
				if idx[1]/16 == 3 {
					return 2 + r.Float64()
				}
				return 0
			}}, ScaleBlock, "block16", []int{3}},
		{"one 128-row tile", synth{shape: []int{512, 16}, axes: []kernel.CoordKind{"row", "col"},
			derived: func(idx []int) []kernel.Coord { return []kernel.Coord{{Kind: "tile128", Value: idx[0] / 128}} },
			bug: func(idx []int, r *rand.Rand) float64 {
				if idx[0]/128 == 2 {
					return 2 + r.Float64()
				}
				return 0
			}}, Tile, "tile128", []int{2}},
		{"one head", synth{shape: []int{2, 16, 64}, axes: []kernel.CoordKind{"request", "head", "latent"},
			bug: func(idx []int, r *rand.Rand) float64 {
				if idx[1] == 7 {
					return 3
				}
				return 0
			}}, OneHead, "head", []int{7}},
		{"a group of heads", synth{shape: []int{2, 16, 64}, axes: []kernel.CoordKind{"request", "head", "latent"},
			derived: func(idx []int) []kernel.Coord { return []kernel.Coord{{Kind: "head_group", Value: idx[1] / 4}} },
			bug: func(idx []int, r *rand.Rand) float64 {
				if idx[1]/4 == 2 {
					return 3
				}
				return 0
			}}, HeadGroup, "head_group", []int{2}},
		{"error growing with context", synth{shape: []int{8, 4, 32}, axes: []kernel.CoordKind{"request", "head", "latent"},
			derived: func(idx []int) []kernel.Coord {
				return []kernel.Coord{{Kind: "context_len", Value: 128 << idx[0]}}
			},
			bug: func(idx []int, r *rand.Rand) float64 {
				// err/tol ∝ sqrt(context): 0.3 at 128 tokens, 3.4 at 16K.
				return 0.3 * math.Sqrt(float64(int(1)<<idx[0])) * (0.8 + 0.4*r.Float64())
			}}, GrowthWithContext, "context_len", nil},
		{"uninitialised padding of a 128-row scale tile (most of the tensor)", synth{shape: []int{128, 8}, axes: []kernel.CoordKind{"sf_row", "sf_col"},
			derived: func(idx []int) []kernel.Coord {
				pad := 0
				if idx[0] >= 16 {
					pad = 1
				}
				return []kernel.Coord{{Kind: "padding", Value: pad}}
			},
			bug: func(idx []int, r *rand.Rand) float64 {
				if idx[0] >= 16 {
					return math.Inf(1)
				}
				return 0
			}}, Padding, "padding", []int{1}},
		{"one request's rows (a neighbour's block-table row)", synth{shape: []int{64, 32}, axes: []kernel.CoordKind{"row", "dim"},
			derived: func(idx []int) []kernel.Coord { return []kernel.Coord{{Kind: "request", Value: idx[0] / 8}} },
			bug: func(idx []int, r *rand.Rand) float64 {
				if idx[0]/8 == 3 {
					return 2 + r.Float64()
				}
				return 0
			}}, Concentrated, "request", []int{3}},
		{"noise only", synth{shape: []int{64, 64}, axes: []kernel.CoordKind{"row", "col"}}, None, "", nil},
		{"one corrupted element", synth{shape: []int{64, 64}, axes: []kernel.CoordKind{"head", "latent"},
			bug: func(idx []int, r *rand.Rand) float64 {
				if idx[0] == 5 && idx[1] == 17 {
					return 40
				}
				return 0
			}}, Isolated, "", nil},
		{"mismatching special values on page edges", synth{shape: []int{T, 8}, axes: []kernel.CoordKind{"token", "latent"}, derived: paged(P, 8, T),
			bug: func(idx []int, r *rand.Rand) float64 {
				if idx[0]%P == 0 && idx[1] == 0 {
					return math.Inf(1)
				}
				return 0
			}}, PageBoundary, "page_offset", []int{0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, ex := tc.s.build(1)
			sig := Analyze(o, kernel.Dense(ex), Options{})
			t.Logf("%s: %s", sig.Pattern, sig.Detail)
			if sig.Pattern != tc.pattern || sig.Coord != tc.coord {
				t.Fatalf("pattern %q on %q (%s), want %q on %q", sig.Pattern, sig.Coord, sig.Detail, tc.pattern, tc.coord)
			}
			for j, v := range tc.topValues {
				if j >= len(sig.Groups) || sig.Groups[j].Value != v {
					t.Errorf("groups %+v, want %v first", sig.Groups, tc.topValues)
					break
				}
			}
			if _, err := json.Marshal(sig); err != nil {
				t.Errorf("signature does not encode: %v", err)
			}
		})
	}
}

// TestNoiseClaimsNoPattern: failures scattered at random (a heavy-tailed
// noise where about 3% of elements exceed their tolerance) must never be
// given a pattern, whatever the seed.
func TestNoiseClaimsNoPattern(t *testing.T) {
	derived := func(idx []int) []kernel.Coord {
		return []kernel.Coord{{Kind: "page", Value: idx[1] / 16}, {Kind: "page_offset", Value: idx[1] % 16},
			{Kind: "block16", Value: idx[2] / 16}, {Kind: "context_len", Value: 100 + 37*idx[0]}}
	}
	for seed := uint64(1); seed <= 8; seed++ {
		r := rand.New(rand.NewPCG(seed, 3))
		shape := []int{4, 32, 64}
		N := tensor.NumElements(shape)
		ex := make([]float64, N)
		for i := range ex {
			ex[i] = math.Abs(r.NormFloat64()) * 0.46 // P(> 1) ≈ 3%
		}
		o := kernel.Output{Name: "out", Shape: shape, Coords: kernel.Coords{Axes: []kernel.CoordKind{"request", "token", "latent"}, Derived: appending(derived)}}
		sig := Analyze(o, kernel.Dense(ex), Options{})
		if sig.Pattern != Uniform {
			t.Errorf("seed %d: noise named %q on %q: %s", seed, sig.Pattern, sig.Coord, sig.Detail)
		}
		sig = Analyze(o, kernel.Dense(ex), Options{Systematic: true})
		if sig.Pattern != Uniform {
			t.Errorf("seed %d, systematic: noise named %q on %q: %s", seed, sig.Pattern, sig.Coord, sig.Detail)
		}
	}
}

// TestSystematic: no element fails but the whole-tensor error does; the
// top decile of the excess still shows which head carries it. The noise
// here is that of a correct kernel (|normal|·0.15, as the attention tests
// measure) and head 3 carries a bias worth 0.7-0.8 of its tolerance.
func TestSystematic(t *testing.T) {
	shape := []int{2, 16, 64}
	r := rand.New(rand.NewPCG(2, 7))
	ex := make([]float64, tensor.NumElements(shape))
	for i := range ex {
		ex[i] = 0.15 * math.Abs(r.NormFloat64())
		if tensor.Unravel(i, shape)[1] == 3 {
			ex[i] = 0.7 + 0.1*r.Float64()
		}
	}
	o := kernel.Output{Name: "out", Shape: shape, Coords: kernel.Coords{Axes: []kernel.CoordKind{"request", "head", "latent"}}}
	if sig := Analyze(o, kernel.Dense(ex), Options{}); sig.Pattern != None {
		t.Errorf("without Systematic: %q, want none (no element fails)", sig.Pattern)
	}
	sig := Analyze(o, kernel.Dense(ex), Options{Systematic: true})
	if sig.Pattern != OneHead || sig.Groups[0].Value != 3 {
		t.Errorf("systematic: %q %+v, want one_head on head 3", sig.Pattern, sig.Groups)
	}
}

func TestDetailWording(t *testing.T) {
	const P = 64
	s := synth{shape: []int{4096, 4}, axes: []kernel.CoordKind{"token", "latent"}, derived: paged(P, 0, 4096),
		bug: func(idx []int, r *rand.Rand) float64 {
			if o := idx[0] % P; o == 0 || o == P-1 {
				return 10
			}
			return 0
		}}
	o, ex := s.build(3)
	sig := Analyze(o, kernel.Dense(ex), Options{})
	want := "errors concentrate on page_offset 0 and 63 (page boundaries)"
	if !strings.HasPrefix(sig.Detail, want) || !strings.Contains(sig.Detail, "of the excess in 3.1% of the elements") {
		t.Errorf("detail %q, want it to start %q and give the 2/64 = 3.1%% element share", sig.Detail, want)
	}
}

func TestHelpers(t *testing.T) {
	// KL(1‖e) = ln(1/e); KL(e‖e) = 0; C(5,2) = 10.
	if got := kl(1, 0.25); math.Abs(got-math.Log(4)) > 1e-12 {
		t.Errorf("kl(1, .25) = %g, want ln 4", got)
	}
	if got := kl(0.3, 0.3); math.Abs(got) > 1e-15 {
		t.Errorf("kl(.3, .3) = %g, want 0", got)
	}
	if got := lnChoose(5, 2); math.Abs(got-math.Log(10)) > 1e-12 {
		t.Errorf("lnChoose(5, 2) = %g, want ln 10", got)
	}
	// Spearman: increasing 1; decreasing -1; ties average their ranks.
	if got := spearman([]float64{1, 2, 5, 9}); math.Abs(got-1) > 1e-12 {
		t.Errorf("spearman increasing = %g", got)
	}
	if got := spearman([]float64{4, 3, 2, 1}); math.Abs(got+1) > 1e-12 {
		t.Errorf("spearman decreasing = %g", got)
	}
	// y = [1, 1, 2]: ranks [0.5, 0.5, 2] against [0, 1, 2]: centred (-.5,-.5,1) and (-1,0,1):
	// Σxy = .5+0+1 = 1.5; Σx² = 1.5; Σy² = 2 → 1.5/sqrt(3) = 0.8660.
	if got := spearman([]float64{1, 1, 2}); math.Abs(got-1.5/math.Sqrt(3)) > 1e-12 {
		t.Errorf("spearman with ties = %g, want %g", got, 1.5/math.Sqrt(3))
	}
}

// TestKindsTheKernelsUse maps the coordinate kinds the kernel files emit
// (internal/kernel: nvfp4, kv, mla, splitk, dsa) to patterns. The pattern
// comes from the kind alone: splits_used (how many splits hold tokens) is
// no split boundary, whatever its name contains.
func TestKindsTheKernelsUse(t *testing.T) {
	tests := []struct {
		name kernel.CoordKind
		set  []int
		want string
	}{
		{"block16", []int{3}, ScaleBlock},
		{"block", []int{9}, Concentrated}, // a cache block, not a scale block
		{"tile128", []int{1}, Tile},
		{"col_tile128", []int{1}, Tile},
		{"head_tile", []int{0}, Tile},
		{"nibble", []int{1}, AlternatingNibble},
		{kernel.KindParity, []int{0}, AlternatingNibble},
		{"last_page_fill", []int{3, 5}, PartialLastPage},
		{"split", []int{2}, SplitBoundary},
		{"split_start", []int{0}, SplitBoundary},
		{"splits_used", []int{4}, SplitCount},
		{"head", []int{7}, OneHead},
		{"head", []int{8, 9}, HeadGroup},
		{"head_group", []int{2}, HeadGroup},
		{"page_offset", []int{0}, PageBoundary},
		{"page_offset", []int{0, 15}, PageBoundary},
		{"page_offset", []int{0, 5}, Concentrated},
		{"part", []int{1}, Concentrated},
		{"padding", []int{1}, Padding},
	}
	for _, tc := range tests {
		if !tc.name.Declared() {
			t.Errorf("kind %s is not declared in internal/kernel/coords.go", tc.name)
		}
		st := &coordStats{name: string(tc.name), kind: tc.name, vals: []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}}
		if got := patternFor(st, tc.set); got != tc.want {
			t.Errorf("patternFor(%s, %v) = %s, want %s", tc.name, tc.set, got, tc.want)
		}
	}
	for _, n := range []kernel.CoordKind{kernel.KindContextLen, kernel.KindVisible, kernel.KindToken} {
		if !trendKinds[n] {
			t.Errorf("%s is not taken as a context coordinate", n)
		}
	}
	for _, n := range []kernel.CoordKind{kernel.KindQPos, kernel.KindLatent, kernel.KindPage, kernel.KindSplitsUsed} {
		if trendKinds[n] {
			t.Errorf("%s is taken as a context coordinate", n)
		}
	}
}

// TestSampledLikeFull: a tensor above MaxElements is sampled, and gives the
// same answer as the full analysis, for a pattern and for noise.
func TestSampledLikeFull(t *testing.T) {
	const T, P = 2000, 16
	s := synth{shape: []int{T, 16}, axes: []kernel.CoordKind{"token", "latent"}, derived: paged(P, 0, T),
		bug: func(idx []int, r *rand.Rand) float64 {
			if idx[0]%P == P-1 {
				return 2 + r.Float64()
			}
			return 0
		}}
	o, ex := s.build(4)
	sig := Analyze(o, kernel.Dense(ex), Options{MaxElements: 3000})
	if sig.Pattern != PageBoundary || sig.Groups[0].Value != P-1 || math.Abs(sig.Groups[0].Elements-1.0/P) > 0.01 {
		t.Errorf("sampled: %s %+v, want page_boundary at offset 15 holding 1/16 of the elements", sig.Pattern, sig.Groups)
	}
	noise := synth{shape: []int{T, 16}, axes: []kernel.CoordKind{"token", "latent"}, derived: paged(P, 0, T),
		bug: func(idx []int, r *rand.Rand) float64 {
			if r.Float64() < 0.02 {
				return 1 + r.Float64()
			}
			return 0
		}}
	o, ex = noise.build(5)
	if sig := Analyze(o, kernel.Dense(ex), Options{MaxElements: 3000}); sig.Pattern != Uniform {
		t.Errorf("sampled noise named %s: %s", sig.Pattern, sig.Detail)
	}
}

// TestValueHypotheses: failures explained by the values themselves.
func TestValueHypotheses(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	const rows, cols = 8, 64
	N := rows * cols
	expected := make([]float64, N)
	for i := range expected {
		expected[i] = []float64{0, 0.5, 1, 1.5, 2, 3, 4, 6}[r.IntN(8)] * float64(1-2*r.IntN(2))
	}
	o := kernel.Output{Name: "dequant", Shape: []int{rows, cols}, DType: tensor.BF16, Expected: kernel.Dense(expected),
		Coords: kernel.Coords{Axes: []kernel.CoordKind{"row", "col"}}}
	excessOf := func(actual []float64) []float64 {
		ex := make([]float64, N)
		for i := range ex {
			if actual[i] != expected[i] {
				ex[i] = math.Inf(1)
			}
		}
		return ex
	}
	// Pairs exchanged (element 2i in the high nibble when unpacking).
	swappedPairs := make([]float64, N)
	for i := range swappedPairs {
		swappedPairs[i] = expected[i^1]
	}
	// Every value times 2688²/amax²-like constant (an inverted global scale).
	scaled := make([]float64, N)
	for i := range scaled {
		scaled[i] = expected[i] * 7.3e-4
	}
	// Packed bytes with their nibbles exchanged.
	bytesExp := make([]float64, N)
	bytesAct := make([]float64, N)
	for i := range bytesExp {
		b := uint8(r.IntN(256))
		bytesExp[i], bytesAct[i] = float64(b), float64(b<<4|b>>4)
	}
	ob := kernel.Output{Name: "packed", Shape: []int{rows, cols}, DType: tensor.U8, Expected: kernel.Dense(bytesExp),
		Coords: kernel.Coords{Axes: []kernel.CoordKind{"row", "byte"}}}
	exB := make([]float64, N)
	for i := range exB {
		if bytesAct[i] != bytesExp[i] {
			exB[i] = math.Inf(1)
		}
	}
	unwritten := make([]float64, N)
	copy(unwritten, expected)
	for i := 3 * cols; i < N; i++ {
		unwritten[i] = 0
	}
	tests := []struct {
		name    string
		o       kernel.Output
		actual  []float64
		ex      []float64
		pattern string
	}{
		{"rows never written", o, unwritten, excessOf(unwritten), Zeros},
		{"pairs exchanged", o, swappedPairs, excessOf(swappedPairs), AlternatingNibble},
		{"constant factor", o, scaled, excessOf(scaled), ConstantFactor},
		{"nibbles of each byte exchanged", ob, bytesAct, exB, AlternatingNibble},
	}
	for _, tc := range tests {
		act := tc.actual
		sig := Analyze(tc.o, kernel.Dense(tc.ex), Options{Actual: func(i int) float64 { return act[i] }})
		t.Logf("%s: %s: %s", tc.name, sig.Pattern, sig.Detail)
		if sig.Pattern != tc.pattern {
			t.Errorf("%s: pattern %s (%s), want %s", tc.name, sig.Pattern, sig.Detail, tc.pattern)
		}
	}
	// Random wrong values are none of these.
	noise := make([]float64, N)
	for i := range noise {
		noise[i] = expected[i] + r.NormFloat64()
	}
	sig := Analyze(o, kernel.Dense(excessOf(noise)), Options{Actual: func(i int) float64 { return noise[i] }})
	if sig.Pattern == AlternatingNibble || sig.Pattern == ConstantFactor {
		t.Errorf("random errors named %s: %s", sig.Pattern, sig.Detail)
	}
}

// TestQuantileMatchesSort: the streaming selection gives, at every rank, the
// value a sort gives (NaN first, infinities, both zeros, repeats), which is
// what keeps every signature the same as when Analyze sorted a copy.
func TestQuantileMatchesSort(t *testing.T) {
	for _, direct := range []int{selectDirect, 0} { // 0: all four counting passes
		t.Run(fmt.Sprintf("direct=%d", direct), func(t *testing.T) {
			defer func(d int) { selectDirect = d }(selectDirect)
			selectDirect = direct
			quantileMatchesSort(t)
		})
	}
}

func quantileMatchesSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	specials := []float64{math.NaN(), math.Inf(1), math.Inf(-1), 0, math.Copysign(0, -1), 1, -1, 5e-324, math.MaxFloat64}
	trials := 50
	if testing.Short() {
		trials = 4 // the race pass: each selection's goroutines count 64 K digits a pass, each instrumented
	}
	for trial := 0; trial < trials; trial++ {
		n := 1 + rng.IntN(300)
		x := make([]float64, n)
		for i := range x {
			switch rng.IntN(4) {
			case 0:
				x[i] = specials[rng.IntN(len(specials))]
			case 1:
				x[i] = float64(rng.IntN(5)) // repeats
			default:
				x[i] = rng.NormFloat64() * math.Pow(10, float64(rng.IntN(40)-20))
			}
		}
		s := append([]float64(nil), x...)
		sort.Float64s(s)
		seq := seqSource(func(yield func(float64) bool) {
			for _, v := range x {
				if !yield(v) {
					return
				}
			}
		})
		// The same values given on three goroutines at once, each its
		// own share (every third value from its own start), as
		// visitFailing gives them.
		split := func(newSink func() func(float64)) {
			var wg sync.WaitGroup
			for g := range 3 {
				wg.Go(func() {
					sink := newSink()
					for j := g; j < len(x); j += 3 {
						sink(x[j])
					}
				})
			}
			wg.Wait()
		}
		for name, src := range map[string]valueSource{"one goroutine": seq, "three goroutines": split} {
			for _, k := range []int{0, n - 1, n / 2, rng.IntN(n), rng.IntN(n), rng.IntN(n), rng.IntN(n)} {
				got := kthSmallest(src, k)
				if got != s[k] && !(math.IsNaN(got) && math.IsNaN(s[k])) {
					t.Fatalf("trial %d, %s: rank %d of %d: selected %v, sorted %v", trial, name, k, n, got, s[k])
				}
			}
			for _, p := range []float64{0.5, 0.9} {
				want := s[min(int(p*float64(n)), n-1)]
				if got := quantile(n, src, p); got != want && !(math.IsNaN(got) && math.IsNaN(want)) {
					t.Fatalf("trial %d, %s: quantile %v = %v, sorted %v", trial, name, p, got, want)
				}
			}
		}
		// A pass the context stopped gives fewer values than the rank
		// asks: 0, not a digit past the table.
		if got := kthSmallest(seq, n); got != 0 {
			t.Fatalf("trial %d: rank %d of %d values = %v, want 0", trial, n, n, got)
		}
	}
	if got := quantile(0, seqSource(func(func(float64) bool) {}), 0.5); got != 0 {
		t.Errorf("quantile of nothing = %v, want 0", got)
	}
	if got := kthSmallest(func(func() func(float64)) {}, 0); got != 0 {
		t.Errorf("the least of no values, given on no goroutine, = %v, want 0", got)
	}
}

// Special values come first: NaN or Inf where the expected output has a
// number is named non_finite, unless a coordinate explains where it falls
// (then that pattern stays, its detail led by the count).
func TestNonFiniteFirst(t *testing.T) {
	shape := []int{4, 32, 8}
	N := tensor.NumElements(shape)
	derived := func(idx []int) []kernel.Coord {
		return []kernel.Coord{{Kind: "page_offset", Value: idx[1] % 16}}
	}
	o := kernel.Output{Name: "out", Shape: shape, Coords: kernel.Coords{Axes: []kernel.CoordKind{"request", "token", "latent"}, Derived: appending(derived)}}
	everywhere := make([]float64, N)
	pageStart := make([]float64, N)
	for i := range everywhere {
		everywhere[i] = math.Inf(1)
		if (i/shape[2])%shape[1]%16 == 0 {
			pageStart[i] = math.Inf(1)
		}
	}
	for _, tc := range []struct {
		name   string
		excess []float64
		n      int
		want   string
	}{
		{"everywhere", everywhere, N, NonFinite},
		{"at page starts", pageStart, N / 16, PageBoundary},
	} {
		sig := Analyze(o, kernel.Dense(tc.excess), Options{NonFinite: tc.n})
		lead := fmt.Sprintf("%d of %d elements hold NaN or an infinity", tc.n, N)
		if sig.Pattern != tc.want || !strings.HasPrefix(sig.Detail, lead) {
			t.Errorf("%s: pattern %q, detail %q; want %q led by %q", tc.name, sig.Pattern, sig.Detail, tc.want, lead)
		}
		if plain := Analyze(o, kernel.Dense(tc.excess), Options{}); tc.want == NonFinite && plain.Pattern != Uniform {
			t.Errorf("%s without NonFinite: pattern %q, want uniform (the case must be one that reads as uniform)", tc.name, plain.Pattern)
		}
	}
}

// An overflow comes before everything: a finite answer the output dtype
// made an infinity is named overflow, with the coordinate that explains
// where it falls kept when one does (page starts here), and the other
// special values counted after it.
func TestOverflowFirst(t *testing.T) {
	shape := []int{4, 32, 8}
	N := tensor.NumElements(shape)
	derived := func(idx []int) []kernel.Coord {
		return []kernel.Coord{{Kind: "page_offset", Value: idx[1] % 16}}
	}
	o := kernel.Output{Name: "out", Shape: shape, Coords: kernel.Coords{Axes: []kernel.CoordKind{"request", "token", "latent"}, Derived: appending(derived)}}
	everywhere := make([]float64, N)
	pageStart := make([]float64, N)
	for i := range everywhere {
		everywhere[i] = math.Inf(1)
		if (i/shape[2])%shape[1]%16 == 0 {
			pageStart[i] = math.Inf(1)
		}
	}
	for _, tc := range []struct {
		name         string
		excess       []float64
		overflow, nf int
		coord, lead  string
	}{
		{"everywhere", everywhere, N, 0, "", fmt.Sprintf("%d of %d elements overflow: F16 rounds their finite exact answer to an infinity", N, N)},
		{"at page starts", pageStart, N/16 - 1, 1, "page_offset", fmt.Sprintf("%d of %d elements overflow: F16 rounds their finite exact answer to an infinity; 1 more hold NaN", N/16-1, N)},
	} {
		sig := Analyze(o, kernel.Dense(tc.excess), Options{Overflow: tc.overflow, OverflowDType: tensor.F16, NonFinite: tc.nf})
		if sig.Pattern != Overflow || sig.Coord != tc.coord || !strings.HasPrefix(sig.Detail, tc.lead) {
			t.Errorf("%s: pattern %q coord %q, detail %q; want %q, %q, led by %q", tc.name, sig.Pattern, sig.Coord, sig.Detail, Overflow, tc.coord, tc.lead)
		}
	}
}

// A failing set too small to be significant on any coordinate is isolated,
// never "spread over every coordinate": two heads of four failing in each
// of four requests (the lse of a head swap at TP 32) is 8 elements of 16,
// which even a coordinate value holding exactly them could not make
// significant (8·ln 2 is below MinScore).
func TestTooFewToBeSignificantIsIsolated(t *testing.T) {
	shape := []int{4, 4}
	excess := make([]float64, 16)
	for i := range excess {
		excess[i] = 0.5
		if h := i % 4; h == 1 || h == 2 {
			excess[i] = 3
		}
	}
	o := kernel.Output{Name: "lse", Shape: shape, Coords: kernel.Coords{Axes: []kernel.CoordKind{kernel.KindRequest, kernel.KindHead}}}
	if sig := Analyze(o, kernel.Dense(excess), Options{}); sig.Pattern != Isolated || !strings.Contains(sig.Detail, "8 element(s) fail, too few to show a pattern") {
		t.Errorf("8 of 16 failing: %s (%s), want isolated", sig.Pattern, sig.Detail)
	}
}

// TestSuspectNamesFewFailures: a suspect's values are no rounding error's,
// so one or two failing elements holding them are named after it (an MTP
// step fails on one future token a request), while the same elements
// holding anything else stay isolated; fewer than 90% hits name nothing.
func TestSuspectNamesFewFailures(t *testing.T) {
	const n = 64
	expected, bug := make([]float64, n), make([]float64, n)
	for i := range expected {
		expected[i] = float64(i)
		bug[i] = float64(i)
	}
	bug[10], bug[40] = 1000, 2000
	o := kernel.Output{Name: "scores", Shape: []int{2, n / 2}, Expected: kernel.Dense(expected),
		Coords:   kernel.Coords{Axes: []kernel.CoordKind{kernel.KindRow, kernel.KindToken}},
		Suspects: []kernel.Suspect{{Pattern: FutureTokensVisible, Detail: "the bug", Values: kernel.Dense(bug)}}}
	for _, c := range []struct {
		name   string
		actual map[int]float64
		want   string
	}{
		{"one", map[int]float64{10: 1000}, FutureTokensVisible},
		{"two", map[int]float64{10: 1000, 40: 2000}, FutureTokensVisible},
		{"one of two", map[int]float64{10: 1000, 40: 7}, Isolated},
		{"other values", map[int]float64{10: 999}, Isolated},
	} {
		excess := make([]float64, n)
		for i := range c.actual {
			excess[i] = 100
		}
		act := func(i int) float64 {
			if v, ok := c.actual[i]; ok {
				return v
			}
			return expected[i]
		}
		if sig := Analyze(o, kernel.Dense(excess), Options{Actual: act}); sig.Pattern != c.want {
			t.Errorf("%s: %s (%s), want %s", c.name, sig.Pattern, sig.Detail, c.want)
		}
	}
	// Within: a value off the suspect's by no more than it allows holds it
	within := make([]float64, n)
	within[10] = 0.5
	o.Suspects[0].Within = kernel.Dense(within)
	for _, c := range []struct {
		actual float64
		want   string
	}{{1000.5, FutureTokensVisible}, {999.5, FutureTokensVisible}, {1000.75, Isolated}} {
		excess := make([]float64, n)
		excess[10] = 100
		act := func(i int) float64 {
			if i == 10 {
				return c.actual
			}
			return expected[i]
		}
		if sig := Analyze(o, kernel.Dense(excess), Options{Actual: act}); sig.Pattern != c.want {
			t.Errorf("within 0.5 of 1000, actual %v: %s (%s), want %s", c.actual, sig.Pattern, sig.Detail, c.want)
		}
	}
}

// TestJudgedLikeFull: given the comparison's own record of which elements
// fail and of the largest finite excess (Options.Judged), the signature
// and the profile are what reading every element's excess again gives,
// to the last bit: with infinite and NaN excess among the failures (the
// cap on +Inf is the largest finite excess's), sampled (MaxElements) and
// not, failing and passing. The record is made here by a loop of its own.
func TestJudgedLikeFull(t *testing.T) {
	const T, P = 1000, 16
	pageEdge := func(idx []int, r *rand.Rand) float64 {
		if idx[0]%P == 0 {
			switch {
			case idx[1] == 3:
				return math.Inf(1)
			case idx[1] == 5:
				return math.NaN()
			}
			return 3 + 10*r.Float64()
		}
		return 0
	}
	split := func(idx []int, r *rand.Rand) float64 {
		if idx[1] == 2 {
			if idx[2] == 0 {
				return math.Inf(1)
			}
			return 1.5 + r.Float64()
		}
		return 0
	}
	few := func(idx []int, r *rand.Rand) float64 {
		if idx[0] == 17 && idx[1] < 3 {
			return 50
		}
		return 0
	}
	tests := []struct {
		name string
		s    synth
		opt  Options
	}{
		{"page edge, infinities and NaN", synth{shape: []int{T, 32}, axes: []kernel.CoordKind{"token", "latent"}, derived: paged(P, 8, T), bug: pageEdge}, Options{}},
		{"page edge, sampled", synth{shape: []int{T, 32}, axes: []kernel.CoordKind{"token", "latent"}, derived: paged(P, 8, T), bug: pageEdge}, Options{MaxElements: 3000, Profile: true}},
		{"one split, with the profile", synth{shape: []int{8, 4, 64}, axes: []kernel.CoordKind{"head", "split", "latent"}, bug: split}, Options{Profile: true}},
		{"a few failures", synth{shape: []int{64, 64}, axes: []kernel.CoordKind{"row", "col"}, bug: few}, Options{Profile: true, MaxElements: 1000}},
		{"none fail", synth{shape: []int{64, 64}, axes: []kernel.CoordKind{"row", "col"}}, Options{Profile: true}},
		{"non-finite first", synth{shape: []int{T, 32}, axes: []kernel.CoordKind{"token", "latent"}, derived: paged(P, 8, T), bug: pageEdge}, Options{NonFinite: 62}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, ex := tt.s.build(11)
			j := &Judged{Failing: make([]uint64, (len(ex)+63)/64)}
			for i, e := range ex {
				if e > 1 {
					j.Failing[i/64] |= 1 << (i % 64)
				}
				if !math.IsInf(e, 0) && !math.IsNaN(e) && e > j.MaxFinite {
					j.MaxFinite = e
				}
			}
			full := tt.opt
			wantSig, wantProf := AnalyzeProfile(o, kernel.Dense(ex), full)
			judged := tt.opt
			judged.Judged = j
			gotSig, gotProf := AnalyzeProfile(o, kernel.Dense(ex), judged)
			if diff := cmp.Diff(wantSig, gotSig, cmpopts.EquateNaNs()); diff != "" {
				t.Errorf("signature with Judged differs (-full +judged):\n%s", diff)
			}
			if (wantProf == nil) != (gotProf == nil) {
				t.Fatalf("profile: full %v, judged %v", wantProf != nil, gotProf != nil)
			}
			if wantProf != nil {
				if diff := cmp.Diff(wantProf.Coords(), gotProf.Coords(), cmpopts.EquateNaNs()); diff != "" {
					t.Errorf("profile with Judged differs (-full +judged):\n%s", diff)
				}
				wy, wx, wc, _ := wantProf.Grid()
				gy, gx, gc, _ := gotProf.Grid()
				if wy != gy || wx != gx || !cmp.Equal(wc, gc, cmpopts.EquateNaNs()) {
					t.Errorf("heat map with Judged differs")
				}
			}
			if tt.opt.Profile {
				np, jp := NewProfile(o, kernel.Dense(ex), Options{MaxElements: tt.opt.MaxElements}), NewProfile(o, kernel.Dense(ex), Options{MaxElements: tt.opt.MaxElements, Judged: j})
				if diff := cmp.Diff(np.Coords(), jp.Coords(), cmpopts.EquateNaNs()); diff != "" {
					t.Errorf("NewProfile with Judged differs (-full +judged):\n%s", diff)
				}
			}
		})
	}
}

// statefulValues keeps the last index read, as the on-demand Values do: a
// reader shared by two goroutines is a data race the detector reports.
type statefulValues struct {
	n, last int
	forks   *atomic.Int32
}

func (v *statefulValues) Len() int { return v.n }
func (v *statefulValues) At(i int) float64 {
	v.last = i
	return float64(i)
}
func (v *statefulValues) Fork() kernel.Values {
	v.forks.Add(1)
	return &statefulValues{n: v.n, forks: v.forks}
}

// unforkable is an on-demand Values without Fork: read on one goroutine.
type unforkable struct{ statefulValues }

func (v *unforkable) Fork() {} // not kernel.Forker's Fork

// visitFailing visits every failing element once, across its blocks'
// edges, each goroutine through readers of its own; a reader that cannot
// fork keeps the visits on one goroutine; a done context starts no block.
func TestVisitFailingVisitsEachOnce(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	words := 3*failingBlockWords + 5
	set := make([]uint64, words)
	want := []int{}
	for w := range set {
		if w%7 == 3 {
			continue // empty words
		}
		set[w] = rng.Uint64() & rng.Uint64()
		if w == failingBlockWords-1 || w == failingBlockWords {
			set[w] |= 1<<63 | 1 // both sides of a block edge
		}
	}
	for w, word := range set {
		for b := 0; b < 64; b++ {
			if word>>b&1 == 1 {
				want = append(want, w<<6+b)
			}
		}
	}
	N := words * 64
	for _, tc := range []struct {
		name     string
		readers  func(forks *atomic.Int32) []kernel.Values
		maxProcs int // the most goroutines that may visit
	}{
		{"forkable", func(f *atomic.Int32) []kernel.Values {
			return []kernel.Values{&statefulValues{n: N, forks: f}, nil, kernel.Dense(make([]float64, N))}
		}, 8},
		{"one unforkable", func(f *atomic.Int32) []kernel.Values {
			return []kernel.Values{&statefulValues{n: N, forks: f}, &unforkable{statefulValues{n: N, forks: f}}}
		}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8))
			var forks atomic.Int32
			var visited perGoroutine[[]int]
			var goroutines atomic.Int32
			visitFailing(context.Background(), set, tc.readers(&forks), func(r []kernel.Values) func(int) {
				goroutines.Add(1)
				if tc.name == "forkable" && r[1] != nil {
					t.Errorf("a nil reader forked to %T", r[1])
				}
				mine := visited.own()
				return func(i int) {
					if got := r[0].At(i); got != float64(i) {
						t.Errorf("reader read %v at %d", got, i)
					}
					*mine = append(*mine, i)
				}
			})
			var got []int
			for _, v := range visited.all {
				got = append(got, *v...)
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Fatalf("visited %d elements, want the %d failing ones once each", len(got), len(want))
			}
			if g := int(goroutines.Load()); g > tc.maxProcs || forks.Load() != int32(g-1) {
				t.Errorf("%d goroutines, %d forks: want at most %d goroutines, each but the first with a fork", g, forks.Load(), tc.maxProcs)
			}
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	n := 0
	visitFailing(ctx, set, nil, func([]kernel.Values) func(int) { return func(int) { n++ } })
	if n != 0 {
		t.Errorf("a done context still visited %d elements", n)
	}
}

// collect's statistics are sums in the order it visits the elements (index
// order): the signature's scores and the report's numbers are those sums'
// bits. An independent loop over the elements in index order makes the
// same sums, over an output of several of collect's blocks of visits,
// with excess spanning forty binades (any other order of the additions
// rounds differently) and a few NaNs and infinities (the maximum keeps
// the first NaN it meets).
func TestProfileSumsInVisitOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	shape := []int{211, 98} // 20678 elements: six blocks of visits
	N := shape[0] * shape[1]
	raw := make([]float64, N)
	for i := range raw {
		switch rng.IntN(50) {
		case 0:
			raw[i] = math.NaN()
		case 1:
			raw[i] = math.Inf(1)
		default:
			raw[i] = math.Exp(rng.Float64()*40 - 20)
		}
	}
	o := kernel.Output{Name: "out", Shape: shape, Coords: kernel.Coords{Axes: []kernel.CoordKind{"row", "col"}}}
	capped := func(r float64) float64 { return min(r, 1e6) }
	weight := func(e float64) float64 {
		if e > 1 {
			return 1 + math.Log(e)
		}
		return 0
	}
	p := collect(o, shape, N, func(i int) float64 { return raw[i] }, capped, weight, 1, N, nil, true)
	type sums struct {
		count, mass, excess, max, finite float64
		fail                             int
		maxSet                           bool
	}
	want := map[string]map[int]*sums{"row": {}, "col": {}, "col%2": {}}
	for i, r := range raw {
		e := capped(r)
		w := weight(e)
		for name, v := range map[string]int{"row": i / shape[1], "col": i % shape[1], "col%2": i % shape[1] % 2} {
			s := want[name][v]
			if s == nil {
				s = &sums{}
				want[name][v] = s
			}
			s.count++
			s.mass += w
			s.excess += e
			if !s.maxSet || r > s.max || math.IsNaN(s.max) {
				s.max, s.maxSet = r, true
			}
			if !math.IsInf(r, 0) && !math.IsNaN(r) {
				s.finite += r
			}
			if e > 1 {
				s.fail++
			}
		}
	}
	same := func(a, b float64) bool {
		return math.Float64bits(a) == math.Float64bits(b) || math.IsNaN(a) && math.IsNaN(b)
	}
	seen := 0
	for _, st := range p.stats {
		for _, v := range st.vals {
			got, w := st.c(v), want[st.name][v]
			if w == nil {
				t.Fatalf("%s %d: not in the index-order sums", st.name, v)
			}
			seen++
			if !same(got.count, w.count) || !same(got.mass, w.mass) || !same(got.excess, w.excess) ||
				!same(got.max, w.max) || !same(got.finite, w.finite) || got.fail != w.fail {
				t.Fatalf("%s %d: count %v mass %v excess %v max %v finite %v fail %d; in index order %v %v %v %v %v %d",
					st.name, v, got.count, got.mass, got.excess, got.max, got.finite, got.fail, w.count, w.mass, w.excess, w.max, w.finite, w.fail)
			}
		}
	}
	if n := len(want["row"]) + len(want["col"]) + len(want["col%2"]); seen != n {
		t.Errorf("the profile has %d coordinate values, want %d", seen, n)
	}
}

// readAhead hands use every visit read yields, in read's order, across
// its blocks' edges, on one goroutine other than read's; a panic in use
// stops read and is raised again on the caller's goroutine.
func TestReadAhead(t *testing.T) {
	for _, n := range []int{0, 1, readBlock - 1, readBlock, 3*readBlock + 17} {
		var got []int
		readAhead(func(yield func(visit) bool) {
			for i := range n {
				if !yield(visit{i: i, e: float64(i) / 2}) {
					return
				}
			}
		}, func(v visit) {
			if v.e != float64(v.i)/2 {
				t.Errorf("visit %d carries e = %v", v.i, v.e)
			}
			got = append(got, v.i)
		})
		if len(got) != n {
			t.Fatalf("%d visits read, %d used", n, len(got))
		}
		for k, i := range got {
			if i != k {
				t.Fatalf("%d visits: the %dth used is visit %d", n, k, i)
			}
		}
	}
	read := 0
	done := make(chan any)
	go func() {
		defer func() { done <- recover() }()
		readAhead(func(yield func(visit) bool) {
			for i := 0; i < 1<<30; i++ {
				read++
				if !yield(visit{i: i}) {
					return
				}
			}
		}, func(v visit) {
			if v.i == readBlock+5 {
				panic("planted")
			}
		})
	}()
	select {
	case r := <-done:
		if r == nil || !strings.Contains(fmt.Sprint(r), "planted") {
			t.Errorf("use's panic came back as %v", r)
		}
	case <-time.After(time.Minute): // a minute: the reading stops within a few blocks
		t.Fatal("read still blocked a minute after use panicked")
	}
	if read > 6*readBlock {
		t.Errorf("read went on for %d visits after use panicked at %d", read, readBlock+5)
	}
}
