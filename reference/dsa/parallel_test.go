package dsa

import (
	"context"
	"errors"
	"math"
	"math/rand"
	"runtime"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/kvcache"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// indexerInput is b requests of n tokens each over 64-token pages in
// shuffled order, hi heads of Dk = 128.
func indexerInput(tb testing.TB, b, hi, n int) Input {
	tb.Helper()
	const dk, p = 128, 64
	rng := rand.New(rand.NewSource(int64(b*hi + n)))
	per := (n + p - 1) / p
	nb := b * per
	kc := tensor.New(tensor.BF16, nb, p, dk)
	for i := 0; i+2 <= len(kc.Data); i += 2 {
		bits := uint16(math.Float32bits(float32(rng.NormFloat64())) >> 16)
		kc.Data[i], kc.Data[i+1] = byte(bits), byte(bits>>8)
	}
	qv := make([]float64, b*hi*dk)
	for i := range qv {
		qv[i] = rng.NormFloat64()
	}
	wv := make([]float64, b*hi)
	for i := range wv {
		wv[i] = rng.Float64() - 0.3
	}
	table := make([]int64, nb)
	for i, v := range rng.Perm(nb) {
		table[i] = int64(v)
	}
	lens := make([]int64, b)
	for i := range lens {
		lens[i] = int64(n - i) // unequal lengths: -inf tails
	}
	pg, err := kvcache.NewPages(tensor.FromInt64s(tensor.I32, []int{b, per}, table), tensor.FromInt64s(tensor.I32, []int{b}, lens), p, nb)
	if err != nil {
		tb.Fatal(err)
	}
	return Input{Q: tensor.FromFloat64s(tensor.BF16, []int{b, hi, dk}, qv), KCache: kc,
		Weights: tensor.FromFloat64s(tensor.F32, []int{b, hi}, wv), Pages: pg}
}

// TestDeterministicAcrossGOMAXPROCS: the scores and bounds are the same bits
// at 1, 2 and 8 threads, run after run.
func TestDeterministicAcrossGOMAXPROCS(t *testing.T) {
	in := indexerInput(t, 3, 8, 1500)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	var ref *Scores
	for _, p := range []int{1, 2, 8} {
		runtime.GOMAXPROCS(p)
		for r := 0; r < 2; r++ {
			s, err := Compute(context.Background(), in, 0)
			if err != nil {
				t.Fatal(err)
			}
			if ref == nil {
				ref = s
				continue
			}
			for name, pair := range map[string][2][]float64{"exact": {s.Exact, ref.Exact}, "expected": {s.Expected, ref.Expected}, "bound": {s.Bound, ref.Bound}} {
				for i := range pair[0] {
					if math.Float64bits(pair[0][i]) != math.Float64bits(pair[1][i]) {
						t.Fatalf("GOMAXPROCS %d: %s[%d] = %v, first run %v", p, name, i, pair[0][i], pair[1][i])
					}
				}
			}
		}
	}
}

// BenchmarkCompute: DeepSeek-V3.2's indexer (64 heads of 128) over 4
// requests of 8K tokens.
func BenchmarkCompute(b *testing.B) {
	in := indexerInput(b, 4, 64, 8192)
	for b.Loop() {
		if _, err := Compute(context.Background(), in, 0); err != nil {
			b.Fatal(err)
		}
	}
}

// The indexer stops between its units once its context is done.
func TestComputeStops(t *testing.T) {
	in := indexerInput(t, 2, 8, 1500)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Compute(ctx, in, 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}
