package kvcache

import (
	"encoding/hex"
	"encoding/json"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// flashMLAModel1 is testdata/flashmla_model1.json: a cache that FlashMLA's
// own tests/quant.py quantized and dequantized (testdata/README.md).
type flashMLAModel1 struct {
	Source    string `json:"source"`
	NB        int    `json:"num_blocks"`
	P         int    `json:"page_size"`
	Dim       int    `json:"dim"`
	Input     string `json:"input_bf16"`
	Cache     string `json:"cache_u8"`
	Dequant   string `json:"dequant_bf16"`
	input     []byte
	cache     []byte
	dequant   []byte
	kvc, kpe  *tensor.Tensor
	slots     []int64
	lay       Layout
	cacheT    *tensor.Tensor
	nTokens   int
	inputVals []float64
}

func loadModel1(t *testing.T) *flashMLAModel1 {
	t.Helper()
	b, err := os.ReadFile("testdata/flashmla_model1.json")
	if err != nil {
		t.Fatal(err)
	}
	var f flashMLAModel1
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	for _, h := range []struct {
		s   string
		dst *[]byte
	}{{f.Input, &f.input}, {f.Cache, &f.cache}, {f.Dequant, &f.dequant}} {
		if *h.dst, err = hex.DecodeString(h.s); err != nil {
			t.Fatal(err)
		}
	}
	f.nTokens = f.NB * f.P
	if f.Dim != M1Nope+M1Rope || len(f.input) != 2*f.nTokens*f.Dim || len(f.cache) != f.nTokens*M1EntryBytes || len(f.dequant) != len(f.input) {
		t.Fatalf("testdata/flashmla_model1.json: sizes do not fit [%d, %d] tokens of %d dims", f.NB, f.P, f.Dim)
	}
	in := &tensor.Tensor{DType: tensor.BF16, Shape: []int{f.nTokens, f.Dim}, Data: f.input}
	f.inputVals = in.Float64s()
	nope, rope := make([]float64, 0, f.nTokens*M1Nope), make([]float64, 0, f.nTokens*M1Rope)
	for tok := 0; tok < f.nTokens; tok++ {
		row := f.inputVals[tok*f.Dim : (tok+1)*f.Dim]
		nope = append(nope, row[:M1Nope]...)
		rope = append(rope, row[M1Nope:]...)
	}
	f.kvc = tensor.FromFloat64s(tensor.BF16, []int{f.nTokens, M1Nope}, nope)
	f.kpe = tensor.FromFloat64s(tensor.BF16, []int{f.nTokens, M1Rope}, rope)
	for s := 0; s < f.nTokens; s++ { // token s of the [NB, P] input is slot s
		f.slots = append(f.slots, int64(s))
	}
	f.lay = mustLayout(t, FP8DSMLAModel1, M1Nope, M1Rope, f.P)
	f.cacheT = &tensor.Tensor{DType: tensor.U8, Shape: []int{f.NB, f.P, M1EntryBytes}, Data: f.cache}
	return &f
}

// TestModel1WriterMatchesFlashMLA: kcheck's writer, given the bf16 tokens
// FlashMLA's quantize_k_cache was given, writes the bytes it wrote, every
// one (the pad bytes, which quant.py never writes, were zeroed by the
// generator and are zeroed by kcheck's writer as by vLLM's). Planting a bug
// shows the test's teeth: with the scales of the amax convention (the
// 656-byte layout's default), or with the block-split rows written token by
// token (the Cache loop's interleaved branch), it fails on thousands of
// bytes.
func TestModel1WriterMatchesFlashMLA(t *testing.T) {
	f := loadModel1(t)
	before := tensor.New(tensor.U8, f.NB, f.P, M1EntryBytes)
	w, err := Write(before, f.kvc, f.kpe, f.slots, f.lay, 0)
	if err != nil {
		t.Fatal(err)
	}
	bad := 0
	for i, want := range f.cache {
		if got := w.After.Data[i]; got != want {
			if bad++; bad <= 5 {
				slot, col := f.lay.Entry(i)
				t.Errorf("byte %d (slot %d, entry column %d): kcheck wrote %#02x, FlashMLA's quant.py %#02x", i, slot, col, got, want)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d bytes differ from %s", bad, len(f.cache), f.Source)
	}
	// Every byte kcheck's own writer wrote must be one its Equivalent accepts.
	for i := range f.cache {
		if !w.Equivalent(i, float64(f.cache[i])) && w.After.Data[i] != f.cache[i] {
			t.Fatalf("byte %d: FlashMLA's value %#02x is neither kcheck's nor equivalent to it", i, f.cache[i])
		}
	}
}

// TestModel1ReaderMatchesFlashMLA: kcheck's reader, on the bytes FlashMLA's
// quantize_k_cache wrote, gives the values its dequantize_k_cache gives,
// bit for bit, at every dequantization precision (the E4M3 × E8M0 products
// are exact in bf16 for these tiles, so the precisions agree). Reading the
// blocks as token-by-token entries (the 656 layout's addressing) fails it.
func TestModel1ReaderMatchesFlashMLA(t *testing.T) {
	f := loadModel1(t)
	c, err := New(f.cacheT, f.lay, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := (&tensor.Tensor{DType: tensor.BF16, Shape: []int{f.nTokens, f.Dim}, Data: f.dequant}).Float64s()
	row := make([]float64, f.Dim)
	nonzero := 0
	for _, deq := range []tensor.DType{tensor.F64, tensor.F32, tensor.BF16} {
		for s := 0; s < f.nTokens; s++ {
			c.RowSlot(s, row, deq)
			for j, v := range row {
				w := want[s*f.Dim+j]
				if v != w && !(math.IsNaN(v) && math.IsNaN(w)) {
					t.Fatalf("dequant %s: slot %d dim %d: kcheck reads %v, FlashMLA's dequantize_k_cache %v", deq, s, j, v, w)
				}
				if v != 0 {
					nonzero++
				}
			}
		}
	}
	if nonzero < f.nTokens*f.Dim { // the data are mostly nonzero: a reader of zeros would not pass
		t.Fatalf("only %d nonzero values read: the test data are not exercising the reader", nonzero)
	}
	// The quantization is close to its input: an independent sanity bound
	// (E4M3's half-spacing is 2^-4 relative, plus the power-of-two scale's
	// subnormal floor) on the NoPE part, exact equality on the RoPE part.
	for s := 0; s < f.nTokens; s++ {
		c.RowSlot(s, row, tensor.F64)
		for j, v := range row {
			x := f.inputVals[s*f.Dim+j]
			if j >= M1Nope && v != x {
				t.Fatalf("slot %d rope dim %d: read %v, the token's bf16 value is %v", s, j-M1Nope, v, x)
			}
		}
	}
}

// TestModel1Addressing: Offset and Entry are inverse over every byte of a
// two-block cache of odd page size, and place a block's data rows before
// its scale rows; BlockStride is FlashMLA's padded block (quant.py:57:
// (P*584 + 575) // 576 * 576).
func TestModel1Addressing(t *testing.T) {
	for _, p := range []int{1, 3, 64} {
		lay := mustLayout(t, FP8DSMLAModel1, M1Nope, M1Rope, p)
		n := 2 * p * M1EntryBytes
		seen := make([]bool, n)
		for slot := 0; slot < 2*p; slot++ {
			for col := 0; col < M1EntryBytes; col++ {
				i := lay.Offset(slot, col)
				if i < 0 || i >= n || seen[i] {
					t.Fatalf("P = %d: Offset(%d, %d) = %d is outside the cache or taken twice", p, slot, col, i)
				}
				seen[i] = true
				if s2, c2 := lay.Entry(i); s2 != slot || c2 != col {
					t.Fatalf("P = %d: Entry(Offset(%d, %d) = %d) = (%d, %d)", p, slot, col, i, s2, c2)
				}
			}
		}
		if got := lay.Offset(p, 0); got != p*M1EntryBytes {
			t.Errorf("P = %d: block 1 starts at %d, want %d", p, got, p*M1EntryBytes)
		}
		if got := lay.Offset(0, m1ScaleOff); got != p*M1DataBytes {
			t.Errorf("P = %d: slot 0's scales at %d, want after the %d data rows, %d", p, got, p, p*M1DataBytes)
		}
	}
	for _, p := range []int{1, 3, 64} { // the same for V4.1's pre-release block-split order
		lay := mustLayout(t, FP8DSMLAV41, M1Nope, M1Rope, p)
		n := 2 * p * V41EntryBytes
		seen := make([]bool, n)
		for slot := 0; slot < 2*p; slot++ {
			for col := 0; col < V41EntryBytes; col++ {
				i := lay.OldV41Offset(slot, col)
				if i < 0 || i >= n || seen[i] {
					t.Fatalf("P = %d: OldV41Offset(%d, %d) = %d is outside the cache or taken twice", p, slot, col, i)
				}
				seen[i] = true
				if s2, c2 := lay.OldV41Entry(i); s2 != slot || c2 != col {
					t.Fatalf("P = %d: OldV41Entry(OldV41Offset(%d, %d) = %d) = (%d, %d)", p, slot, col, i, s2, c2)
				}
			}
		}
		if got := lay.OldV41Offset(0, v41ScaleOff); got != p*V41Dims {
			t.Errorf("P = %d: slot 0's old-layout scales at %d, want %d", p, got, p*V41Dims)
		}
	}
	for _, c := range []struct{ p, want int }{{64, 37440}, {1, 1152}, {3, 2304}, {256, 149760}} {
		if got := BlockStride(c.p); got != c.want {
			t.Errorf("BlockStride(%d) = %d, want %d", c.p, got, c.want)
		}
	}
}

// TestModel1LayoutErrors: the layout names what it cannot store.
func TestModel1LayoutErrors(t *testing.T) {
	for _, c := range []struct {
		lay  Layout
		want string
	}{
		{Layout{Kind: FP8DSMLAModel1, L: 512, R: 64, PageSize: 64, DSScale: ScalePow2}, "L = 448 and R = 64 only"},
		{Layout{Kind: FP8DSMLAModel1, L: 448, R: 64, PageSize: 64, DSScale: ScaleAmax}, "powers of two only"},
		{Layout{Kind: FP8DSMLAModel1, L: 448, R: 64, PageSize: 0, DSScale: ScalePow2}, "page_size = 0"},
	} {
		err := c.lay.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want one containing %q", c.lay, err, c.want)
		}
	}
}

// TestTileScaleFloors: the two power-of-two writers differ only below the
// floor: pow2 clamps amax/448 at 1e-4 (2^-13 = 2^ceil(log2 1e-4)), the amax
// floor clamps amax at 1e-4 (2^ceil(log2(1e-4/448)) = 2^-22); above it both
// give 2^ceil(log2(amax/448)), 448·2^k giving exactly 2^k.
func TestTileScaleFloors(t *testing.T) {
	for _, c := range []struct {
		amax        float64
		pow2, floor float32
	}{
		{0, 0x1p-13, 0x1p-22},
		{1e-6, 0x1p-13, 0x1p-22},
		{0.01, 0x1p-13, 0x1p-15}, // 0.01/448 = 2.2e-5: 2^-15 = 3.05e-5
		{448, 1, 1},
		{448.5, 2, 2},
		{3.5, 0x1p-7, 0x1p-7},
	} {
		if got := TileScale(c.amax, ScalePow2); got != c.pow2 {
			t.Errorf("TileScale(%v, pow2) = %v, want %v", c.amax, got, c.pow2)
		}
		if got := TileScale(c.amax, ScalePow2AmaxFloor); got != c.floor {
			t.Errorf("TileScale(%v, pow2_amax_floor) = %v, want %v", c.amax, got, c.floor)
		}
	}
}

// TestModel1WriterMatchesVLLM: kcheck's pow2_amax_floor writer writes the
// bytes vLLM's DeepSeek-V4 Triton writer wrote (testdata/vllm_v4_writer.json,
// made in Triton's interpreter: testdata/README.md) from the same tokens,
// every one, pad bytes included (vLLM writes them 0). Under FlashMLA's pow2
// floor the same tokens give other bytes in the tiles whose amax is below
// 448e-4, and the write check does not excuse them: the two conventions are
// told apart, in both directions.
func TestModel1WriterMatchesVLLM(t *testing.T) {
	f := loadModel1(t)
	b, err := os.ReadFile("testdata/vllm_v4_writer.json")
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Source string `json:"source"`
		Cache  string `json:"cache_u8"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	want, err := hex.DecodeString(v.Cache)
	if err != nil || len(want) != len(f.cache) {
		t.Fatalf("testdata/vllm_v4_writer.json: %d bytes, %v; want %d", len(want), err, len(f.cache))
	}
	for _, c := range []struct {
		conv  ScaleConvention
		match bool
	}{{ScalePow2AmaxFloor, true}, {ScalePow2, false}} {
		lay := f.lay
		lay.DSScale = c.conv
		w, err := Write(tensor.New(tensor.U8, f.NB, f.P, M1EntryBytes), f.kvc, f.kpe, f.slots, lay, 0)
		if err != nil {
			t.Fatal(err)
		}
		differ, excused := 0, 0
		for i := range want {
			if w.After.Data[i] != want[i] {
				differ++
				if w.Equivalent(i, float64(want[i])) {
					excused++
				}
			}
		}
		switch {
		case c.match && differ > 0:
			t.Errorf("ds_mla_scale %s: %d of %d bytes differ from %s", c.conv, differ, len(want), v.Source)
		case !c.match && (differ == 0 || excused == differ):
			t.Errorf("ds_mla_scale %s: %d bytes differ from vLLM's writer and %d of them are excused: the floors are not told apart", c.conv, differ, excused)
		}
		t.Logf("ds_mla_scale %s: %d of %d bytes differ from vLLM's V4 writer, %d excused", c.conv, differ, len(want), excused)
	}
}

// TestV41MatchesVLLM: DeepSeek-V4.1's interleaved MXFP8 cache. kcheck's
// writer (pow2_amax_floor, the layout's default) writes the bytes vLLM's
// _quantize_and_insert_k_mxfp8_kernel wrote from flashmla_model1.json's
// tokens, and kcheck's reader at BF16 reads the rows vLLM's
// _dequantize_and_gather_k_mxfp8_kernel gathered from them
// (testdata/vllm_v41.json, Triton's interpreter: testdata/README.md). Both
// exactly. Reading the rope dims as V4's bf16 (the model1 reader), or
// scales every 64 values, fails it.
func TestV41MatchesVLLM(t *testing.T) {
	f := loadModel1(t)
	b, err := os.ReadFile("testdata/vllm_v41.json")
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Source   string `json:"source"`
		Cache    string `json:"cache_u8"`
		Gathered string `json:"gathered_bf16"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	want, err1 := hex.DecodeString(v.Cache)
	rows, err2 := hex.DecodeString(v.Gathered)
	if err1 != nil || err2 != nil || len(want) != f.nTokens*V41EntryBytes || len(rows) != 2*f.nTokens*V41Dims {
		t.Fatalf("testdata/vllm_v41.json: sizes %d and %d (%v, %v)", len(want), len(rows), err1, err2)
	}
	lay := mustLayout(t, FP8DSMLAV41, M1Nope, M1Rope, f.P)
	if lay.DSScale != ScalePow2AmaxFloor {
		t.Fatalf("fp8_ds_mla_v41's default writer is %s, want vLLM's pow2_amax_floor", lay.DSScale)
	}
	w, err := Write(tensor.New(tensor.U8, f.NB, f.P, V41EntryBytes), f.kvc, f.kpe, f.slots, lay, 0)
	if err != nil {
		t.Fatal(err)
	}
	bad := 0
	for i := range want {
		if w.After.Data[i] != want[i] {
			if bad++; bad <= 5 {
				slot, col := lay.Entry(i)
				t.Errorf("byte %d (slot %d, column %d): kcheck wrote %#02x, vLLM %#02x", i, slot, col, w.After.Data[i], want[i])
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d bytes differ from %s", bad, len(want), v.Source)
	}
	c, err := New(&tensor.Tensor{DType: tensor.U8, Shape: []int{f.NB, f.P, V41EntryBytes}, Data: want}, lay, 0)
	if err != nil {
		t.Fatal(err)
	}
	gathered := (&tensor.Tensor{DType: tensor.BF16, Shape: []int{f.nTokens, V41Dims}, Data: rows}).Float64s()
	row := make([]float64, V41Dims)
	nonzeroRope := 0
	for s := 0; s < f.nTokens; s++ {
		c.RowSlot(s, row, tensor.BF16)
		for j, x := range row {
			if g := gathered[s*V41Dims+j]; x != g {
				t.Fatalf("slot %d dim %d: kcheck reads %v, vLLM's gather %v", s, j, x, g)
			}
			if j >= M1Nope && x != 0 {
				nonzeroRope++
			}
		}
	}
	if nonzeroRope == 0 {
		t.Fatal("no rope value read: the test data do not exercise the quantized rope")
	}
}
