package kvcache

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

func bf16(shape []int, vals ...float64) *tensor.Tensor {
	return tensor.FromFloat64s(tensor.BF16, shape, vals)
}

func mustLayout(t *testing.T, k Kind, l, r, p int) Layout {
	t.Helper()
	lay, err := NewLayout(k, l, r, p)
	if err != nil {
		t.Fatal(err)
	}
	return lay
}

// TestWriteBF16ByHand: 2 blocks of P = 4 tokens, L = 2, R = 1 (D = 3). The
// cache starts filled with bf16 -7 (0xC0E0: sign 1, exponent 129, mantissa
// .75 -> 0xC0E0) so that an unwritten entry is visible.
func TestWriteBF16ByHand(t *testing.T) {
	lay := mustLayout(t, BF16, 2, 1, 4)
	before := tensor.New(tensor.BF16, 2, 4, 3)
	for i := 0; i < before.Len(); i++ {
		binary.LittleEndian.PutUint16(before.Data[2*i:], 0xC0E0)
	}
	keep := before.Clone()
	// token 0 -> slot 5 (block 1, offset 1); token 1 skipped; token 2 -> slot 2 (block 0, offset 2)
	kvc := bf16([]int{3, 2}, 1, -2, 3, 0.25, 0.5, -0.375)
	kpe := bf16([]int{3, 1}, 0.5, -1, 65504)
	w, err := Write(before, kvc, kpe, []int64{5, -1, 2}, lay, 0)
	if err != nil {
		t.Fatal(err)
	}
	const u = 0xC0E0 // untouched
	want := []uint16{
		// block 0
		u, u, u, // offset 0
		u, u, u, // offset 1
		// offset 2 = token 2: 0.5 = 2^-1 -> 0x3F00; -0.375 = -1.5*2^-2 -> 0xBEC0;
		// 65504 = 1.1111111111 (binary) * 2^15: bf16 keeps 7 fraction bits and the
		// dropped 111 is above half an ulp, so it rounds up to 2^16 = 0x4780
		0x3F00, 0xBEC0, 0x4780,
		u, u, u, // offset 3
		// block 1
		u, u, u,
		0x3F80, 0xC000, 0x3F00, // offset 1 = token 0: 1.0 -> 0x3F80; -2 -> 0xC000; 0.5 -> 0x3F00
		u, u, u,
		u, u, u,
	}
	for i, wv := range want {
		if got := binary.LittleEndian.Uint16(w.After.Data[2*i:]); got != wv {
			t.Errorf("element %d: got %#04x, want %#04x", i, got, wv)
		}
	}
	if string(w.Exact.Data) != string(w.After.Data) {
		t.Error("bf16 write: Exact and After differ (a copy has no arithmetic)")
	}
	if string(before.Data) != string(keep.Data) {
		t.Error("Write modified cache_before")
	}
	wantTok := []int{-1, -1, 2, -1, -1, 0, -1, -1}
	for s, want := range wantTok {
		if tok := w.TokenAt(s); tok != want {
			t.Errorf("TokenAt(%d) = %d, want %d", s, tok, want)
		}
	}
	if w.Written() != 2 {
		t.Errorf("Written() = %d, want 2 (token 1 is skipped)", w.Written())
	}
}

