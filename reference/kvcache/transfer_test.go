package kvcache

import (
	"encoding/binary"
	"math/rand"
	"slices"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// transferOf routes and builds a transfer, failing the test on an error.
func transferOf(t *testing.T, src *tensor.Tensor, srcLay Layout, srcK float64, srcTable *tensor.Tensor,
	before *tensor.Tensor, dstLay Layout, dstK float64, dstTable, seqLens *tensor.Tensor, whole bool) *Transfer {
	t.Helper()
	sc, err := NewNamed("src_cache", src, srcLay, srcK)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := NewNamed("dst_cache_before", before, dstLay, dstK)
	if err != nil {
		t.Fatal(err)
	}
	r, err := RouteTransfer(srcTable, dstTable, seqLens, srcLay.PageSize, dstLay.PageSize, sc.NB, dc.NB, whole)
	if err != nil {
		t.Fatal(err)
	}
	mode := CopyConvert
	if SameLayout(srcLay, dstLay, srcK, dstK) {
		mode = CopyBytes
	}
	x, err := NewTransfer(sc, before, dc, r.Moves, mode)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// TestTransferByHand is the contract's sentence worked by hand: a bf16
// prefill cache of pages of 2 (L = 2, R = 1) sent to an fp8_e4m3 decode
// cache of pages of 4 with k_scale 0.5. Request 0 has 3 tokens: tokens 0
// and 1 in source block 3, token 2 at offset 0 of source block 1; on the
// decode side all three go to block 2, offsets 0..2. Each value is divided
// by 0.5 and rounded to E4M3 (1-4-3, bias 7), saturating:
//
//	 1.0   -> 2.0  = 2^1·1.0    exponent 8, mantissa 000: 0x40
//	 0.75  -> 1.5  = 2^0·1.5    exponent 7, mantissa 100: 0x3C
//	-3.0   -> -6.0 = -2^2·1.5   sign, exponent 9, mantissa 100: 0xCC
//	 0.125 -> 0.25 = 2^-2·1.0   exponent 5, mantissa 000: 0x28
//	 1000  -> 2000 > 448        saturates to 448 = 0x7E
//	-0.5   -> -1.0              sign, exponent 7: 0xB8
//	 2.5   -> 5.0  = 2^2·1.25   exponent 9, mantissa 010: 0x4A
//	 0.0   -> 0.0                                     0x00
//
// Every other destination byte keeps its 0xAA.
func TestTransferByHand(t *testing.T) {
	src := bf16([]int{4, 2, 3},
		-9, -9, -9, 2.5, 0, 0.3125, // block 0: not the request's
		-0.5, 2.5, 0, -9, -9, -9, // block 1: offset 0 = token 2
		-9, -9, -9, -9, -9, -9, // block 2
		1, 0.75, -3, 0.125, 1000, -0.5) // block 3: tokens 0 and 1
	before := tensor.New(tensor.U8, 3, 4, 3)
	for i := range before.Data {
		before.Data[i] = 0xAA
	}
	keep := before.Clone()
	srcLay := mustLayout(t, BF16, 2, 1, 2)
	dstLay := mustLayout(t, FP8E4M3, 2, 1, 4)
	x := transferOf(t, src, srcLay, 0, i32([]int{1, 2}, 3, 1), before, dstLay, 0.5, i32([]int{1, 1}, 2), i32([]int{1}, 3), false)
	if x.Mode != CopyConvert {
		t.Fatalf("bf16 to fp8_e4m3: mode %v, want a conversion", x.Mode)
	}
	want := slices.Repeat([]byte{0xAA}, 36)
	copy(want[24:], []byte{0x40, 0x3C, 0xCC, 0x28, 0x7E, 0xB8, 0xB8, 0x4A, 0x00})
	for _, exact := range []bool{false, true} {
		got := x.After(exact)
		if string(got.Data) != string(want) {
			t.Errorf("exact=%v: dst_cache_after\n got % x\nwant % x", exact, got.Data, want)
		}
	}
	if string(before.Data) != string(keep.Data) {
		t.Error("the transfer modified dst_cache_before")
	}
}

// cacheOfTokens writes n random tokens into a fresh cache of layout lay
// (nb blocks, poisoned with 0xFF elsewhere) at the slots of table, through
// kv_cache_write's reference, and returns the cache and the tokens.
func cacheOfTokens(t *testing.T, rng *rand.Rand, lay Layout, kScale float64, nb int, table []int64, maxBlocks int, seqLens []int, kvc, kpe *tensor.Tensor) *tensor.Tensor {
	t.Helper()
	d := tensor.U8
	if lay.Kind == BF16 {
		d = tensor.BF16
	}
	before := tensor.New(d, nb, lay.PageSize, lay.EntrySize())
	for i := range before.Data {
		before.Data[i] = 0xFF
	}
	var slots []int64
	for b, n := range seqLens {
		for tk := 0; tk < n; tk++ {
			slots = append(slots, table[b*maxBlocks+tk/lay.PageSize]*int64(lay.PageSize)+int64(tk%lay.PageSize))
		}
	}
	w, err := Write(before, kvc, kpe, slots, lay, kScale)
	if err != nil {
		t.Fatal(err)
	}
	return w.After
}

// shuffledTable is a block table for seqLens over pages of page tokens:
// distinct blocks in random order, with the unused entries -1.
func shuffledTable(rng *rand.Rand, seqLens []int, page, nb int) ([]int64, int) {
	mb := 1
	for _, n := range seqLens {
		mb = max(mb, (n+page-1)/page)
	}
	order := rng.Perm(nb)
	tab := slices.Repeat([]int64{-1}, len(seqLens)*mb)
	next := 0
	for b, n := range seqLens {
		for j := 0; j < (n+page-1)/page; j++ {
			tab[b*mb+j] = int64(order[next])
			next++
		}
	}
	return tab, mb
}

// TestTransferIdentity: a cache sent onto itself (same layout, same table,
// dst_cache_before = src_cache) is unchanged, byte for byte, in every layout.
func TestTransferIdentity(t *testing.T) {
	rng := rand.New(rand.NewSource(16))
	seqLens := []int{5, 9}
	for _, c := range []struct {
		kind   Kind
		l, r   int
		kScale float64
		conv   ScaleConvention
	}{{BF16, 6, 2, 0, ""}, {FP8E4M3, 6, 2, 0.02, ""}, {FP8DSMLA, 512, 64, 0, ScaleAmax}, {FP8DSMLA, 512, 64, 0, ScalePow2}} {
		lay := mustLayout(t, c.kind, c.l, c.r, 4)
		if c.conv != "" {
			lay.DSScale = c.conv
		}
		tab, mb := shuffledTable(rng, seqLens, 4, 6)
		kvc, kpe := randomTokens(rng, 14, c.l, c.r)
		src := cacheOfTokens(t, rng, lay, c.kScale, 6, tab, mb, seqLens, kvc, kpe)
		tt := tensor.FromInt64s(tensor.I32, []int{2, mb}, tab)
		x := transferOf(t, src, lay, c.kScale, tt, src, lay, c.kScale, tt, i32([]int{2}, 5, 9), false)
		if x.Mode != CopyBytes {
			t.Errorf("%s: mode %v, want a byte copy", c.kind, x.Mode)
		}
		if got := x.After(false); string(got.Data) != string(src.Data) {
			t.Errorf("%s %s: a cache sent onto itself changed", c.kind, c.conv)
		}
	}
}

// TestTransferFromBF16IsAWrite: from a bf16 prefill cache (which holds the
// tokens exactly) a transfer into any layout leaves what kv_cache_write of
// the same tokens at the decode side's slots leaves: the transfer's encoder
// is the writer's. And the pages move: a token's decode-side slot follows
// the decode table and page size, not the prefill side's.
func TestTransferFromBF16IsAWrite(t *testing.T) {
	rng := rand.New(rand.NewSource(17))
	seqLens := []int{7, 20, 1}
	for _, c := range []struct {
		kind   Kind
		kScale float64
		conv   ScaleConvention
	}{{BF16, 0, ""}, {FP8E4M3, 0.01, ""}, {FP8E4M3, 1, ""}, {FP8DSMLA, 0, ScaleAmax}, {FP8DSMLA, 0, ScalePow2}} {
		srcLay := mustLayout(t, BF16, 512, 64, 4)
		dstLay := mustLayout(t, c.kind, 512, 64, 8)
		if c.conv != "" {
			dstLay.DSScale = c.conv
		}
		kvc, kpe := randomTokens(rng, 28, 512, 64)
		srcTab, smb := shuffledTable(rng, seqLens, 4, 10)
		dstTab, dmb := shuffledTable(rng, seqLens, 8, 7)
		src := cacheOfTokens(t, rng, srcLay, 0, 10, srcTab, smb, seqLens, kvc, kpe)
		direct := cacheOfTokens(t, rng, dstLay, c.kScale, 7, dstTab, dmb, seqLens, kvc, kpe)
		before := direct.Clone()
		for i := range before.Data {
			before.Data[i] = 0xFF
		}
		x := transferOf(t, src, srcLay, 0, tensor.FromInt64s(tensor.I32, []int{3, smb}, srcTab),
			before, dstLay, c.kScale, tensor.FromInt64s(tensor.I32, []int{3, dmb}, dstTab), i32([]int{3}, 7, 20, 1), false)
		if got := x.After(false); string(got.Data) != string(direct.Data) {
			n := 0
			for i := range got.Data {
				if got.Data[i] != direct.Data[i] {
					n++
				}
			}
			t.Errorf("bf16 -> %s %s: %d of %d bytes differ from kv_cache_write of the same tokens", c.kind, c.conv, n, len(got.Data))
		}
	}
}

// TestTransferRoundTrip: bf16 pages of 4 sent to pages of 16 and back give
// every token's entry back, byte for byte; fp8_e4m3 over a power-of-two
// k_scale through bf16 and back likewise (e4m3·2^k is exact in bf16).
func TestTransferRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewSource(18))
	seqLens := []int{13, 30}
	lens := i32([]int{2}, 13, 30)
	for _, c := range []struct {
		kind   Kind
		kScale float64
		via    Kind
	}{{BF16, 0, BF16}, {FP8E4M3, 0.03125, BF16}, {FP8E4M3, 0.03125, FP8E4M3}} {
		a := mustLayout(t, c.kind, 6, 2, 4)
		b := mustLayout(t, c.via, 6, 2, 16)
		kvc, kpe := randomTokens(rng, 43, 6, 2)
		tabA, amb := shuffledTable(rng, seqLens, 4, 13)
		tabB, bmb := shuffledTable(rng, seqLens, 16, 4)
		src := cacheOfTokens(t, rng, a, c.kScale, 13, tabA, amb, seqLens, kvc, kpe)
		ta, tb := tensor.FromInt64s(tensor.I32, []int{2, amb}, tabA), tensor.FromInt64s(tensor.I32, []int{2, bmb}, tabB)
		dt := tensor.U8
		if c.via == BF16 {
			dt = tensor.BF16
		}
		mid := tensor.New(dt, 4, 16, 8)
		there := transferOf(t, src, a, c.kScale, ta, mid, b, c.kScale, tb, lens, false).After(false)
		back := src.Clone()
		for i := range back.Data {
			back.Data[i] = 0
		}
		got := transferOf(t, there, b, c.kScale, tb, back, a, c.kScale, ta, lens, false).After(false)
		eb := a.EntrySize() * src.DType.Size()
		for bq, n := range seqLens {
			for tk := 0; tk < n; tk++ {
				s := int(tabA[bq*amb+tk/4])*4 + tk%4
				if string(got.Data[s*eb:(s+1)*eb]) != string(src.Data[s*eb:(s+1)*eb]) {
					t.Errorf("%s via %s: request %d token %d did not come back", c.kind, c.via, bq, tk)
				}
			}
		}
	}
}

