package mla

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/internal/simd"
	"github.com/kcheck-dev/kcheck/reference/kvcache"
	"github.com/kcheck-dev/kcheck/reference/splitk"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// benchDense builds a decode of b requests of n tokens each over a bf16 (or
// fp8_ds_mla) cache of 64-token pages handed out in shuffled order, with
// bf16 queries of h heads: the shapes of the real models (L = 512, R = 64).
func benchDense(tb testing.TB, kind kvcache.Kind, b, h, n int) *Dense {
	tb.Helper()
	const l, r, p = 512, 64, 64
	rng := rand.New(rand.NewPCG(7, uint64(b*h+n)))
	lay, err := kvcache.NewLayout(kind, l, r, p)
	if err != nil {
		tb.Fatal(err)
	}
	perReq := (n + p - 1) / p
	nb := b * perReq
	ct := tensor.New(lay.CacheDTypes()[0], nb, p, lay.EntrySize())
	fillCache(rng, ct.Data, lay)
	c, err := kvcache.New(ct, lay, 1)
	if err != nil {
		tb.Fatal(err)
	}
	perm := rng.Perm(nb)
	bt := make([]int64, nb)
	for i, v := range perm {
		bt[i] = int64(v)
	}
	sl := make([]int64, b)
	for i := range sl {
		sl[i] = int64(n)
	}
	pg, err := kvcache.NewPages(tensor.FromInt64s(tensor.I32, []int{b, perReq}, bt),
		tensor.FromInt64s(tensor.I32, []int{b}, sl), p, nb)
	if err != nil {
		tb.Fatal(err)
	}
	q := Query{B: b, SQ: 1, H: h, D: l + r, Data: make([]float64, b*h*(l+r))}
	for i := range q.Data {
		q.Data[i] = float64(math.Float32frombits(math.Float32bits(float32(rng.NormFloat64())) &^ 0xFFFF))
	}
	return &Dense{Q: q, Cache: c, Pages: pg}
}

// fillCache writes random entries: bf16 values of a unit normal (truncated
// from fp32), or for fp8_ds_mla random finite e4m3 codes with tile scales
// of 1/64 and bf16 rope values.
func fillCache(rng *rand.Rand, data []byte, lay kvcache.Layout) {
	bf := func(dst []byte) {
		for i := 0; i+2 <= len(dst); i += 2 {
			binary.LittleEndian.PutUint16(dst[i:], uint16(math.Float32bits(float32(rng.NormFloat64()))>>16))
		}
	}
	if lay.Kind == kvcache.BF16 {
		bf(data)
		return
	}
	for e := 0; e+kvcache.DSEntryBytes <= len(data); e += kvcache.DSEntryBytes {
		ent := data[e : e+kvcache.DSEntryBytes]
		for i := 0; i < kvcache.DSLatent; i++ {
			ent[i] = uint8(rng.IntN(256)) &^ 0x80 // below NaN
			if rng.IntN(2) == 1 {
				ent[i] |= 0x80
			}
			if ent[i]&0x7F == 0x7F {
				ent[i]--
			}
		}
		for t := 0; t < kvcache.DSTiles; t++ {
			binary.LittleEndian.PutUint32(ent[kvcache.DSScaleOff+4*t:], math.Float32bits(1.0/64))
		}
		bf(ent[kvcache.DSRopeOff:])
	}
}

func benchCfg() Config {
	return Config{SoftmaxScale: 1 / math.Sqrt(192), LSE: splitk.DefaultConvention()}
}

