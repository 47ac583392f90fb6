package kvcache

import (
	"math"
	"math/rand"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/tensor"
)

func i32(shape []int, vals ...int64) *tensor.Tensor {
	return tensor.FromInt64s(tensor.I32, shape, vals)
}

func TestPagesErrors(t *testing.T) {
	cases := []struct {
		name  string
		table *tensor.Tensor
		lens  *tensor.Tensor
		p, nb int
		want  string
	}{
		{"capacity", tensor.New(tensor.I32, 3, 64), i32([]int{3}, 1, 1, 5000), 64, 4096,
			"seq_lens[2] = 5000 exceeds the block table's capacity 64*64 = 4096"},
		{"negative length", i32([]int{2, 1}, 0, 0), i32([]int{2}, 3, -3), 4, 1, "seq_lens[1] = -3 is negative"},
		{"block past the cache", i32([]int{2, 2}, 0, 1, 1, 9412), i32([]int{2}, 5, 6), 4, 4096,
			"block_table[1,1] = 9412 is outside the cache (NB = 4096)"},
		{"block -1 in use", i32([]int{1, 2}, 0, -1), i32([]int{1}, 5), 4, 2, "block_table[0,1] = -1 is outside the cache (NB = 2)"},
		{"rows disagree", i32([]int{2, 1}, 0, 0), i32([]int{3}, 1, 1, 1), 4, 2, "tensor seq_lens has 3 entries but block_table has 2 rows"},
		{"table rank", i32([]int{2}, 0, 0), i32([]int{2}, 1, 1), 4, 2, "tensor block_table has shape [2]; want [B, max_blocks]"},
		{"float table", tensor.New(tensor.F32, 1, 1), i32([]int{1}, 1), 4, 2, "tensor block_table has dtype F32"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := NewPages(c.table, c.lens, c.p, c.nb)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
	// Entries past seq_len are padding: -1 and garbage there are fine.
	if _, err := NewPages(i32([]int{2, 3}, 1, -1, 77777, 0, 1, -5), i32([]int{2}, 4, 5), 4, 2); err != nil {
		t.Errorf("padding entries past seq_lens: %v", err)
	}
}

func TestPagesLocate(t *testing.T) {
	// P = 4; request 0 (6 tokens) on blocks 3, 1; request 1 (0 tokens); request 2 (4 tokens) on block 0.
	p, err := NewPages(i32([]int{3, 2}, 3, 1, -1, -1, 0, 9), i32([]int{3}, 6, 0, 4), 4, 4)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ b, t, block, off int }{{0, 0, 3, 0}, {0, 3, 3, 3}, {0, 4, 1, 0}, {0, 5, 1, 1}, {2, 3, 0, 3}} {
		if bl, o := p.Locate(c.b, c.t); bl != c.block || o != c.off {
			t.Errorf("Locate(%d,%d) = (%d,%d), want (%d,%d)", c.b, c.t, bl, o, c.block, c.off)
		}
	}
	if p.Total() != 10 {
		t.Errorf("Total = %d, want 10", p.Total())
	}
	for row, want := range [][2]int{{0, 0}, {5, 0}, {6, 2}, {9, 2}} {
		_ = row
		if b, tk := p.Request(want[0]); b != want[1] {
			t.Errorf("Request(%d) = (%d,%d), want request %d", want[0], b, tk, want[1])
		}
	}
	if b, tk := p.Request(7); b != 2 || tk != 1 {
		t.Errorf("Request(7) = (%d,%d), want (2,1)", b, tk)
	}
}

// randomTokens returns n tokens of L+R bf16 values in about [-4, 4], with
// some tiles scaled up so fp8_ds_mla tiles have different scales.
func randomTokens(rng *rand.Rand, n, l, r int) (kvc, kpe *tensor.Tensor) {
	kv := make([]float64, n*l)
	for i := range kv {
		kv[i] = rng.NormFloat64() * math.Ldexp(1, (i/128)%5-2)
	}
	pe := make([]float64, n*r)
	for i := range pe {
		pe[i] = rng.NormFloat64()
	}
	return bf16([]int{n, l}, kv...), bf16([]int{n, r}, pe...)
}

// TestGatherOfWrite: writing tokens then gathering them gives the tokens back,
// exactly for bf16 and within half an E4M3 step (times the scale) for fp8.
// The bound is computed from the E4M3 spacing, not from the code.
func TestGatherOfWrite(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	for _, c := range []struct {
		kind   Kind
		l, r   int
		kScale float64
		conv   ScaleConvention
	}{
		{BF16, 6, 2, 0, ""}, {FP8E4M3, 6, 2, 0.01, ""}, {FP8E4M3, 6, 2, 1, ""},
		{FP8DSMLA, 512, 64, 0, ScaleAmax}, {FP8DSMLA, 512, 64, 0, ScalePow2},
	} {
		lay := mustLayout(t, c.kind, c.l, c.r, 4)
		if c.conv != "" {
			lay.DSScale = c.conv
		}
		const n = 9 // 3 pages, the last partial
		kvc, kpe := randomTokens(rng, n, c.l, c.r)
		// request 0's pages are blocks 4, 0, 2 of a 5-block cache
		pages := []int64{4, 0, 2}
		slots := make([]int64, n)
		for tk := range slots {
			slots[tk] = pages[tk/4]*4 + int64(tk%4)
		}
		w, err := Write(tensor.New(lay.CacheDTypes()[0], 5, 4, lay.EntrySize()), kvc, kpe, slots, lay, c.kScale)
		if err != nil {
			t.Fatal(err)
		}
		cache, err := New(w.After, lay, c.kScale)
		if err != nil {
			t.Fatal(err)
		}
		p, err := NewPages(i32([]int{1, 4}, 4, 0, 2, -1), i32([]int{1}, n), 4, 5)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Gather(cache, p, tensor.F64)
		if err != nil {
			t.Fatal(err)
		}
		d := c.l + c.r
		worst := 0.0
		for tk := 0; tk < n; tk++ {
			tileScale := [DSTiles]float64{}
			for j := 0; j < d; j++ {
				var x float64
				if j < c.l {
					x = kvc.Float64At(tk*c.l + j)
				} else {
					x = kpe.Float64At(tk*c.r + j - c.l)
				}
				g := got[tk*d+j]
				var bound float64
				switch {
				case c.kind == BF16, c.kind == FP8DSMLA && j >= c.l:
					bound = 0
				case c.kind == FP8E4M3:
					bound = halfStep(x/c.kScale) * c.kScale
				default:
					tile := j / DSTile
					if tileScale[tile] == 0 {
						amax := 0.0
						for k := tile * DSTile; k < (tile+1)*DSTile; k++ {
							amax = math.Max(amax, math.Abs(kvc.Float64At(tk*c.l+k)))
						}
						tileScale[tile] = amax / 448 // pow2 or not, the code lies within half a step of x/s
						if c.conv == ScalePow2 {
							tileScale[tile] = math.Pow(2, math.Ceil(math.Log2(math.Max(amax/448, 1e-4))))
						}
					}
					s := tileScale[tile]
					bound = halfStep(x/s)*s*(1+1e-6) + 1e-30
				}
				if e := math.Abs(g - x); e > bound {
					t.Fatalf("%s %s: token %d value %d: gathered %v, wrote %v, error %g > %g", c.kind, c.conv, tk, j, g, x, e, bound)
				} else if bound > 0 {
					worst = math.Max(worst, e/bound)
				}
			}
		}
		t.Logf("%s %s: worst error / half-step bound = %.3f", c.kind, c.conv, worst)
	}
}

// halfStep is half the spacing of E4M3 values around |q| (q within range).
func halfStep(q float64) float64 {
	a := math.Abs(q)
	e := math.Floor(math.Log2(a))
	if a == 0 || e < -6 {
		e = -6 // subnormals share the smallest normal binade's spacing
	}
	return math.Ldexp(1, int(e)-3) / 2
}

// TestPagedEqualsContiguous: the same tokens behind a scattered block table
// of P = 4 and stored contiguously with one page of P = seq_len give the same
// gathered rows, at every dequantization precision.
func TestPagedEqualsContiguous(t *testing.T) {
	rng := rand.New(rand.NewSource(11))
	seqLens := []int{7, 0, 4, 1}
	total := 12
	for _, kind := range []Kind{BF16, FP16, FP8E4M3, FP8DSMLA} {
		l, r := 10, 3
		if kind == FP8DSMLA {
			l, r = 512, 64
		}
		kvc, kpe := randomTokens(rng, total, l, r)
		// paged: 4 requests, max 2 blocks each, blocks shuffled in a cache of 8
		lay := mustLayout(t, kind, l, r, 4)
		table := []int64{6, 1, 0, 0, 3, -1, 5, 7}
		slots := make([]int64, 0, total)
		for b, n := range seqLens {
			for tk := 0; tk < n; tk++ {
				slots = append(slots, table[b*2+tk/4]*4+int64(tk%4))
			}
		}
		w, err := Write(tensor.New(lay.CacheDTypes()[0], 8, 4, lay.EntrySize()), kvc, kpe, slots, lay, 0.03)
		if err != nil {
			t.Fatal(err)
		}
		cache, _ := New(w.After, lay, 0.03)
		p, err := NewPages(i32([]int{4, 2}, table...), i32([]int{4}, 7, 0, 4, 1), 4, 8)
		if err != nil {
			t.Fatal(err)
		}
		for _, deq := range []tensor.DType{tensor.F64, tensor.F32, tensor.BF16} {
			paged, err := Gather(cache, p, deq)
			if err != nil {
				t.Fatal(err)
			}
			row := 0
			for b, n := range seqLens {
				if n == 0 {
					continue
				}
				// contiguous: one block of P = n holding request b's tokens in order
				cl := mustLayout(t, kind, l, r, n)
				cslots := make([]int64, total)
				for i := range cslots {
					cslots[i] = -1
				}
				for tk := 0; tk < n; tk++ {
					cslots[row+tk] = int64(tk)
				}
				cw, err := Write(tensor.New(cl.CacheDTypes()[0], 1, n, cl.EntrySize()), kvc, kpe, cslots, cl, 0.03)
				if err != nil {
					t.Fatal(err)
				}
				cc, _ := New(cw.After, cl, 0.03)
				dst := make([]float64, l+r)
				for tk := 0; tk < n; tk++ {
					cc.Row(0, tk, dst, deq)
					for j, v := range dst {
						if pv := paged[(row+tk)*(l+r)+j]; pv != v && !(math.IsNaN(pv) && math.IsNaN(v)) {
							t.Fatalf("%s deq %s: request %d token %d value %d: paged %v, contiguous %v", kind, deq, b, tk, j, pv, v)
						}
					}
				}
				row += n
			}
		}
	}
}

// TestRowDequantPrecision: k_scale 0.1 is not a power of two, so the
// precisions differ. fp32(0.1) = 0x3DCCCCCD = 0.100000001490116...
func TestRowDequantPrecision(t *testing.T) {
	lay := mustLayout(t, FP8E4M3, 2, 0, 1)
	ct := tensor.New(tensor.U8, 1, 1, 2)
	ct.Data[0] = 0x38 // 1.0
	ct.Data[1] = 0x7E // 448
	c, err := New(ct, lay, 0.1)
	if err != nil {
		t.Fatal(err)
	}
	dst := make([]float64, 2)
	for _, tc := range []struct {
		deq  tensor.DType
		want [2]float64
		why  string
	}{
		{tensor.F64, [2]float64{0.100000001490116119384765625, 448 * 0.100000001490116119384765625}, "e4m3 * fp32(0.1), exact"},
		// 448 * 0x3DCCCCCD = 44.800000667572021 lies 1.43e-6 above fp32 44.79999923706055 (0x42333333) and 2.38e-6 below the next (ulp 2^-18): rounds down
		{tensor.F32, [2]float64{0.100000001490116119384765625, 44.79999923706054688}, "fp32 product"},
		// 0x3DCCCCCD -> bf16 0x3DCD = 0.10009765625; 0x42333333 -> bf16 0x4233 = 44.75
		{tensor.BF16, [2]float64{0.10009765625, 44.75}, "fp32 product rounded to bf16"},
	} {
		c.Row(0, 0, dst, tc.deq)
		if dst[0] != tc.want[0] || dst[1] != tc.want[1] {
			t.Errorf("%s (%s): got %v, want %v", tc.deq, tc.why, dst, tc.want)
		}
	}
}

func TestRowAllocFree(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	for _, kind := range []Kind{BF16, FP16, FP8E4M3, FP8DSMLA} {
		lay := mustLayout(t, kind, 512, 64, 64)
		ct := tensor.New(lay.CacheDTypes()[0], 2, 64, lay.EntrySize())
		rng.Read(ct.Data)
		c, err := New(ct, lay, 0.5)
		if err != nil {
			t.Fatal(err)
		}
		dst := make([]float64, 576)
		if a := testing.AllocsPerRun(100, func() { c.Row(1, 63, dst, tensor.BF16) }); a != 0 {
			t.Errorf("%s: Row allocates %v times a call", kind, a)
		}
	}
}

func BenchmarkRow(b *testing.B) {
	for _, kind := range []Kind{BF16, FP16, FP8E4M3, FP8DSMLA} {
		for _, deq := range []tensor.DType{tensor.F64, tensor.BF16} {
			b.Run(string(kind)+"/"+string(deq), func(b *testing.B) {
				lay, _ := NewLayout(kind, 512, 64, 64)
				ct := tensor.New(lay.CacheDTypes()[0], 2048, 64, lay.EntrySize())
				rand.New(rand.NewSource(1)).Read(ct.Data)
				c, _ := New(ct, lay, 0.5)
				dst := make([]float64, 576)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					c.RowSlot(i%c.Slots(), dst, deq)
				}
			})
		}
	}
}
