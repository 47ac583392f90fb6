package formats_test

import (
	"math/rand/v2"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/formats"
)

var encodeSink uint8

// BenchmarkEncode is one Encode call of E2M1 (NVFP4's codes: inputs
// spread over its range) and of E4M3FN (its block scales), Saturate as
// the quantizer calls it; the nvfp4_quantize check makes one or three of
// these an element (issue 17: 47% of that check).
func BenchmarkEncode(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 6))
	xs := make([]float64, 1<<12)
	for _, c := range []struct {
		f     *formats.Minifloat
		scale float64
	}{{formats.E2M1, 6}, {formats.E4M3FN, 448}} {
		for i := range xs {
			xs[i] = r.NormFloat64() * c.scale / 3
		}
		b.Run(c.f.Name, func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				code, _ := c.f.Encode(xs[i&(len(xs)-1)], formats.Saturate)
				encodeSink += code
			}
		})
	}
}