// TestWriteFP8ByHand: per-tensor fp8_e4m3, L = 3, R = 2, k_scale = 0.5, so
// each code is e4m3(2x). E4M3FN: 1 sign, 4 exponent (bias 7), 3 mantissa.
func TestWriteFP8ByHand(t *testing.T) {
	cases := []struct {
		x        float64
		sat, nos uint8
		why      string
	}{
		{1, 0x40, 0x40, "2 = 1.0*2^1: exp 8 -> 0 1000 000"},
		{-3, 0xCC, 0xCC, "-6 = -1.5*2^2: exp 9, mant 100 -> 1 1001 100"},
		{1.0625, 0x40, 0x40, "2.125 is the midpoint of 2 (mant 000) and 2.25 (001): even -> 2"},
		{1.1875, 0x42, 0x42, "2.375 is the midpoint of 2.25 (001) and 2.5 (010): even -> 2.5 = 0 1000 010"},
		{0.0078125, 0x08, 0x08, "2^-6, the smallest normal: exp 1, mant 0"},
		{300, 0x7E, 0x7F, "600 > 448: saturates to 448 = 0 1111 110, or NaN (0x7F) when not saturating"},
		{232, 0x7E, 0x7E, "464 is the midpoint of 448 and 480: ties to 448 either way"},
		{-0.0009765625, 0x81, 0x81, "-2^-9, the smallest subnormal: 1 0000 001"},
		{0x1p-11, 0x00, 0x00, "2^-10 is half the smallest subnormal 2^-9: tie to even -> +0"},
	}
	for _, sat := range []bool{true, false} {
		lay := mustLayout(t, FP8E4M3, 3, 2, 2)
		lay.Saturate = sat
		// one block, two slots; 9 values split over two tokens of 5 (pad with 0)
		vals := make([]float64, 10)
		for i, c := range cases {
			vals[i] = c.x
		}
		kvc := bf16([]int{2, 3}, vals[0], vals[1], vals[2], vals[5], vals[6], vals[7])
		kpe := bf16([]int{2, 2}, vals[3], vals[4], vals[8], vals[9])
		before := tensor.New(tensor.U8, 1, 2, 5)
		w, err := Write(before, kvc, kpe, []int64{0, 1}, lay, 0.5)
		if err != nil {
			t.Fatal(err)
		}
		for i, c := range cases {
			want := c.sat
			if !sat {
				want = c.nos
			}
			if got := w.After.Data[i]; got != want {
				t.Errorf("saturate=%v x=%v: got %#02x, want %#02x (%s)", sat, c.x, got, want, c.why)
			}
			if got := w.Exact.Data[i]; got != want {
				t.Errorf("saturate=%v x=%v: exact got %#02x, want %#02x", sat, c.x, got, want)
			}
		}
	}
}

// TestDSMLAEntryByHand builds one token's 656 bytes from values whose codes
// and scales are worked out in the comments, for both scale conventions.
func TestDSMLAEntryByHand(t *testing.T) {
	kv := make([]float64, 512)
	kv[0], kv[1], kv[2] = 448, -224, 1 // tile 0: amax 448
	kv[128], kv[129] = 100, -50        // tile 1: amax 100
	kv[256] = 896                      // tile 2: amax 896
	// tile 3: all zero
	pe := make([]float64, 64)
	pe[0], pe[1] = 1, -2

	want := map[ScaleConvention]map[int]byte{}
	put := func(m map[int]byte, off int, b ...byte) {
		for i, v := range b {
			m[off+i] = v
		}
	}
	// amax convention: s = fp32(amax/448), at least FLT_MIN.
	am := map[int]byte{}
	// tile 0: s = 1.0 (0x3F800000, little-endian 00 00 80 3F);
	// 448 -> 0 1111 110 = 0x7E; -224 = -1.75*2^7 -> 1 1110 110 = 0xF6; 1 -> 0 0111 000 = 0x38
	put(am, 0, 0x7E, 0xF6, 0x38)
	put(am, 512, 0x00, 0x00, 0x80, 0x3F)
	// tile 1: s = fp32(100/448) = 0.22321428358554840 = 0x3E649249 (Python
	// struct.pack('<f', 100/448)); 100/s = 448.0000043 -> 448 = 0x7E;
	// -50/s = -224.0000021 -> 0xF6
	put(am, 128, 0x7E, 0xF6)
	put(am, 516, 0x49, 0x92, 0x64, 0x3E)
	// tile 2: s = 2.0 (0x40000000); 896/2 = 448 -> 0x7E
	put(am, 256, 0x7E)
	put(am, 520, 0x00, 0x00, 0x00, 0x40)
	// tile 3: amax 0 -> FLT_MIN = 2^-126 = 0x00800000; codes 0
	put(am, 524, 0x00, 0x00, 0x80, 0x00)
	want[ScaleAmax] = am

	// pow2 convention: s = 2^ceil(log2(max(amax/448, 1e-4))).
	p2 := map[int]byte{}
	put(p2, 0, 0x7E, 0xF6, 0x38) // tile 0: 448/448 = 1 = 2^0 -> s = 1, codes as above
	put(p2, 512, 0x00, 0x00, 0x80, 0x3F)
	// tile 1: 100/448 = 0.223 = 2^-2.16 -> s = 2^-2 = 0.25 (0x3E800000);
	// 100/0.25 = 400 = 12.5 * 32 (the 256..512 binade steps by 32): tie
	// between 384 (mant 100) and 416 (101) -> even 384 = 0 1111 100 = 0x7C;
	// -50/0.25 = -200 = -12.5 * 16: tie -> -192 = 1 1110 100 = 0xF4
	put(p2, 128, 0x7C, 0xF4)
	put(p2, 516, 0x00, 0x00, 0x80, 0x3E)
	// tile 2: 896/448 = 2 -> s = 2 (0x40000000); 448 -> 0x7E
	put(p2, 256, 0x7E)
	put(p2, 520, 0x00, 0x00, 0x00, 0x40)
	// tile 3: max(0, 1e-4) = 2^-13.29 -> s = 2^-13: exponent 127-13 = 114 =
	// 0b01110010 -> bits 0 01110010 0... = 0x39000000
	put(p2, 524, 0x00, 0x00, 0x00, 0x39)
	want[ScalePow2] = p2

	for conv, m := range want {
		// rope: bf16 1.0 = 0x3F80 (80 3F), -2 = 0xC000 (00 C0)
		put(m, 528, 0x80, 0x3F, 0x00, 0xC0)
		lay := mustLayout(t, FP8DSMLA, 512, 64, 2)
		lay.DSScale = conv
		before := tensor.New(tensor.U8, 1, 2, 656)
		for i := range before.Data {
			before.Data[i] = 0xAB
		}
		w, err := Write(before, bf16([]int{1, 512}, kv...), bf16([]int{1, 64}, pe...), []int64{1}, lay, 0)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 656; i++ {
			if got := w.After.Data[i]; got != 0xAB {
				t.Fatalf("%s: slot 0 byte %d = %#02x, was 0xAB and no token is there", conv, i, got)
			}
			wb := m[i] // zero where not listed
			if got := w.After.Data[656+i]; got != wb {
				t.Errorf("%s: byte %d = %#02x, want %#02x", conv, i, got, wb)
			}
			if got := w.Exact.Data[656+i]; got != wb {
				t.Errorf("%s: exact byte %d = %#02x, want %#02x", conv, i, got, wb)
			}
		}
	}
}