// BenchmarkDecode: kimi-k2's 64 and deepseek-v3's 128 heads, 4 requests,
// short contexts (the long ones are internal/bench's).
func BenchmarkDecode(b *testing.B) {
	for _, c := range []struct {
		kind kvcache.Kind
		h, n int
	}{{kvcache.BF16, 64, 2048}, {kvcache.BF16, 128, 1024}, {kvcache.FP8DSMLA, 128, 1024}} {
		b.Run(fmt.Sprintf("%s/H%d/N%d", c.kind, c.h, c.n), func(b *testing.B) {
			p := benchDense(b, c.kind, 4, c.h, c.n)
			flops := float64(4*c.h*c.n) * 2 * (576 + 512)
			b.ResetTimer()
			for b.Loop() {
				if _, _, err := Decode(context.Background(), p, benchCfg(), DefaultPrecision()); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

func BenchmarkDecodePartials(b *testing.B) {
	p := benchDense(b, kvcache.BF16, 4, 64, 2048)
	for b.Loop() {
		if _, _, err := DecodePartials(context.Background(), p, benchCfg(), DefaultPrecision(), 8, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkKernels times the inner loops alone on one goroutine: 64 query
// rows against one block of 64 cache rows of D = 576 (L = 512), and the PV
// updates of the 64 rows over them, at every level this CPU runs (the
// plain-Go definitions first), side by side.
func BenchmarkKernels(b *testing.B) {
	const g, d, l = 64, 576, 512
	rng := rand.New(rand.NewPCG(1, 2))
	bf := func(n int) []float64 {
		v := make([]float64, n)
		for i := range v {
			v[i] = float64(math.Float32frombits(math.Float32bits(float32(rng.NormFloat64())) &^ 0xFFFF))
		}
		return v
	}
	q, k := bf(g*d), bf(Block*d)
	rows := make([]rowSpec, g)
	for r := range rows {
		rows[r].q = r * d
	}
	var p qpack
	p.pack(q, rows, d) // for its stride; each level packs again, in its layout
	sx, sr := make([]float64, Block*p.stride), make([]float64, Block*p.stride)
	acc := make([]float64, g*l)
	pr := bf(g * Block)
	a32, p32, v32 := make([]float32, g*l), make([]float32, g*Block), make([]float32, Block*l)
	for i := range p32 {
		p32[i] = float32(pr[i])
	}
	for j := 0; j < Block; j++ {
		for c := 0; c < l; c++ {
			v32[j*l+c] = float32(k[j*d+c])
		}
	}
	report := func(b *testing.B, macs float64) {
		b.ReportMetric(2*macs*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
	}
	kernels := []struct {
		name string
		run  func()
		macs float64
	}{
		{"scores", func() { scores(&p, k, d, Block, sx, sr, r32, false) }, g * Block * d},
		{"scoresFused", func() { scores(&p, k, d, Block, sx, sr, r32, true) }, g * Block * d},
		{"pvExact", func() { pvExact(acc, l, pr, Block, k, d, Block, l, g) }, g * Block * l},
		{"pvExpected32", func() { pvExpected32(a32, l, p32, Block, v32, Block, l, g) }, g * Block * l},
	}
	for _, c := range kernels {
		b.Run(c.name, func(b *testing.B) {
			simd.AtEachLevel(b, &level, levels, func(b *testing.B) {
				p.pack(q, rows, d) // in this level's layout
				for b.Loop() {
					c.run()
				}
				report(b, c.macs)
			})
		})
	}
}

// peakRSS is the process's VmHWM in bytes (0 where /proc is missing).
func peakRSS() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb * 1024
		}
	}
	return 0
}

// BenchmarkDecodeMemory reports the memory bound as a figure: a decode of 4
// requests x 16K tokens, 128 heads, reads a 72 MiB cache through Cache.Row
// and must not hold more than a few blocks of rows besides its inputs and
// outputs (internal/bench's table reports the real sizes, one process per
// case).
func BenchmarkDecodeMemory(b *testing.B) {
	p := benchDense(b, kvcache.BF16, 4, 128, 16384)
	inputs := float64(p.Cache.NB*p.Cache.Layout.PageSize*p.Cache.D()*2 + 8*len(p.Q.Data))
	before := peakRSS()
	for b.Loop() {
		if _, _, err := Decode(context.Background(), p, benchCfg(), DefaultPrecision()); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(inputs/(1<<20), "inputs-MiB")
	b.ReportMetric(peakRSS()/(1<<20), "peak-RSS-MiB")
	b.ReportMetric((peakRSS()-before)/(1<<20), "peak-growth-MiB")
}
