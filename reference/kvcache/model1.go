package kvcache

import "github.com/kcheck-dev/kcheck/reference/tensor"

// DeepSeek-V4's sparse cache, FlashMLA's MODEL1 layout
// (deepseek-ai/FlashMLA@9241ae3, the source every number below is read
// from):
//
//   - csrc/api/sparse_decode.h:293-295: bytes_per_token = 448 + 64*2 +
//     (448/64)*1 + 1 = 584 for d_qk = 512 (the V3.2 entry is 656 for 576),
//     and :318-325 the layout is chosen by d_qk alone.
//   - tests/quant.py:14 get_meta: (d, d_nope, d_rope, tile_size, num_tiles)
//     = (512, 448, 64, 64, 7).
//   - tests/quant.py:55-62, quantize_k_cache: a block is allocated as
//     ceil(P*584 / 576)*576 bytes, and holds [P x (448 E4M3 | 64 BF16)]
//     from byte 0 and [P x 8] from byte P*(448+128), the eighth byte of each
//     8 never written (`[:, :, :7]`); the tensor handed to the kernel is
//     that block viewed as [NB, P, 1, 584] with the padded block stride.
//   - tests/quant.py:17-18, 65-72: scale = 2^ceil(log2(max(amax/448, 1e-4))),
//     stored as float8_e8m0fnu; codes = fp8_e4m3fn(x / scale).
//   - tests/quant.py:106-117, dequantize_k_cache: e4m3.to(bf16) *
//     e8m0.to(bf16), a product a bf16 holds exactly unless it leaves bf16's
//     range, so every dequantization precision reads the same values.
//   - the SM90 kernel reads it the same way: csrc/sm90/decode/sparse_fp8/
//     config.h:29 NUM_SCALES = 8 for MODEL1 ("7 ... + 1 padding"),
//     splitkv_mla.cuh:555 the scales at block*k_block_stride +
//     P*(448 + 64*2) + offset*8, :560 E8M0 to bf16, then the bf16 product
//     (components/dequant.h:21-26). The scales being powers of two already,
//     the reader's scale rounding of audit F15 (an F32 scale rounded to
//     bf16 or to E8M0) does not arise for this layout.
//
// This layout is audit F13 ("a MODEL1 capture fails with a shape error").
//
// vLLM documents the same record (vllm 0.33.0
// vllm/v1/attention/backends/mla/flashmla_sparse.py:89-109: "448 bytes
// ... 128 bytes ... 8 bytes", "a page holds all its data rows first and
// all its scale rows after ... rounded up to the decode kernel's 576 B TMA
// stride") and writes it the same way but for the amax floor
// (ScalePow2AmaxFloor; cache_utils.py:64-70 the block layout, :154-155 the
// pad byte stored as 0).
//
// A cache tensor of this layout is U8 (or F8_E4M3) [NB, P, 584] whose
// block b holds the block-split bytes of FlashMLA's block b: what
// torch's .contiguous() makes of the [NB, P, 1, 584] view, which is what a
// capture records. The padding of the block stride is never read, so it is
// not part of the tensor.
const (
	M1Nope       = 448                        // L: the quantized NoPE dims
	M1Rope       = 64                         // R: the BF16 RoPE dims
	M1Tile       = 64                         // NoPE values per E8M0 scale
	M1Tiles      = M1Nope / M1Tile            // 7
	M1DataBytes  = M1Nope + 2*M1Rope          // 576: a token's data row
	M1ScaleBytes = M1Tiles + 1                // 8: seven scales and a pad byte
	M1EntryBytes = M1DataBytes + M1ScaleBytes // 584
	// M1BlockAlign is the multiple FlashMLA pads a block's bytes to (its
	// TMA stride); BlockStride reports the padded size.
	M1BlockAlign = 576
)

// The columns of a model1 entry, in the order vLLM's record documents: the
// 576 data bytes, then the 8 scale bytes.
const (
	m1RopeOff  = M1Nope      // 448: k_pe as BF16
	m1ScaleOff = M1DataBytes // 576: the seven E8M0 scales
	m1PadCol   = M1EntryBytes - 1
)

// DeepSeek-V4.1's cache, MXFP8 (vllm 0.33.0
// vllm/models/deepseek_v41/common/ops/cache_utils.py:39-55: "V4.1 (528 B):
// all 512 dims as fp8 e4m3 (RoPE included), then 16 UE8M0 scales of 32
// dims each ... The V4.1 records are interleaved: each token's scales
// follow its own data"; vllm/third_party/flashmla/flash_mla_interface.py:
// 121-127, which also warns that before the 2026.09.30 FlashMLA release
// the V4.1 records were block-split like V4's, with the same 528 bytes a
// token, "so a cache written in the old layout is NOT rejected, it is
// misread"). The writer (cache_utils.py:185-240): amax = max(max|x|,
// 1e-4) per 32 values, e = ceil(log2(amax * (1/448))), codes e4m3(x *
// 2^-e) clamped to ±448, the scale byte e + 127; the reader
// (cache_utils.py:529-586): fp32(e4m3) * 2^(byte-127), rounded to bf16.
const (
	V41Dims       = M1Nope + M1Rope    // 512, all quantized
	V41Tile       = 32                 // values per E8M0 scale
	V41Tiles      = V41Dims / V41Tile  // 16
	V41EntryBytes = V41Dims + V41Tiles // 528
	v41ScaleOff   = V41Dims            // the scales follow the codes
)

// v41PartOf is PartOf for a V4.1 entry column: the rope dims are codes
// too, in scale tiles 14 and 15.
func v41PartOf(col int) (Part, int) {
	switch {
	case col < M1Nope:
		return PartLatent, col / V41Tile
	case col < v41ScaleOff:
		return PartRope, col / V41Tile
	}
	return PartScale, col - v41ScaleOff
}

