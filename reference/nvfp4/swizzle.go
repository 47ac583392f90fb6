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

// SwizzleScales copies a linear [rows, kSF] scale matrix into the swizzled
// layout, [mPad*kPad] bytes with zero padding.
func SwizzleScales(lin []uint8, rows, kSF int) ([]uint8, error) {
	if len(lin) != rows*kSF {
		return nil, fmt.Errorf("linear scales hold %d bytes; [%d, %d] needs %d", len(lin), rows, kSF, rows*kSF)
	}
	mPad, kPad := PaddedShape(rows, kSF)
	sw := make([]uint8, mPad*kPad)
	for m := 0; m < rows; m++ {
		for k := 0; k < kSF; k++ {
			sw[SwizzledOffset(m, k, kSF)] = lin[m*kSF+k]
		}
	}
	return sw, nil
}

// UnswizzleScales reads a swizzled scale buffer back into a linear [rows,
// kSF] matrix; the padding is ignored.
func UnswizzleScales(sw []uint8, rows, kSF int) ([]uint8, error) {
	mPad, kPad := PaddedShape(rows, kSF)
	if len(sw) != mPad*kPad {
		return nil, fmt.Errorf("swizzled scales hold %d bytes; %d rows x %d scale columns pad to [%d, %d] = %d bytes",
			len(sw), rows, kSF, mPad, kPad, mPad*kPad)
	}
	lin := make([]uint8, rows*kSF)
	for m := 0; m < rows; m++ {
		for k := 0; k < kSF; k++ {
			lin[m*kSF+k] = sw[SwizzledOffset(m, k, kSF)]
		}
	}
	return lin, nil
}

// Layout is how block scales are stored.
type Layout int

const (
	// Linear is row-major [rows, K/16].
	Linear Layout = iota
	// Swizzled128x4 is the padded 128x4 tiled layout of reference/CONTRACTS.md §5.
	Swizzled128x4
)

// String returns the contract's name of the layout.
func (l Layout) String() string {
	if l == Swizzled128x4 {
		return "swizzled_128x4"
	}
	return "linear"
}

// ParseLayout reads the contract's scale_layout parameter value.
func ParseLayout(s string) (Layout, error) {
	switch s {
	case "linear":
		return Linear, nil
	case "swizzled_128x4":
		return Swizzled128x4, nil
	}
	return Linear, fmt.Errorf("scale layout %q: want linear or swizzled_128x4", s)
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }
