package mla

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/splitk"
)

// TestSoftmaxBlock: the declared softmax block changes Expected where a
// row sees more tokens than the smaller block (P is rounded to bf16 against
// a running max updated every 32 instead of every 64 tokens), and nowhere
// else; Exact stays the same answer; 0 is FlashMLA's 64, bit for bit.
func TestSoftmaxBlock(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 1))
	// Rows of one request: 20 tokens (one block either way), 52 and 259
	// (the split sizes of the inconclusive cases).
	seqLens := []int{20, 52, 259}
	pc, pp, _, _ := paged(t, rng, seqLens, 64, 48, 16)
	q := Query{B: 3, SQ: 1, H: 64, D: 64}
	q.Data = randomBF16(rng, q.B*q.SQ*q.H*q.D, 1)
	cfg := Config{SoftmaxScale: 0.35, LSE: splitk.DefaultConvention()}
	decode := func(block int) (*Outputs, *Outputs) {
		prec := DefaultPrecision()
		prec.SoftmaxBlock = block
		ex, xp, err := Decode(context.Background(), &Dense{Q: q, Cache: pc, Pages: pp}, cfg, prec)
		if err != nil {
			t.Fatal(err)
		}
		return ex, xp
	}
	ex0, xp0 := decode(0)
	ex64, xp64 := decode(64)
	ex32, xp32 := decode(32)
	sameBits(t, "expected out, block 0 and 64", xp0.Out, xp64.Out)
	sameBits(t, "exact out, block 0 and 64", ex0.Out, ex64.Out)
	L := 48
	rowLen := q.H * L
	for b, n := range seqLens {
		a, c := xp64.Out[b*rowLen:(b+1)*rowLen], xp32.Out[b*rowLen:(b+1)*rowLen]
		diff := 0
		for i := range a {
			if a[i] != c[i] {
				diff++
			}
		}
		switch {
		case n <= 32 && diff != 0:
			t.Errorf("request %d (%d tokens, one block of either size): %d of %d expected outputs differ between blocks 32 and 64", b, n, diff, len(a))
		case n > 32 && diff == 0:
			t.Errorf("request %d (%d tokens): blocks 32 and 64 give the same expected outputs; the block is not honoured", b, n)
		}
		t.Logf("request %d, %d tokens: %d of %d expected outputs differ between blocks 32 and 64", b, n, diff, len(a))
		// Exact is float64 either way: the block only reorders its sums.
		for i := b * rowLen; i < (b+1)*rowLen; i++ {
			if d := math.Abs(ex64.Out[i] - ex32.Out[i]); d > 1e-12*math.Max(1, math.Abs(ex64.Out[i])) {
				t.Fatalf("exact out[%d] moves by %g with the block", i, d)
			}
		}
	}
	for _, bad := range []int{-1, MaxSoftmaxBlock + 1} {
		prec := DefaultPrecision()
		prec.SoftmaxBlock = bad
		if _, _, err := Decode(context.Background(), &Dense{Q: q, Cache: pc, Pages: pp}, cfg, prec); err == nil {
			t.Errorf("softmax block %d accepted", bad)
		}
	}
}