func TestWriteInputErrors(t *testing.T) {
	lay := mustLayout(t, BF16, 2, 1, 4)
	kvc := bf16([]int{2, 2}, 1, 2, 3, 4)
	kpe := bf16([]int{2, 1}, 1, 2)
	cache := tensor.New(tensor.BF16, 2, 4, 3)
	fp8 := mustLayout(t, FP8E4M3, 2, 1, 4)
	ds := mustLayout(t, FP8DSMLA, 512, 64, 4)
	cases := []struct {
		name   string
		before *tensor.Tensor
		kvc    *tensor.Tensor
		slots  []int64
		lay    Layout
		kScale float64
		want   string
	}{
		{"slot past the cache", cache, kvc, []int64{3, 8}, lay, 0, "slot_mapping[1] = 8 is outside the cache (NB*P = 2*4 = 8)"},
		{"two tokens one slot", cache, kvc, []int64{6, 6}, lay, 0, "slot_mapping[1] = 6 repeats slot_mapping[0]"},
		{"more slots than tokens", cache, kvc, []int64{0, 1, 2}, lay, 0, "tensor slot_mapping has 3 tokens but kv_c has only 2 rows"},
		{"wrong cache dtype", cache, kvc, []int64{0}, fp8, 1, "tensor cache_before has dtype BF16; kv_cache_dtype fp8_e4m3 stores [U8 F8_E4M3]"},
		{"wrong page size", tensor.New(tensor.BF16, 2, 2, 3), kvc, []int64{0}, lay, 0, "tensor cache_before has shape [2 2 3]; kv_cache_dtype bf16 with page_size 4 wants [NB, 4, 3]"},
		{"wrong latent width", cache, bf16([]int{1, 3}, 1, 2, 3), []int64{0}, lay, 0, "tensor kv_c has shape [1 3]; want [T, 2] (L = 2)"},
		{"zero k_scale", tensor.New(tensor.U8, 2, 4, 3), kvc, []int64{0}, fp8, 0, "tensor k_scale = 0: want a positive finite scale"},
		{"ds_mla entry", tensor.New(tensor.U8, 2, 4, 576), kvc, []int64{0}, ds, 0, "tensor cache_before has shape [2 4 576]; kv_cache_dtype fp8_ds_mla with page_size 4 wants [NB, 4, 656]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pe := kpe
			if c.kvc.Shape[0] != 2 {
				pe = bf16([]int{c.kvc.Shape[0], 1}, make([]float64, c.kvc.Shape[0])...)
			}
			_, err := Write(c.before, c.kvc, pe, c.slots, c.lay, c.kScale)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("got error %v, want one containing %q", err, c.want)
			}
		})
	}
	if _, err := NewLayout(FP8DSMLA, 8, 2, 4); err == nil || !strings.Contains(err.Error(), "L = 8, R = 2") {
		t.Errorf("fp8_ds_mla with L = 8: got %v", err)
	}
}

