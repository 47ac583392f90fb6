package mla

import (
	"context"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/kvcache"
	"github.com/kcheck-dev/kcheck/reference/splitk"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// The row oracle is the package doc's arithmetic written one output row at a
// time with the plainest loops (it is the engine as it was before its inner
// loops were blocked): every score a dot product over one cache row, every
// PV update a loop over the latent columns. The blocked, parallel engine
// must reproduce it bit for bit, for both answers.

// oracleDot is the score, both answers: k-blocks of 16 products, even and
// odd positions summed separately in float64, the block sum added to the
// exact dot in float64 and to the emulated MMA's accumulator rounded to m.
func oracleDot(q, k []float64, m rmode) (exact, acc float64) {
	for d0 := 0; d0 < len(q); d0 += MMAK {
		d1 := min(d0+MMAK, len(q))
		var s0, s1 float64
		d := d0
		for ; d+2 <= d1; d += 2 {
			s0 += float64(q[d] * k[d])
			s1 += float64(q[d+1] * k[d+1])
		}
		if d < d1 {
			s0 += float64(q[d] * k[d])
		}
		exact += s0 + s1
		acc = m.round(acc + (s0 + s1))
	}
	return exact, acc
}

type oracleOut struct {
	exOut, xpOut []float64
	exLSE, xpLSE float64
}

// oracleRow decodes one output row: query q over the cache tokens toks (in
// order), with empty the lse of a row that sees nothing.
func oracleRow(c *kvcache.Cache, q []float64, toks [][2]int, cfg Config, prec Precision, empty float64, outDT, lseDT tensor.DType) oracleOut {
	D, L := c.D(), cfg.V(c.Layout.L)
	acc, _ := modeOf("", prec.Acc)
	pm, _ := modeOf("", prec.P)
	scaleLog2 := float64(float32(cfg.SoftmaxScale * math.Log2E))
	scale32 := float64(float32(cfg.SoftmaxScale))
	res := oracleOut{exOut: make([]float64, L), xpOut: make([]float64, L)}
	if len(toks) == 0 {
		res.exLSE, res.xpLSE = empty, splitk.RoundTo(lseDT, empty)
		return res
	}
	exM, exSum, exAcc := math.Inf(-1), 0.0, make([]float64, L)
	xpM, xpSum, xpAcc := math.Inf(-1), 0.0, make([]float64, L)
	kx, kr := make([]float64, Block*D), make([]float64, Block*D)
	s := make([]float64, Block)
	for c0 := 0; c0 < len(toks); c0 += Block {
		nj := min(Block, len(toks)-c0)
		for j := 0; j < nj; j++ {
			c.Row(toks[c0+j][0], toks[c0+j][1], kx[j*D:(j+1)*D], tensor.F64)
			c.Row(toks[c0+j][0], toks[c0+j][1], kr[j*D:(j+1)*D], prec.KVDequant)
		}
		// exact
		bm := math.Inf(-1)
		for j := 0; j < nj; j++ {
			ex, _ := oracleDot(q, kx[j*D:(j+1)*D], acc)
			s[j] = cfg.SoftmaxScale * ex
			if s[j] > bm {
				bm = s[j]
			}
		}
		if bm > exM {
			if exSum != 0 {
				a := expDef(exM - bm)
				exSum *= a
				for l := range exAcc {
					exAcc[l] *= a
				}
			}
			exM = bm
		}
		for j := 0; j < nj; j++ {
			p := expDef(s[j] - exM)
			exSum += p
			for l, x := range kx[j*D : j*D+L] {
				exAcc[l] = math.FMA(p, x, exAcc[l])
			}
		}
		// expected
		bm = xpM
		for j := 0; j < nj; j++ {
			_, s[j] = oracleDot(q, kr[j*D:(j+1)*D], acc)
			if s[j] > bm {
				bm = s[j]
			}
		}
		if bm > xpM {
			if !math.IsInf(xpM, -1) {
				a := exp2f(float64(float32(xpM-bm)) * scaleLog2)
				xpSum = float64(float32(xpSum * a))
				for l := range xpAcc {
					xpAcc[l] = acc.round(xpAcc[l] * a)
				}
			}
			xpM = bm
		}
		maxScaled := float64(float32(xpM * scaleLog2))
		for j := 0; j < nj; j++ {
			p := exp2f(s[j]*scaleLog2 - maxScaled)
			xpSum = float64(float32(xpSum + p))
			pr := pm.round(p)
			for l, x := range kr[j*D : j*D+L] {
				if acc == r64 {
					xpAcc[l] += float64(pr * x)
				} else {
					xpAcc[l] = acc.round(xpAcc[l] + pr*x)
				}
			}
		}
	}
	for l := range exAcc {
		res.exOut[l] = exAcc[l] / exSum
	}
	res.exLSE = exM + math.Log(exSum)
	if cfg.LSE.Base == splitk.Base2 {
		res.exLSE *= math.Log2E
	}
	inv := float64(float32(1 / xpSum))
	for l := range xpAcc {
		res.xpOut[l] = splitk.RoundTo(outDT, float64(float32(xpAcc[l]*inv)))
	}
	if cfg.LSE.Base == splitk.Base2 {
		res.xpLSE = float64(float32(xpM*scaleLog2 + float64(float32(math.Log2(xpSum)))))
	} else {
		res.xpLSE = float64(float32(xpM*scale32 + float64(float32(math.Log(xpSum)))))
	}
	res.xpLSE = splitk.RoundTo(lseDT, res.xpLSE)
	return res
}

func sameBitsAt(t *testing.T, what string, got []float64, off int, want []float64) {
	t.Helper()
	sameBits(t, what, got[off:off+len(want)], want)
}

func sameBit(t *testing.T, what string, got, want float64) {
	t.Helper()
	sameBits(t, what, []float64{got}, []float64{want})
}

// oracleCase is one configuration the blocked engine is held to the oracle on.
type oracleCase struct {
	name string
	kind kvcache.Kind
	prec Precision
	base splitk.Base
}

func oracleCases() []oracleCase {
	def := DefaultPrecision()
	f32p := def
	f32p.P, f32p.Out = tensor.F32, tensor.F32
	bfAcc := def
	bfAcc.Acc = tensor.BF16
	f16 := def
	f16.Acc, f16.P, f16.KVDequant = tensor.F16, tensor.F16, tensor.F16
	f64 := def
	f64.Acc, f64.P, f64.KVDequant, f64.Out = tensor.F64, tensor.F64, tensor.F64, tensor.F64
	deq32 := def
	deq32.KVDequant = tensor.F32
	// an fp16 model: P, out, lse and partials in fp16 (TRITON_MLA's lse is
	// in q's dtype); the partials' lse in bf16, a dtype of its own
	fp16 := def
	fp16.P, fp16.Out, fp16.LSE, fp16.PartialOut, fp16.PartialLSE = tensor.F16, tensor.F16, tensor.F16, tensor.F16, tensor.BF16
	return []oracleCase{
		{"fp16/default", kvcache.FP16, def, splitk.BaseE},
		{"fp16/fp16-model", kvcache.FP16, fp16, splitk.Base2},
		{"bf16/default", kvcache.BF16, def, splitk.BaseE},
		{"bf16/p-f32/base2", kvcache.BF16, f32p, splitk.Base2},
		{"bf16/acc-bf16", kvcache.BF16, bfAcc, splitk.BaseE},
		{"bf16/f16", kvcache.BF16, f16, splitk.BaseE},
		{"bf16/f64", kvcache.BF16, f64, splitk.BaseE},
		{"fp8_e4m3/default", kvcache.FP8E4M3, def, splitk.BaseE},
		{"fp8_e4m3/deq-f32", kvcache.FP8E4M3, deq32, splitk.Base2},
		{"fp8_ds_mla/default", kvcache.FP8DSMLA, def, splitk.BaseE},
		{"fp8_ds_mla/f64", kvcache.FP8DSMLA, f64, splitk.BaseE},
		// DeepSeek-V4: values are the whole 512-dim entry (Config.ValueDims)
		{"fp8_ds_mla_model1/default", kvcache.FP8DSMLAModel1, def, splitk.BaseE},
		{"fp8_ds_mla_model1/deq-f32", kvcache.FP8DSMLAModel1, deq32, splitk.Base2},
	}
}

// oracleCache fills a cache of the kind with random entries: bf16 rows of
// normals with exact zeros and tiny values mixed in (so fp32 products would
// underflow), fp8 codes of every finite value, ds_mla tiles with varied scales.
func oracleCache(t *testing.T, rng *rand.Rand, kind kvcache.Kind, nb, p, l, r int) *kvcache.Cache {
	t.Helper()
	lay, err := kvcache.NewLayout(kind, l, r, p)
	if err != nil {
		t.Fatal(err)
	}
	ct := tensor.New(lay.CacheDTypes()[0], nb, p, lay.EntrySize())
	bf := func(dst []byte) {
		for i := 0; i+2 <= len(dst); i += 2 {
			v := float32(2 * rng.NormFloat64())
			switch rng.IntN(40) {
			case 0:
				v = 0
			case 1:
				v *= 0x1p-70
			}
			binary.LittleEndian.PutUint16(dst[i:], uint16(math.Float32bits(v)>>16))
		}
	}
	code := func() uint8 {
		c := uint8(rng.IntN(256))
		if c&0x7F == 0x7F {
			c--
		}
		return c
	}
	switch kind {
	case kvcache.BF16:
		bf(ct.Data)
	case kvcache.FP16:
		for i := 0; i+2 <= len(ct.Data); i += 2 {
			v := float32(2 * rng.NormFloat64())
			switch rng.IntN(40) {
			case 0:
				v = 0
			case 1:
				v *= 0x1p-20 // an fp16 subnormal, so fp32 products of P come near underflow
			}
			binary.LittleEndian.PutUint16(ct.Data[i:], formats.FP16Encode(v))
		}
	case kvcache.FP8E4M3:
		for i := range ct.Data {
			ct.Data[i] = code()
		}
	case kvcache.FP8DSMLA:
		for e := 0; e+kvcache.DSEntryBytes <= len(ct.Data); e += kvcache.DSEntryBytes {
			ent := ct.Data[e : e+kvcache.DSEntryBytes]
			for i := 0; i < kvcache.DSLatent; i++ {
				ent[i] = code()
			}
			for k := 0; k < kvcache.DSTiles; k++ {
				s := float32(math.Ldexp(1+rng.Float64(), -rng.IntN(12)))
				binary.LittleEndian.PutUint32(ent[kvcache.DSScaleOff+4*k:], math.Float32bits(s))
			}
			bf(ent[kvcache.DSRopeOff:])
		}
	case kvcache.FP8DSMLAModel1:
		for slot := 0; slot < nb*p; slot++ {
			for col := 0; col < kvcache.M1EntryBytes; col++ {
				i := lay.Offset(slot, col)
				switch part, tile := lay.PartOf(col); {
				case part == kvcache.PartLatent:
					ct.Data[i] = code()
				case part == kvcache.PartScale && tile >= 0:
					ct.Data[i] = uint8(127 - rng.IntN(12)) // E8M0 2^0 .. 2^-11
				case part == kvcache.PartScale:
					ct.Data[i] = 0xFF // the pad byte, never read: NaN if it were
				}
			}
			off := lay.Offset(slot, kvcache.M1Nope)
			bf(ct.Data[off : off+2*kvcache.M1Rope])
		}
	}
	c, err := kvcache.New(ct, lay, 0.0625)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestEngineMatchesRowOracle holds Decode, DecodePartials and DecodeSparse to
// the row oracle, bit for bit, over every cache kind and precision the
// engine has a separate path for, with a D that is no multiple of 4 or 16
// (the dot products' tails), a head count that is no multiple of a lane
// group, causal s_q = 2, empty and multi-block requests.
func TestEngineMatchesRowOracle(t *testing.T) {
	rng := rand.New(rand.NewPCG(2024, 6))
	for _, oc := range oracleCases() {
		t.Run(oc.name, func(t *testing.T) {
			l, r := 37, 6
			if oc.kind == kvcache.FP8DSMLA {
				l, r = kvcache.DSLatent, kvcache.DSRope
			}
			if oc.kind == kvcache.FP8DSMLAModel1 {
				l, r = kvcache.M1Nope, kvcache.M1Rope
			}
			if oc.kind == kvcache.FP8E4M3 {
				l, r = 40, 8
			}
			const p = 16
			seqLens := []int{0, 70, 2*Block + 9}
			var table [][]int
			nb := 0
			for _, n := range seqLens {
				nb += (n+p-1)/p + 1
			}
			perm := rng.Perm(nb)
			next := 0
			for _, n := range seqLens {
				var row []int
				for j := 0; j*p < n || j == 0; j++ {
					row = append(row, perm[next])
					next++
				}
				table = append(table, row)
			}
			c := oracleCache(t, rng, oc.kind, nb, p, l, r)
			pg := pagesOf(t, table, seqLens, p, nb)
			q := Query{B: len(seqLens), SQ: 2, H: 11, D: l + r}
			q.Data = randomBF16(rng, q.B*q.SQ*q.H*q.D, 1)
			q.Data[5] = 0
			cfg := Config{SoftmaxScale: 0.7, Causal: true, LSE: splitk.Convention{Base: oc.base, Empty: math.Inf(1)}}
			if oc.kind == kvcache.FP8DSMLAModel1 {
				cfg.ValueDims = l + r
			}
			D, L := q.D, cfg.V(l)
			qv := func(b, i, h int) []float64 { o := ((b*q.SQ+i)*q.H + h) * D; return q.Data[o : o+D] }

			ex, xp, err := Decode(context.Background(), &Dense{Q: q, Cache: c, Pages: pg}, cfg, oc.prec)
			if err != nil {
				t.Fatal(err)
			}
			for b, n := range seqLens {
				for i := 0; i < q.SQ; i++ {
					var toks [][2]int
					for tk := 0; tk < Visible(n, q.SQ, i, true); tk++ {
						blk, off := pg.Locate(b, tk)
						toks = append(toks, [2]int{blk, off})
					}
					for h := 0; h < q.H; h++ {
						want := oracleRow(c, qv(b, i, h), toks, cfg, oc.prec, cfg.LSE.Empty, oc.prec.Out, oc.prec.LSE)
						row := (b*q.SQ+i)*q.H + h
						sameBitsAt(t, "exact out", ex.Out, row*L, want.exOut)
						sameBitsAt(t, "expected out", xp.Out, row*L, want.xpOut)
						sameBit(t, "exact lse", ex.LSE[(b*q.H+h)*q.SQ+i], want.exLSE)
						sameBit(t, "expected lse", xp.LSE[(b*q.H+h)*q.SQ+i], want.xpLSE)
					}
				}
			}

			const S = 3
			pex, pxp, err := DecodePartials(context.Background(), &Dense{Q: q, Cache: c, Pages: pg}, cfg, oc.prec, S, nil)
			if err != nil {
				t.Fatal(err)
			}
			for b, n := range seqLens {
				for k := 0; k < S; k++ {
					lo, hi := pex.Bounds[b*(S+1)+k], pex.Bounds[b*(S+1)+k+1]
					for i := 0; i < q.SQ; i++ {
						var toks [][2]int
						for tk := lo; tk < min(hi, Visible(n, q.SQ, i, true)); tk++ {
							blk, off := pg.Locate(b, tk)
							toks = append(toks, [2]int{blk, off})
						}
						for h := 0; h < q.H; h++ {
							want := oracleRow(c, qv(b, i, h), toks, cfg, oc.prec, math.Inf(-1), oc.prec.PartialOut, oc.prec.PartialLSE)
							row := ((b*q.SQ+i)*q.H+h)*S + k
							sameBitsAt(t, "exact partial out", pex.Out, row*L, want.exOut)
							sameBitsAt(t, "expected partial out", pxp.Out, row*L, want.xpOut)
							sameBit(t, "exact partial lse", pex.LSE[row], want.exLSE)
							sameBit(t, "expected partial lse", pxp.LSE[row], want.xpLSE)
						}
					}
				}
			}

			const topk = 50
			sp := &Sparse{Q: q, Cache: c, TopK: topk, Indices: make([]int64, q.B*q.SQ*topk)}
			for i := range sp.Indices {
				sp.Indices[i] = int64(rng.IntN(c.Slots()+20)) - 10 // some -k and some past the cache
			}
			sex, sxp, err := DecodeSparse(context.Background(), sp, cfg, oc.prec)
			if err != nil {
				t.Fatal(err)
			}
			for b := 0; b < q.B; b++ {
				for i := 0; i < q.SQ; i++ {
					var toks [][2]int
					for _, s := range sp.ValidSlots(b, i) {
						toks = append(toks, [2]int{s / p, s % p})
					}
					for h := 0; h < q.H; h++ {
						want := oracleRow(c, qv(b, i, h), toks, cfg, oc.prec, cfg.LSE.Empty, oc.prec.Out, oc.prec.LSE)
						row := (b*q.SQ+i)*q.H + h
						sameBitsAt(t, "sparse exact out", sex.Out, row*L, want.exOut)
						sameBitsAt(t, "sparse expected out", sxp.Out, row*L, want.xpOut)
						sameBit(t, "sparse exact lse", sex.LSE[(b*q.H+h)*q.SQ+i], want.exLSE)
						sameBit(t, "sparse expected lse", sxp.LSE[(b*q.H+h)*q.SQ+i], want.xpLSE)
					}
				}
			}
		})
	}
}

// TestExpectedPVUnderflowFallsBack: the fp32 shortcut of the Expected PV
// update (bf16 P times bf16 values in float32) is exact only while every
// product is a normal float32. Here they are not: values 2^-126 and
// probabilities 1, 2^-23, 2^-24 (scores 0, -23, -24 with scale·log2e = 1)
// make the accumulator 2^-126 + 2^-149 (an odd multiple of the fp32 grid)
// and then add 2^-150, a tie: rounded in float64 first (the definition) it
// goes up to the even neighbour, while a float32 product would round to 0
// first and leave it. The engine must take the float64 path here.
func TestExpectedPVUnderflowFallsBack(t *testing.T) {
	tiny := math.Ldexp(1, -126)
	rows := []float64{tiny, 0, tiny, -23, tiny, -24} // [x (L=1) | rope (R=1)] per token
	c := bf16Cache(t, 1, 3, 1, 1, rows)
	pg := pagesOf(t, [][]int{{0}}, []int{3}, 3, 1)
	// 16 identical heads: units get at least two, which the PV update takes in pairs
	q := Query{B: 1, SQ: 1, H: 16, D: 2}
	for h := 0; h < q.H; h++ {
		q.Data = append(q.Data, 0, 1)
	}
	cfg := Config{SoftmaxScale: math.Ln2, LSE: splitk.DefaultConvention()}
	if float32(cfg.SoftmaxScale*math.Log2E) != 1 {
		t.Fatalf("fp32(ln2·log2e) = %v: the test needs it to be 1", float32(cfg.SoftmaxScale*math.Log2E))
	}
	prec := DefaultPrecision()
	prec.Out = tensor.F32
	_, xp, err := Decode(context.Background(), &Dense{Q: q, Cache: c, Pages: pg}, cfg, prec)
	if err != nil {
		t.Fatal(err)
	}
	toks := [][2]int{{0, 0}, {0, 1}, {0, 2}}
	want := oracleRow(c, q.Data[:2], toks, cfg, prec, cfg.LSE.Empty, prec.Out, prec.LSE)
	for h := 0; h < q.H; h++ {
		sameBitsAt(t, "expected out", xp.Out, h, want.xpOut)
	}
	// The float32-first answer differs, so the test can tell the paths apart.
	var acc float32
	for _, p := range []float32{1, 0x1p-23, 0x1p-24} {
		acc += p * float32(tiny)
	}
	sum := float64(float32(float32(1+0x1p-23) + 0x1p-24))
	if got := float64(float32(float64(acc) * float64(float32(1/sum)))); got == want.xpOut[0] {
		t.Fatalf("float32-first accumulation gives the same %v: the case does not separate the paths", got)
	}
}

// TestDeterministicAcrossGOMAXPROCS: Decode, DecodePartials and
// DecodeSparse at GOMAXPROCS 1, 2 and 8 (the work is shared out to that many
// goroutines, in units whose count depends on it), twice each, give the same
// bits for both answers. L = 64 and D = 80 are shapes the assembly kernels
// take (on amd64 with AVX-512), so they are what runs.
func TestDeterministicAcrossGOMAXPROCS(t *testing.T) {
	rng := rand.New(rand.NewPCG(77, 1))
	seqLens := []int{3*Block + 17, 1, 0, 2 * Block}
	pc, pp, _, _ := paged(t, rng, seqLens, 16, 64, 16)
	q := Query{B: len(seqLens), SQ: 2, H: 19, D: 80}
	q.Data = randomBF16(rng, q.B*q.SQ*q.H*q.D, 1)
	cfg := Config{SoftmaxScale: 0.3, Causal: true, LSE: splitk.DefaultConvention()}
	sp := &Sparse{Q: q, Cache: pc, TopK: 40, Indices: make([]int64, q.B*q.SQ*40)}
	for i := range sp.Indices {
		sp.Indices[i] = int64(rng.IntN(pc.Slots()))
	}
	run := func() [][]float64 {
		ex, xp, err := Decode(context.Background(), &Dense{Q: q, Cache: pc, Pages: pp}, cfg, DefaultPrecision())
		if err != nil {
			t.Fatal(err)
		}
		pex, pxp, err := DecodePartials(context.Background(), &Dense{Q: q, Cache: pc, Pages: pp}, cfg, DefaultPrecision(), 5, nil)
		if err != nil {
			t.Fatal(err)
		}
		sex, sxp, err := DecodeSparse(context.Background(), sp, cfg, DefaultPrecision())
		if err != nil {
			t.Fatal(err)
		}
		return [][]float64{ex.Out, ex.LSE, xp.Out, xp.LSE, pex.Out, pex.LSE, pxp.Out, pxp.LSE, sex.Out, sex.LSE, sxp.Out, sxp.LSE}
	}
	names := []string{"out", "lse", "expected out", "expected lse", "partial out", "partial lse", "expected partial out",
		"expected partial lse", "sparse out", "sparse lse", "expected sparse out", "expected sparse lse"}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	var ref [][]float64
	for _, p := range []int{1, 2, 8} {
		runtime.GOMAXPROCS(p)
		for r := 0; r < 2; r++ {
			got := run()
			if ref == nil {
				ref = got
				continue
			}
			for i := range got {
				sameBits(t, names[i], got[i], ref[i])
			}
		}
	}
}