// TestTransferGathersAlike: against kv_cache_gather's reference, the decode
// side's cache after a same-layout transfer gathers, for the same requests,
// exactly what the prefill side's does, at every dequantization precision.
func TestTransferGathersAlike(t *testing.T) {
	rng := rand.New(rand.NewSource(19))
	seqLens := []int{33, 2, 17}
	lens := i32([]int{3}, 33, 2, 17)
	for _, c := range []struct {
		kind       Kind
		l, r       int
		kScale     float64
		srcP, dstP int
	}{{BF16, 6, 2, 0, 16, 64}, {FP8E4M3, 6, 2, 0.02, 1, 16}, {FP8DSMLA, 512, 64, 0, 64, 16}} {
		a := mustLayout(t, c.kind, c.l, c.r, c.srcP)
		b := mustLayout(t, c.kind, c.l, c.r, c.dstP)
		kvc, kpe := randomTokens(rng, 52, c.l, c.r)
		nbA, nbB := 52/c.srcP+4, 52/c.dstP+4
		tabA, amb := shuffledTable(rng, seqLens, c.srcP, nbA)
		tabB, bmb := shuffledTable(rng, seqLens, c.dstP, nbB)
		src := cacheOfTokens(t, rng, a, c.kScale, nbA, tabA, amb, seqLens, kvc, kpe)
		ta, tb := tensor.FromInt64s(tensor.I32, []int{3, amb}, tabA), tensor.FromInt64s(tensor.I32, []int{3, bmb}, tabB)
		before := tensor.New(src.DType, nbB, c.dstP, a.EntrySize())
		after := transferOf(t, src, a, c.kScale, ta, before, b, c.kScale, tb, lens, false).After(false)
		ca, _ := New(src, a, c.kScale)
		cb, _ := New(after, b, c.kScale)
		pa, _ := NewPages(ta, lens, c.srcP, nbA)
		pb, _ := NewPages(tb, lens, c.dstP, nbB)
		for _, deq := range []tensor.DType{tensor.F64, tensor.F32, tensor.BF16} {
			ga, err := Gather(ca, pa, deq)
			if err != nil {
				t.Fatal(err)
			}
			gb, err := Gather(cb, pb, deq)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(ga, gb) {
				t.Errorf("%s P %d -> %d, gathered at %s: the decode side differs from the prefill side", c.kind, c.srcP, c.dstP, deq)
			}
		}
	}
}