// TestNegativeSlotsLeaveBytes: only the entries of non-negative slots change,
// whatever the cache held (random bytes, NaN poison).
func TestNegativeSlotsLeaveBytes(t *testing.T) {
	for _, kind := range []Kind{BF16, FP16, FP8E4M3, FP8DSMLA} {
		l, r := 4, 2
		if kind == FP8DSMLA {
			l, r = 512, 64
		}
		lay := mustLayout(t, kind, l, r, 4)
		e := lay.EntrySize()
		dt := lay.CacheDTypes()[0]
		before := tensor.New(dt, 3, 4, e)
		rng := uint32(12345)
		for i := range before.Data {
			rng = rng*1664525 + 1013904223
			before.Data[i] = byte(rng >> 24)
		}
		n := 5
		kv := make([]float64, n*l)
		pe := make([]float64, n*r)
		for i := range kv {
			kv[i] = float64(i%13) - 6
		}
		for i := range pe {
			pe[i] = float64(i%7) * 0.5
		}
		slots := []int64{-1, 7, -1, 0, 11}
		w, err := Write(before, bf16([]int{n, l}, kv...), bf16([]int{n, r}, pe...), slots, lay, 0.25)
		if err != nil {
			t.Fatal(err)
		}
		eb := e * dt.Size()
		for s := 0; s < 12; s++ {
			written := s == 7 || s == 0 || s == 11
			same := string(w.After.Data[s*eb:(s+1)*eb]) == string(before.Data[s*eb:(s+1)*eb])
			if !written && !same {
				t.Errorf("%s: slot %d changed but no token has it", kind, s)
			}
			if written && same {
				t.Errorf("%s: slot %d unchanged but token written there", kind, s)
			}
		}
	}
}

