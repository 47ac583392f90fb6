package kvcache

import (
	"encoding/binary"
	"math"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// TestScaleReadFactor: the factor each reader multiplies by, in hex floats
// so that ties are exact. bf16 rounds to nearest even (FlashMLA sm90's
// (bf16) conversion); e8m0_rz is the power of two at or below the scale
// (cudaRoundZero of an exponent-only format, FlashMLA sm100), clamped at
// E8M0's smallest 2^-127, NaN where E8M0 has no code.
func TestScaleReadFactor(t *testing.T) {
	nan := float32(math.NaN())
	for _, c := range []struct {
		s               float32
		f32, bf16, e8m0 float32
	}{
		{0x1.333334p-2, 0x1.333334p-2, 0x1.34p-2, 0x1p-2}, // 0.3: bf16 rounded up, e8m0 down to 0.25
		{0x1p-2, 0x1p-2, 0x1p-2, 0x1p-2},                  // a power of two: every reader agrees
		{0x1.fffffep-2, 0x1.fffffep-2, 0x1p-1, 0x1p-2},    // just below 0.5: bf16 carries, e8m0 keeps 0.25
		{0x1.01p0, 0x1.01p0, 0x1p0, 0x1p0},                // 1 + 2^-8, a bf16 tie: to even (down)
		{0x1.03p0, 0x1.03p0, 0x1.04p0, 0x1p0},             // 1 + 3·2^-8, a bf16 tie: to even (up)
		{0x1p-126, 0x1p-126, 0x1p-126, 0x1p-126},          // FLT_MIN, vLLM's amax floor
		{0x1p-140, 0x1p-140, 0, 0x1p-127},                 // below bf16 (smallest 2^-133): 0; below E8M0: its smallest
		{0, 0, 0, nan}, {-1, -1, -1, nan}, {float32(math.Inf(1)), float32(math.Inf(1)), float32(math.Inf(1)), nan},
	} {
		for _, r := range []struct {
			read ScaleRead
			want float32
		}{{ScaleReadF32, c.f32}, {ScaleReadBF16, c.bf16}, {ScaleReadE8M0RZ, c.e8m0}} {
			got := r.read.Factor(c.s)
			if got != r.want && !(math.IsNaN(float64(got)) && math.IsNaN(float64(r.want))) {
				t.Errorf("%s.Factor(%x) = %x, want %x", r.read, c.s, got, r.want)
			}
			// idempotent: a read factor reads as itself
			if g2 := r.read.Factor(got); got > 0 && !math.IsInf(float64(got), 0) && g2 != got {
				t.Errorf("%s.Factor twice (%x): %x then %x", r.read, c.s, got, g2)
			}
		}
	}
}

// TestScaleReadRow: an fp8_ds_mla entry whose tile scales are 0.3, 0.25,
// 0.75 and 1.5, every code 1.5 (e4m3 0x3c), read by each reader: exactly
// 1.5 times the factor, and at bf16 the bf16 product.
func TestScaleReadRow(t *testing.T) {
	data := make([]byte, DSEntryBytes)
	for j := 0; j < DSLatent; j++ {
		data[j] = 0x3c // 1.5
	}
	scales := []float32{0x1.333334p-2, 0x1p-2, 0x1.8p-1, 0x1.8p0}
	for i, s := range scales {
		binary.LittleEndian.PutUint32(data[DSScaleOff+4*i:], math.Float32bits(s))
	}
	lay, err := NewLayout(FP8DSMLA, DSLatent, DSRope, 1)
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewNamed("kv_cache", &tensor.Tensor{DType: tensor.U8, Shape: []int{1, 1, DSEntryBytes}, Data: data}, lay, 0)
	if err != nil {
		t.Fatal(err)
	}
	row := make([]float64, DSLatent+DSRope)
	want := map[ScaleRead][]float64{
		ScaleReadF32:    {1.5 * float64(scales[0]), 0.375, 1.125, 2.25},
		ScaleReadBF16:   {1.5 * 0x1.34p-2, 0.375, 1.125, 2.25},
		ScaleReadE8M0RZ: {0.375, 0.375, 0.75, 1.5},
	}
	for _, r := range []ScaleRead{ScaleReadF32, ScaleReadBF16, ScaleReadE8M0RZ} {
		if err := c.SetScaleRead(r); err != nil {
			t.Fatal(err)
		}
		for _, deq := range []tensor.DType{tensor.F64, tensor.BF16} {
			c.Row(0, 0, row, deq)
			for tile, w := range want[r] {
				if deq == tensor.BF16 {
					w = float64(formats.BF16Decode(formats.BF16Encode(float32(w))))
				}
				if got := row[tile*DSTile]; got != w {
					t.Errorf("%s, %s: tile %d reads %v, want %v", r, deq, tile, got, w)
				}
			}
		}
	}
	if err := c.SetScaleRead("e8m0"); err == nil || !strings.Contains(err.Error(), "want f32, bf16 or e8m0_rz") {
		t.Errorf("unknown reading: %v", err)
	}
}
