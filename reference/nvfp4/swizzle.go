package nvfp4

import "fmt"

// The 128x4 scale tile of CUTLASS / cuBLASLt block-scaled GEMMs: 128 scale
// rows by 4 scale columns, 512 bytes, stored as [32][4][4] (row mod 32, row
// div 32 within the tile, column within the tile).
const (
	TileRows  = 128
	TileCols  = 4
	TileBytes = TileRows * TileCols
)

// PaddedShape returns the swizzled layout's padded size for rows scale rows
// and kSF scale columns: rows up to a multiple of 128, columns up to a
// multiple of 4.
func PaddedShape(rows, kSF int) (mPad, kPad int) {
	return ceilDiv(rows, TileRows) * TileRows, ceilDiv(kSF, TileCols) * TileCols
}

// SwizzledOffset is the byte offset of scale (m, k) in the swizzled layout of
// a scale matrix with kSF columns (reference/CONTRACTS.md §5, TensorRT-LLM
// get_sf_out_offset_128x4):
//
//	((m/128)*numKTiles + k/4)*512 + (m%32)*16 + ((m%128)/32)*4 + k%4
//
// Tiles are laid out row-tile-major: all the column tiles of rows 0..127
// first. Inside a tile, rows m, m+32, m+64, m+96 share a 16-byte line, so
// one 16-byte load gives a thread the scales of four rows.
func SwizzledOffset(m, k, kSF int) int {
	numKTiles := ceilDiv(kSF, TileCols)
	return ((m/TileRows)*numKTiles+k/TileCols)*TileBytes +
		(m%32)*16 + ((m%TileRows)/32)*4 + k%TileCols
}

// SwizzledPosition inverts SwizzledOffset: the scale row and column stored at
// byte off of the swizzled layout. Positions in the padding have m >= rows or
// k >= kSF.
func SwizzledPosition(off, kSF int) (m, k int) {
	numKTiles := ceilDiv(kSF, TileCols)
	tile, in := off/TileBytes, off%TileBytes
	rowTile, colTile := tile/numKTiles, tile%numKTiles
	m = rowTile*TileRows + (in/16)%32 + ((in%16)/4)*32
	k = colTile*TileCols + in%4
	return m, k
}

// The 8x4 scale tile of TensorRT-LLM's small-batch kernels (vLLM
// scaled_fp4_quant with a trtllm backend and m <= 32, FlashInfer
// fp4_quantize(is_sf_8x4_layout=True)): 8 scale rows by 4 scale columns, 32
// bytes, row-major inside the tile, tiles row-tile-major (TensorRT-LLM
// get_sf_out_offset_8x4, as vendored in flashinfer 0.7.2.post1
// flashinfer/data/csrc/nv_internal/tensorrt_llm/kernels/quantization_utils.cuh:1026-1048:
// index [mTileIdx, kTileIdx, innerMIdx, innerKIdx], rows padded to 8).
const (
	Tile8x4Rows  = 8
	Tile8x4Bytes = Tile8x4Rows * TileCols
)

// Swizzled8x4Offset is the byte offset of scale (m, k) in the 8x4 layout of a
// scale matrix with kSF columns:
//
//	((m/8)*numKTiles + k/4)*32 + (m%8)*4 + k%4
func Swizzled8x4Offset(m, k, kSF int) int {
	numKTiles := ceilDiv(kSF, TileCols)
	return ((m/Tile8x4Rows)*numKTiles+k/TileCols)*Tile8x4Bytes + (m%Tile8x4Rows)*TileCols + k%TileCols
}

// Swizzled8x4Position inverts Swizzled8x4Offset.
func Swizzled8x4Position(off, kSF int) (m, k int) {
	numKTiles := ceilDiv(kSF, TileCols)
	tile, in := off/Tile8x4Bytes, off%Tile8x4Bytes
	return (tile/numKTiles)*Tile8x4Rows + in/TileCols, (tile%numKTiles)*TileCols + in%TileCols
}

// Layout is how block scales are stored.
type Layout int