// TestTransferWholePages: with whole_pages the tail of a request's last
// page (past seq_len) holds the source page's bytes, and nothing else moves.
func TestTransferWholePages(t *testing.T) {
	src := tensor.New(tensor.BF16, 2, 4, 2)
	for i := 0; i < src.Len(); i++ {
		src.SetFloat64(i, float64(i+1))
	}
	before := tensor.New(tensor.BF16, 3, 4, 2)
	lay := mustLayout(t, BF16, 1, 1, 4)
	// request 0: 6 tokens on source blocks 1, 0 and decode blocks 2, 0
	for _, whole := range []bool{false, true} {
		x := transferOf(t, src, lay, 0, i32([]int{1, 2}, 1, 0), before, lay, 0, i32([]int{1, 2}, 2, 0), i32([]int{1}, 6), whole)
		got := x.After(false).Float64s()
		want := make([]float64, 24)
		copy(want[16:24], []float64{9, 10, 11, 12, 13, 14, 15, 16}) // decode block 2 = source block 1
		copy(want[0:4], []float64{1, 2, 3, 4})                      // tokens 4, 5: source block 0 offsets 0, 1
		if whole {
			copy(want[4:8], []float64{5, 6, 7, 8}) // offsets 2, 3 of the page, past seq_len
		}
		if !slices.Equal(got, want) {
			t.Errorf("whole_pages=%v: got %v, want %v", whole, got, want)
		}
	}
}

