package kvcache

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/internal/guard"
	"github.com/kcheck-dev/kcheck/reference/internal/simd"
)

// TestWidenBF16EveryCode: at every level this CPU runs, every bf16 code, at every length and alignment
// from 0 to 19 values (the vector loop's remainders), widens into a slice
// between NaN guards (package guard) to the bits of the generic definition (NaN payloads included: no arithmetic touches them).
func TestWidenBF16EveryCode(t *testing.T) {
	simd.AtEachLevel(t, &level, levels, testWidenBF16EveryCode)
}

func testWidenBF16EveryCode(t *testing.T) {
	src := make([]byte, 2*65536)
	for c := 0; c < 65536; c++ {
		binary.LittleEndian.PutUint16(src[2*c:], uint16(c))
	}
	got, want := make([]float64, 65536), make([]float64, 65536)
	widenBF16(got, src)
	widenBF16Generic(want, src)
	for c := range got {
		if math.Float64bits(got[c]) != math.Float64bits(want[c]) {
			t.Fatalf("code %#04x widens to %v, want %v", c, got[c], want[c])
		}
	}
	if want[0x3F80] != 1 || want[0xC000] != -2 || !math.IsInf(want[0x7F80], 1) {
		t.Fatalf("definition: 0x3F80 -> %v, 0xC000 -> %v, 0x7F80 -> %v; want 1, -2, +Inf", want[0x3F80], want[0xC000], want[0x7F80])
	}
	for n := 0; n < 20; n++ {
		for off := 0; off < 3; off++ {
			gg, w := guard.Zeros[float64](n), make([]float64, n)
			g := gg.S()
			widenBF16(g, src[2*(1000+off):])
			if err := gg.Overrun(); err != nil {
				t.Fatalf("n=%d offset %d: %v", n, off, err)
			}
			widenBF16Generic(w, src[2*(1000+off):])
			for i := range g {
				if math.Float64bits(g[i]) != math.Float64bits(w[i]) {
					t.Fatalf("n=%d offset %d: value %d is %v, want %v", n, off, i, g[i], w[i])
				}
			}
		}
	}
}
