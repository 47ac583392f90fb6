package formats

import (
	"math"
	"testing"
)

// The table of binary formats validates itself against each format's own
// decoder: the smallest positive normal code decodes to 2^MinExp, the
// smallest subnormal to 2^(MinExp-MantBits) (E8M0, which has none, to
// 2^MinExp), and the width is the code's.
func TestBinariesMatchTheDecoders(t *testing.T) {
	type probe struct {
		minNormal, minSub float64
		bits              uint
	}
	decoded := map[string]probe{
		"F64":     {math.Float64frombits(1 << 52), math.Float64frombits(1), 64},
		"F32":     {float64(math.Float32frombits(1 << 23)), float64(math.Float32frombits(1)), 32},
		"F16":     {float64(FP16Decode(1 << 10)), float64(FP16Decode(1)), 16},
		"BF16":    {float64(BF16Decode(1 << 7)), float64(BF16Decode(1)), 16},
		"F8_E4M3": {E4M3FN.Decode(1 << 3), E4M3FN.Decode(1), 8},
		"F8_E5M2": {E5M2.Decode(1 << 2), E5M2.Decode(1), 8},
		"F8_E8M0": {E8M0.Decode(0), E8M0.Decode(0), 8},
	}
	if len(Binaries) != len(decoded) {
		t.Errorf("%d formats in Binaries, %d probed", len(Binaries), len(decoded))
	}
	for name, b := range Binaries {
		p, ok := decoded[name]
		if !ok {
			t.Errorf("%s: no decoder probe", name)
			continue
		}
		if b.Name != name || b.Bits != p.bits {
			t.Errorf("%s: name %q, %d bits; want %q, %d", name, b.Name, b.Bits, name, p.bits)
		}
		if got := math.Ldexp(1, b.MinExp); got != p.minNormal {
			t.Errorf("%s: 2^MinExp = %g, the decoder's smallest normal %g", name, got, p.minNormal)
		}
		if got := math.Ldexp(1, b.MinExp-int(b.MantBits)); got != p.minSub {
			t.Errorf("%s: 2^(MinExp-MantBits) = %g, the decoder's smallest subnormal %g", name, got, p.minSub)
		}
	}
}