// Every bad routing is an error that names the tensor and the index.
func TestTransferRoutingErrors(t *testing.T) {
	for _, c := range []struct {
		name               string
		src, dst, lens     *tensor.Tensor
		srcP, dstP, sb, db int
		whole              bool
		want               string
	}{
		{"source block outside", i32([]int{1, 2}, 0, 7), i32([]int{1, 1}, 0), i32([]int{1}, 6), 4, 8, 2, 2, false,
			"src_block_table[0,1] = 7 is outside the cache (NB = 2)"},
		{"decode block outside", i32([]int{1, 2}, 0, 1), i32([]int{1, 1}, -1), i32([]int{1}, 6), 4, 8, 2, 2, false,
			"dst_block_table[0,0] = -1 is outside the cache (NB = 2)"},
		{"seq_len past the decode table", i32([]int{1, 2}, 0, 1), i32([]int{1, 1}, 0), i32([]int{1}, 9), 8, 8, 2, 2, false,
			"seq_lens[0] = 9 exceeds the dst_block_table's capacity 1*8 = 8"},
		{"seq_len past the prefill table", i32([]int{1, 1}, 0), i32([]int{1, 2}, 0, 1), i32([]int{1}, 9), 8, 8, 2, 2, false,
			"seq_lens[0] = 9 exceeds the src_block_table's capacity 1*8 = 8"},
		{"rows disagree", i32([]int{2, 1}, 0, 1), i32([]int{1, 1}, 0), i32([]int{2}, 1, 1), 4, 4, 2, 2, false,
			"tensor seq_lens has 2 entries but dst_block_table has 1 rows"},
		{"whole pages of two sizes", i32([]int{1, 2}, 0, 1), i32([]int{1, 1}, 0), i32([]int{1}, 6), 4, 8, 2, 2, true,
			"parameter whole_pages = true needs equal page sizes on both sides: src_page_size = 4, page_size = 8"},
		{"two requests on one decode block", i32([]int{2, 1}, 0, 1), i32([]int{2, 1}, 1, 1), i32([]int{2}, 2, 3), 4, 4, 2, 2, false,
			"dst_block_table[0,0] and dst_block_table[1,0] both put a token at block 1 offset 0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := RouteTransfer(c.src, c.dst, c.lens, c.srcP, c.dstP, c.sb, c.db, c.whole)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
}

// CopyRaw, the transport that never converts, leaves the source entry's
// first bytes (a bf16 entry's low bytes in an fp8 one) and, in a longer
// entry, the rest as it was.
func TestTransferRawBytes(t *testing.T) {
	src := tensor.New(tensor.BF16, 1, 1, 2)
	binary.LittleEndian.PutUint16(src.Data, 0x3F80)
	binary.LittleEndian.PutUint16(src.Data[2:], 0xC000)
	before := tensor.New(tensor.U8, 1, 1, 2)
	sc, _ := New(src, mustLayout(t, BF16, 1, 1, 1), 0)
	dc, _ := New(before, mustLayout(t, FP8E4M3, 1, 1, 1), 1)
	x, err := NewTransfer(sc, before, dc, []Move{{Dst: 0, Src: 0}}, CopyRaw)
	if err != nil {
		t.Fatal(err)
	}
	if got := x.After(false).Data; string(got) != string([]byte{0x80, 0x3F}) {
		t.Errorf("raw bf16 bytes in an fp8 entry: % x, want 80 3f", got)
	}
	back, _ := NewTransfer(dc, src, sc, []Move{{Dst: 0, Src: 0}}, CopyRaw)
	if got := back.After(false).Data; string(got) != string([]byte{0, 0, 0x00, 0xC0}) {
		t.Errorf("raw fp8 bytes in a bf16 entry: % x, want 00 00 00 c0", got)
	}
}