const (
	// Linear is row-major [rows, K/16].
	Linear Layout = iota
	// Swizzled128x4 is the padded 128x4 tiled layout of reference/CONTRACTS.md §5.
	Swizzled128x4
	// Swizzled8x4 is the padded 8x4 tiled layout (§5).
	Swizzled8x4
)

// Layouts lists the scale_layout values, in the contract's spelling.
var Layouts = []string{"linear", "swizzled_128x4", "swizzled_8x4"}

// String returns the contract's name of the layout.
func (l Layout) String() string { return Layouts[l] }

// ParseLayout reads the contract's scale_layout parameter value.
func ParseLayout(s string) (Layout, error) {
	for i, n := range Layouts {
		if s == n {
			return Layout(i), nil
		}
	}
	return Linear, fmt.Errorf("scale layout %q: want linear, swizzled_128x4 or swizzled_8x4", s)
}

// TileRows is the rows of one tile of l (1 for the linear layout).
func (l Layout) TileRows() int {
	switch l {
	case Swizzled128x4:
		return TileRows
	case Swizzled8x4:
		return Tile8x4Rows
	}
	return 1
}

// PaddedShape is the stored [rows, columns] of rows x kSF scales in l.
func (l Layout) PaddedShape(rows, kSF int) (mPad, kPad int) {
	switch l {
	case Swizzled128x4:
		return PaddedShape(rows, kSF)
	case Swizzled8x4:
		return ceilDiv(rows, Tile8x4Rows) * Tile8x4Rows, ceilDiv(kSF, TileCols) * TileCols
	}
	return rows, kSF
}

// Fits reports whether a scale tensor of shape holds rows x kSF scales in l:
// [rows, kSF] for the linear layout; the padded [M_pad, K_pad], or flat
// [M_pad·K_pad], for a tiled one.
func (l Layout) Fits(shape []int, rows, kSF int) bool {
	mPad, kPad := l.PaddedShape(rows, kSF)
	return len(shape) == 2 && shape[0] == mPad && shape[1] == kPad ||
		l != Linear && len(shape) == 1 && shape[0] == mPad*kPad
}

// Offset is the byte offset of scale (m, k) of a matrix with kSF columns.
func (l Layout) Offset(m, k, kSF int) int {
	switch l {
	case Swizzled128x4:
		return SwizzledOffset(m, k, kSF)
	case Swizzled8x4:
		return Swizzled8x4Offset(m, k, kSF)
	}
	return m*kSF + k
}

// Position inverts Offset; positions in the padding have m >= rows or k >= kSF.
func (l Layout) Position(off, kSF int) (m, k int) {
	switch l {
	case Swizzled128x4:
		return SwizzledPosition(off, kSF)
	case Swizzled8x4:
		return Swizzled8x4Position(off, kSF)
	}
	return off / kSF, off % kSF
}

// FromLinear stores a linear [rows, kSF] scale matrix in l (zero padding).
func (l Layout) FromLinear(lin []uint8, rows, kSF int) ([]uint8, error) {
	if len(lin) != rows*kSF {
		return nil, fmt.Errorf("linear scales hold %d bytes; [%d, %d] needs %d", len(lin), rows, kSF, rows*kSF)
	}
	mPad, kPad := l.PaddedShape(rows, kSF)
	out := make([]uint8, mPad*kPad)
	for m := 0; m < rows; m++ {
		for k := 0; k < kSF; k++ {
			out[l.Offset(m, k, kSF)] = lin[m*kSF+k]
		}
	}
	return out, nil
}

// ToLinear reads scales stored in l back into a linear [rows, kSF] matrix;
// the padding is ignored.
func (l Layout) ToLinear(st []uint8, rows, kSF int) ([]uint8, error) {
	mPad, kPad := l.PaddedShape(rows, kSF)
	if len(st) != mPad*kPad {
		return nil, fmt.Errorf("%s scales hold %d bytes; %d rows x %d scale columns are stored as [%d, %d] = %d bytes",
			l, len(st), rows, kSF, mPad, kPad, mPad*kPad)
	}
	lin := make([]uint8, rows*kSF)
	for m := 0; m < rows; m++ {
		for k := 0; k < kSF; k++ {
			lin[m*kSF+k] = st[l.Offset(m, k, kSF)]
		}
	}
	return lin, nil
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }
