package kvcache

import "github.com/kcheck-dev/kcheck/reference/tensor"

// DeepSeek-V4's sparse cache, FlashMLA's MODEL1 layout
// (deepseek-ai/FlashMLA@9241ae3, the source every number below is read
// from):
//
//   - csrc/api/sparse_decode.h:290-292: bytes_per_token = 448 + 64*2 +
//     (448/64)*1 + 1 = 584 for d_qk = 512 (the V3.2 entry is 656 for 576),
//     and :291/:326-329 the layout is chosen by d_qk alone.
//   - tests/quant.py:14 get_meta: (d, d_nope, d_rope, tile_size, num_tiles)
//     = (512, 448, 64, 64, 7).
//   - tests/quant.py:53-58, quantize_k_cache: a block is allocated as
//     ceil(P*584 / 576)*576 bytes, and holds [P x (448 E4M3 | 64 BF16)]
//     from byte 0 and [P x 8] from byte P*(448+128), the eighth byte of each
//     8 never written (`[:, :, :7]`); the tensor handed to the kernel is
//     that block viewed as [NB, P, 1, 584] with the padded block stride.
//   - tests/quant.py:60-68: scale = 2^ceil(log2(max(amax/448, 1e-4))),
//     stored as float8_e8m0fnu; codes = fp8_e4m3fn(x / scale).
//   - tests/quant.py:100-110, dequantize_k_cache: e4m3.to(bf16) *
//     e8m0.to(bf16), a product a bf16 holds exactly unless it leaves bf16's
//     range, so every dequantization precision reads the same values.
//
// vLLM documents the same record (vllm 0.33.0
// vllm/v1/attention/backends/mla/flashmla_sparse.py:89-109: "448 bytes
// ... 128 bytes ... 8 bytes", "a page holds all its data rows first and
// all its scale rows after ... rounded up to the decode kernel's 576 B TMA
// stride") and writes it the same way but for the amax floor
// (ScalePow2AmaxFloor; cache_utils.py:64-70 the block layout, :161 the
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

// BlockSplit reports whether a block of the layout stores its tokens' data
// rows first and their scale rows after, rather than token by token.
func (k Kind) BlockSplit() bool { return k == FP8DSMLAModel1 }

// BlockStride is the bytes FlashMLA allocates a block of P tokens:
// ceil(P*584/576)*576 (tests/quant.py:54). kcheck's tensors leave the
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