// V4 reports whether the layout is one of DeepSeek-V4's (fp8_ds_mla_model1,
// fp8_ds_mla_v41): 512-dim rows that are key and value both, read only by
// the sparse decode.
func (k Kind) V4() bool { return k == FP8DSMLAModel1 || k == FP8DSMLAV41 }

// BlockSplit reports whether a block of the layout stores its tokens' data
// rows first and their scale rows after, rather than token by token.
func (k Kind) BlockSplit() bool { return k == FP8DSMLAModel1 }

// BlockStride is the bytes FlashMLA allocates a block of P tokens:
// ceil(P*584/576)*576 (tests/quant.py:57). kcheck's tensors leave the
// padding out (P*584 bytes a block); this says how much an engine's
// allocation adds, for a cache read from the engine's raw storage.
func BlockStride(pageSize int) int {
	n := pageSize * M1EntryBytes
	return (n + M1BlockAlign - 1) / M1BlockAlign * M1BlockAlign
}

// Offset returns the element index, in the cache tensor, of column col
// (0 <= col < EntrySize()) of slot's entry: slot*EntrySize() + col for the
// token-by-token layouts; for fp8_ds_mla_model1 the data column in its
// block's data rows or the scale column in its scale rows.
func (l Layout) Offset(slot, col int) int {
	e := l.EntrySize()
	if !l.Kind.BlockSplit() {
		return slot*e + col
	}
	blk, t := slot/l.PageSize, slot%l.PageSize
	base := blk * l.PageSize * e
	if col < M1DataBytes {
		return base + t*M1DataBytes + col
	}
	return base + l.PageSize*M1DataBytes + t*M1ScaleBytes + col - M1DataBytes
}

// Entry is Offset's inverse: the slot and entry column of element i of the
// cache tensor.
func (l Layout) Entry(i int) (slot, col int) {
	e := l.EntrySize()
	if !l.Kind.BlockSplit() {
		return i / e, i % e
	}
	blockBytes := l.PageSize * e
	blk, o := i/blockBytes, i%blockBytes
	if o < l.PageSize*M1DataBytes {
		return blk*l.PageSize + o/M1DataBytes, o % M1DataBytes
	}
	o -= l.PageSize * M1DataBytes
	return blk*l.PageSize + o/M1ScaleBytes, M1DataBytes + o%M1ScaleBytes
}

// m1Rows returns slot's 576-byte data row and 8-byte scale row in the
// bytes of a model1 cache.
func (l *Layout) m1Rows(data []byte, slot int) (row, scales []byte) {
	d := l.Offset(slot, 0)
	s := l.Offset(slot, m1ScaleOff)
	return data[d : d+M1DataBytes], data[s : s+M1ScaleBytes]
}

// m1PartOf is PartOf for a model1 entry column.
func m1PartOf(col int) (Part, int) {
	switch {
	case col < m1RopeOff:
		return PartLatent, col / M1Tile
	case col < m1ScaleOff:
		return PartRope, -1
	case col < m1PadCol:
		return PartScale, col - m1ScaleOff
	}
	return PartScale, -1 // the pad byte: no reader reads it
}

// ReadInterleaved returns the bytes of a fp8_ds_mla_model1 cache t [NB, P,
// 584] rearranged so that a correct reader finds, at slot s, what a reader
// that addresses the cache token by token (slot s at bytes [584s, 584s+584),
// as the 656-byte layout is addressed) finds there: the effect of that bug,
// for a fault to plant and a check to recognise. t is not modified.
func ReadInterleaved(t *tensor.Tensor) *tensor.Tensor {
	lay := Layout{Kind: FP8DSMLAModel1, PageSize: t.Shape[1]}
	r := t.Clone()
	for slot := 0; slot < t.Shape[0]*t.Shape[1]; slot++ {
		for col := 0; col < M1EntryBytes; col++ {
			r.Data[lay.Offset(slot, col)] = t.Data[slot*M1EntryBytes+col]
		}
	}
	return r
}

// OldV41Offset is Offset for a V4.1 cache as FlashMLA laid it out before its
// 2026.09.30 release: block-split like V4's, a block's P data rows of 512
// bytes first and its P scale rows of 16 after, at the same 528 bytes a
// token ("BREAKING CHANGE: the two V4.1 layouts are interleaved as of the
// 2026.09.30 upstream release ... a page block holding all of its data rows
// first and all of its scale rows afterwards ... a cache written in the old
// layout is NOT rejected, it is misread", vllm 0.33.0
// vllm/third_party/flashmla/flash_mla_interface.py:123-126). A writer of
// that era feeding a reader of this one is a bug a check should name.
func (l Layout) OldV41Offset(slot, col int) int {
	blk, t := slot/l.PageSize, slot%l.PageSize
	base := blk * l.PageSize * V41EntryBytes
	if col < v41ScaleOff {
		return base + t*V41Dims + col
	}
	return base + l.PageSize*V41Dims + t*V41Tiles + col - v41ScaleOff
}

// OldV41Entry is OldV41Offset's inverse.
func (l Layout) OldV41Entry(i int) (slot, col int) {
	blockBytes := l.PageSize * V41EntryBytes
	blk, o := i/blockBytes, i%blockBytes
	if o < l.PageSize*V41Dims {
		return blk*l.PageSize + o/V41Dims, o % V41Dims
	}
	o -= l.PageSize * V41Dims
	return blk*l.PageSize + o/V41Tiles, v41ScaleOff + o%V41Tiles
}