// TestEquivalent: what a correct writer may also leave, and what it may not.
func TestEquivalent(t *testing.T) {
	// fp8_e4m3: x = 1.0625 with k_scale 0.5 is the tie 2.125 between 0x40
	// and 0x41; x = 1 (q = 2) is not near any midpoint.
	lay := mustLayout(t, FP8E4M3, 2, 1, 2)
	before := tensor.New(tensor.U8, 1, 2, 3)
	before.Data[5] = 0x33
	w, err := Write(before, bf16([]int{1, 2}, 1.0625, 1), bf16([]int{1, 1}, 0), []int64{0}, lay, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	check := func(name string, i int, actual float64, want bool) {
		t.Helper()
		if got := w.Equivalent(i, actual); got != want {
			t.Errorf("%s: Equivalent(%d, %v) = %v, want %v", name, i, actual, got, want)
		}
	}
	check("tie rounded up", 0, 0x41, true)
	check("tie off by two codes", 0, 0x42, false)
	check("no tie, next code", 1, 0x41, false)
	check("-0 for +0", 2, 0x80, true)
	check("stray write in an unwritten slot", 5, 0x34, false)

	// fp8_ds_mla amax: a scale one fp32 ulp off is fine, a pow2 scale is not.
	ds := mustLayout(t, FP8DSMLA, 512, 64, 1)
	kv := make([]float64, 512)
	kv[0] = 100 // tile 0 amax 100: s = 0x3E649249
	dsBefore := tensor.New(tensor.U8, 1, 1, 656)
	w, err = Write(dsBefore, bf16([]int{1, 512}, kv...), bf16([]int{1, 64}, make([]float64, 64)...), []int64{0}, ds, 0)
	if err != nil {
		t.Fatal(err)
	}
	check("scale low byte +1 ulp", 512, 0x4A, true)
	check("scale low byte of pow2 0.25 (0x3E800000)", 512, 0x00, false)
	check("scale high byte of pow2 0.25", 514, 0x80, false)
	check("rope byte changed", 528, 1, false)

	// pow2: amax 448*2^-3 = 56: the quotient is exactly 2^-3, so fp32 log2
	// may land on either side: 2^-3 and 2^-2 are both correct.
	ds.DSScale = ScalePow2
	kv[0] = 56
	w, err = Write(dsBefore, bf16([]int{1, 512}, kv...), bf16([]int{1, 64}, make([]float64, 64)...), []int64{0}, ds, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := math.Float32frombits(binary.LittleEndian.Uint32(w.After.Data[512:])); got != 0.125 {
		t.Fatalf("pow2 scale for amax 56 = %v, want 0.125", got)
	}
	// 0.25 = 0x3E800000: byte 2 is 0x80 (0.125 = 0x3E000000 has 0x00)
	check("pow2 neighbour at an exact power of two", 514, 0x80, true)
	// with s = 0.25, 56/0.25 = 224 -> 0x76 instead of 448 -> 0x7E
	check("code under the neighbour scale", 0, 0x76, true)
	check("code under no correct scale", 0, 0x6E, false)
}

func TestTileScaleConventions(t *testing.T) {
	for _, c := range []struct {
		amax         float64
		wantA, wantP float32
		why          string
	}{
		{448, 1, 1, "448/448 = 1 = 2^0"},
		{100, math.Float32frombits(0x3E649249), 0.25, "fp32(100/448); 2^ceil(-2.16) = 2^-2"},
		{449, math.Float32frombits(0x3F804925), 2, "fp32(449/448) = 1.00223214... = 0x3F804925 (Python struct); just over 2^0 -> 2^1"},
		{0, 0x1p-126, 0x1p-13, "FLT_MIN; 2^ceil(log2 1e-4) = 2^ceil(-13.29) = 2^-13"},
		{0.01, math.Float32frombits(0x37BB3EE7), 0x1p-13, "fp32(0.01/448) = 0x37BB3EE7 (Python struct), below the 1e-4 clamp in pow2 only"},
	} {
		if got := TileScale(c.amax, ScaleAmax); got != c.wantA {
			t.Errorf("amax convention, amax %v: %v (%#08x), want %v (%s)", c.amax, got, math.Float32bits(got), c.wantA, c.why)
		}
		if got := TileScale(c.amax, ScalePow2); got != c.wantP {
			t.Errorf("pow2 convention, amax %v: %v, want %v (%s)", c.amax, got, c.wantP, c.why)
		}
	}
}

// TestOverlayValues: element by element, an Overlay reads as the cache it
// materializes (expected and exact), for every layout, with cache_before
// random bytes (NaN poison included) and fp8 values that are not exact in
// E4M3, so that the expected and exact caches differ somewhere.
func TestOverlayValues(t *testing.T) {
	for _, kind := range []Kind{BF16, FP16, FP8E4M3, FP8DSMLA} {
		l, r := 6, 2
		if kind == FP8DSMLA {
			l, r = 512, 64
		}
		lay := mustLayout(t, kind, l, r, 4)
		dt := lay.CacheDTypes()[len(lay.CacheDTypes())-1] // F8_E4M3 where allowed: values, not bytes
		before := tensor.New(dt, 3, 4, lay.EntrySize())
		rng := uint32(99)
		for i := range before.Data {
			rng = rng*1664525 + 1013904223
			before.Data[i] = byte(rng >> 24)
		}
		keep := before.Clone()
		n := 6
		kv, pe := make([]float64, n*l), make([]float64, n*r)
		for i := range kv {
			kv[i] = (float64(i%29) - 14) * 0.0371
		}
		// With k_scale 0.03, 0.046875/0.03 rounds to E4M3 code 60 in fp32
		// and 61 exactly (found by search over the bf16 values).
		kv[0] = 0.046875
		for i := range pe {
			pe[i] = float64(i%5) * 0.75
		}
		slots := []int64{9, -1, 0, 4, 11, 3}
		o, err := NewOverlay(before, bf16([]int{n, l}, kv...), bf16([]int{n, r}, pe...), slots, lay, 0.03)
		if err != nil {
			t.Fatal(err)
		}
		differ := 0
		for _, exact := range []bool{false, true} {
			c := o.Cache(exact)
			for i := 0; i < c.Len(); i++ {
				want, got := c.Float64At(i), o.Value(i, exact)
				if want != got && !(math.IsNaN(want) && math.IsNaN(got)) {
					t.Fatalf("%s exact=%v: Value(%d) = %v, the materialized cache holds %v", kind, exact, i, got, want)
				}
				if exact && o.Value(i, false) != got {
					differ++
				}
			}
		}
		if kind != BF16 && differ == 0 {
			t.Errorf("%s: the expected and exact caches never differ: the test does not reach the fp8 division", kind)
		}
		for s := 0; s < 12; s++ {
			want := -1
			for tok, ss := range slots {
				if int(ss) == s {
					want = tok
				}
			}
			if got := o.TokenAt(s); got != want {
				t.Errorf("%s: TokenAt(%d) = %d, want %d", kind, s, got, want)
			}
		}
		if string(before.Data) != string(keep.Data) {
			t.Errorf("%s: the overlay modified cache_before", kind)
		}
	}
}

// TestWriteFP16ByHand: one token a case (L = 1, R = 1) written into an fp16
// cache from each input dtype the contract takes. Every bf16 value in
// fp16's normal range is exact in fp16 (8 significant bits of 11), so the
// ties sit in the subnormal range or come from F32 inputs. The codes were
// worked by hand and agree with Python's struct.pack('<e', x) (which
// refuses 65520 and 65536: "float too large to pack"). exact is the exact
// reference's value: the token's, before the cache's rounding.
func TestWriteFP16ByHand(t *testing.T) {
	nan := math.NaN()
	cases := []struct {
		in   tensor.DType
		x    float64
		want uint16
		why  string
	}{
		{tensor.BF16, 1, 0x3C00, "1 = 2^0: exponent 15 -> 0 01111 0000000000"},
		{tensor.BF16, -2, 0xC000, "-2 = -2^1: exponent 16 -> 1 10000 0000000000"},
		{tensor.BF16, 65280, 0x7BF8, "bf16 0x477F = 1.9921875*2^15: exponent 30, mantissa 1016 = 0x3F8"},
		{tensor.BF16, 65536, 0x7C00, "bf16 0x4780 = 2^16 is past fp16's 65504: rounds to +inf (an overflow)"},
		{tensor.BF16, 0x1p-25, 0x0000, "half the smallest subnormal 2^-24: a tie, to even -> +0"},
		{tensor.BF16, 0x3p-26, 0x0001, "0.75 of 2^-24: up to the smallest subnormal"},
		{tensor.BF16, 0x3p-25, 0x0002, "1.5 of 2^-24: a tie between codes 1 and 2, to even -> 2"},
		{tensor.BF16, math.Copysign(0, -1), 0x8000, "-0 keeps its sign"},
		{tensor.F32, 1 + 0x1p-11, 0x3C00, "half an fp16 ulp above 1: a tie, to even (mantissa 0)"},
		{tensor.F32, 1 + 0x3p-11, 0x3C02, "1.5 ulps above 1: a tie between mantissas 1 and 2, to even -> 2"},
		{tensor.F32, 65519, 0x7BFF, "below the midpoint 65520 of 65504 and 2^16: down to 65504"},
		{tensor.F32, 65520, 0x7C00, "the midpoint of 65504 (odd mantissa 0x3FF) and 2^16: to even, which is +inf"},
		{tensor.F16, 0x1p-24, 0x0001, "an F16 token is copied: the smallest subnormal stays"},
		{tensor.F16, 65504, 0x7BFF, "fp16's largest finite value, copied"},
	}
	lay := mustLayout(t, FP16, 1, 1, 1)
	for _, c := range cases {
		kvc := tensor.FromFloat64s(c.in, []int{1, 1}, []float64{c.x})
		kpe := tensor.FromFloat64s(c.in, []int{1, 1}, []float64{0})
		before := tensor.FromFloat64s(tensor.F16, []int{1, 1, 2}, []float64{nan, nan})
		w, err := Write(before, kvc, kpe, []int64{0}, lay, 0)
		if err != nil {
			t.Fatalf("%s %v: %v", c.in, c.x, err)
		}
		if got := binary.LittleEndian.Uint16(w.After.Data); got != c.want {
			t.Errorf("%s %v: got %#04x, want %#04x (%s)", c.in, c.x, got, c.want, c.why)
		}
		if got, ok := w.ExactValue(0, 0); !ok || got != c.x || math.Signbit(got) != math.Signbit(c.x) {
			t.Errorf("%s %v: exact value %v (ok %v), want the token's %v", c.in, c.x, got, ok, c.x)
		}
		if !math.IsNaN(before.Float64At(0)) {
			t.Errorf("%s %v: Write modified cache_before", c.in, c.x)
		}
	}
	// A NaN token is stored as a NaN (its payload is no part of the contract).
	kvc := tensor.FromFloat64s(tensor.BF16, []int{1, 1}, []float64{nan})
	w, err := Write(tensor.New(tensor.F16, 1, 1, 2), kvc, tensor.New(tensor.BF16, 1, 1), []int64{0}, lay, 0)
	if err != nil || !math.IsNaN(w.After.Float64At(0)) {
		t.Errorf("a bf16 NaN written into an fp16 cache: got %v (error %v), want NaN", w.After.Float64At(0), err)
	}
	// An fp16 cache holds F16 only.
	if _, err := Write(tensor.New(tensor.BF16, 1, 1, 2), kvc, kvc, []int64{0}, lay, 0); err == nil || !strings.Contains(err.Error(), "tensor cache_before has dtype BF16; kv_cache_dtype fp16 stores [F16]") {
		t.Errorf("a BF16 cache_before with kv_cache_dtype fp16: got %v", err)
	}
}

// TestOverlayTileScalesAreTheTilesMaxima: the tile scale each written
// entry of an fp8_ds_mla cache stores is TileScale of the largest
// magnitude among the tile's values, found here value by value from the
// token itself: over more entries than one share of NewOverlay's
// parallel pass, with the largest value at every position of a tile
// (its first and last among them), of either sign, and a NaN in some
// tiles, which the maximum skips (fmaxf).
func TestOverlayTileScalesAreTheTilesMaxima(t *testing.T) {
	for _, c := range []struct {
		kind Kind
		l    int
	}{{FP8DSMLA, 512}, {FP8DSMLAModel1, 448}} {
		lay := mustLayout(t, c.kind, c.l, 64, 64)
		tiles, size := lay.scaleTiles()
		n := 700
		kv, pe := make([]float64, n*c.l), make([]float64, n*64)
		rng := rand.New(rand.NewPCG(3, uint64(c.l)))
		for i := range kv {
			kv[i] = rng.NormFloat64()
		}
		for tok := 0; tok < n; tok++ {
			for tile := 0; tile < tiles; tile++ {
				at := tok*c.l + tile*size + (tok*7+tile)%size
				kv[at] = math.Copysign(3+float64(tok%13), float64(tok%2)-0.5)
				if (tok+tile)%11 == 0 {
					kv[tok*c.l+tile*size+(tok+3)%size] = math.NaN()
				}
			}
		}
		slots := make([]int64, n)
		for i, s := range rng.Perm(n) {
			slots[i] = int64(s)
		}
		kvc := bf16([]int{n, c.l}, kv...)
		before := tensor.New(tensor.U8, (n+63)/64, 64, lay.EntrySize())
		o, err := NewOverlay(before, kvc, bf16([]int{n, 64}, pe...), slots, lay, 0)
		if err != nil {
			t.Fatal(err)
		}
		entry := make([]byte, o.EntryBytes())
		for k := 0; k < o.Written(); k++ {
			tok := int(o.written[k].token)
			o.EntryInto(k, false, entry)
			for tile := 0; tile < tiles; tile++ {
				amax := 0.0
				for j := tile * size; j < (tile+1)*size; j++ {
					if a := math.Abs(kvc.Float64At(tok*c.l + j)); a > amax {
						amax = a
					}
				}
				s := TileScale(amax, lay.DSScale)
				if c.kind == FP8DSMLA {
					if got := math.Float32frombits(binary.LittleEndian.Uint32(entry[DSScaleOff+4*tile:])); got != s {
						t.Fatalf("%s token %d tile %d: scale %v, want TileScale(%v) = %v", c.kind, tok, tile, got, amax, s)
					}
				} else if got, want := entry[m1ScaleOff+tile], formats.E8M0.Encode(float64(s)); got != want {
					t.Fatalf("%s token %d tile %d: scale code %#x, want %#x (TileScale(%v) = %v)", c.kind, tok, tile, got, want, amax, s)
				}
			}
		}
	}
}
