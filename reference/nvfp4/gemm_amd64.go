//go:build amd64 && !purego

package nvfp4

import (
	"runtime"

	"github.com/kcheck-dev/kcheck/reference/internal/simd"
	"github.com/kcheck-dev/kcheck/reference/parallel"
)

// On amd64 with AVX-512 or AVX2 the GEMM's inner loop runs in assembly
// (gemm_amd64.s, gemm_avx2_amd64.s): output tiles of 8 rows by 32
// columns, one column a vector lane, a's block values broadcast, b's in
// panels of 32 columns transposed to [K][32] so that a position's 32
// values are two (AVX2: four) consecutive vectors.
// The products and the sums inside a block are exact in fp32 (see GEMM), so
// the fused multiply-adds give runGeneric's block partials, and the
// partials are added to the fp32 and float64 accumulators one block at a
// time in K order, as runGeneric adds them: the results are its bits.

// level is the widest instruction set the CPU runs; tests set it to each
// of levels in turn.
var level, levels = simd.Best(), simd.Supported()

// kernelsName names the inner loop this build runs (for tests and benchmarks).
func kernelsName() string { return level.String() }

// gemmTileAVX512 is runGeneric's inner loops over one tile of asmTI = 8
// rows of a (block values, row r at a[r*lda:]) by the asmTJ = 32 columns of
// a panel of b (b[c*32+j] is column j's value at position c), nblk
// 16-element blocks long:
//
//	for r := 0; r < 8; r++ {
//		for j := 0; j < 32; j++ {
//			for q := 0; q < nblk; q++ {
//				s := blockSum(a[r*lda+16*q:][:16], column j of b's rows 16*q to 16*q+15)
//				acc32[r*32+j] = float32(acc32[r*32+j] + s)
//				acc64[r*32+j] += float64(s)
//			}
//		}
//	}
//
// in fused multiply-adds of its own order: a block's products and partial
// sums are exact in fp32 (see GEMM), so any order gives blockSum's bits.
//
//go:noescape
func gemmTileAVX512(a *float32, lda int, b *float32, nblk int, acc32 *float32, acc64 *float64)

// gemmTileAVX2 is gemmTileAVX512 in 256-bit vectors.
//
//go:noescape
func gemmTileAVX2(a *float32, lda int, b *float32, nblk int, acc32 *float32, acc64 *float64)

// The assembly's tile (asmTI rows, asmTJ columns), the K slice a panel
// holds (64 KiB of b, reused by every row tile of the unit from L2), and
// the most row tiles one work unit takes (their accumulators, 3 KiB a
// tile, stay in L2 too).
const asmTI, asmTJ, asmTK, asmMaxTiles = 8, 32, 512, 64

func (g *gemmJob) run(b *Matrix) error {
	if level == simd.Generic || g.m == 0 || g.n == 0 || g.k == 0 {
		return g.runGeneric(b)
	}
	return g.runTiles(b)
}

// runTiles shares the GEMM out in units of one 32-column panel of b by a
// run of row tiles. Each unit expands its panel from the packed codes one K
// slice at a time, so b's float32 values are never all in memory; a unit
// takes as many row tiles as it can (each unit expands its panel again)
// while leaving enough units to keep every thread busy. Which units there
// are does not change any output's arithmetic.
func (g *gemmJob) runTiles(b *Matrix) error {
	tile := gemmTileAVX512
	if level == simd.AVX2 {
		tile = gemmTileAVX2
	}
	m, n, k := g.m, g.n, g.k
	tiles, panels := (m+asmTI-1)/asmTI, (n+asmTJ-1)/asmTJ
	runs := max((tiles+asmMaxTiles-1)/asmMaxTiles, min(tiles, (4*runtime.GOMAXPROCS(0)+panels-1)/panels))
	per := (tiles + runs - 1) / runs
	runs = (tiles + per - 1) / per
	// The last row tile, when m is not a multiple of asmTI, reads its rows
	// from a zero-padded copy; its spare rows' outputs are dropped.
	var tail []float32
	if m%asmTI != 0 {
		tail = make([]float32, asmTI*k)
		copy(tail, g.av[(tiles-1)*asmTI*k:])
	}
	return parallel.Each(g.ctx, panels*runs, func(u int) {
		j0 := (u % panels) * asmTJ
		t0 := (u / panels) * per
		t1 := min(t0+per, tiles)
		acc32 := make([]float32, (t1-t0)*asmTI*asmTJ)
		acc64 := make([]float64, (t1-t0)*asmTI*asmTJ)
		panel := make([]float32, min(asmTK, k)*asmTJ)
		for k0 := 0; k0 < k; k0 += asmTK {
			k1 := min(k0+asmTK, k)
			b.panel(panel, j0, k0, k1)
			for t := t0; t < t1; t++ {
				rows := g.av[t*asmTI*k:]
				if tail != nil && t == tiles-1 {
					rows = tail
				}
				c := (t - t0) * asmTI * asmTJ
				tile(&rows[k0], k, &panel[0], (k1-k0)/BlockSize, &acc32[c], &acc64[c])
			}
		}
		for i := t0 * asmTI; i < min(t1*asmTI, m); i++ {
			for j := j0; j < min(j0+asmTJ, n); j++ {
				c := (i-t0*asmTI)*asmTJ + j - j0
				g.store(i, j, acc32[c], acc64[c])
			}
		}
	})
}

// panelAVX512 is panelGeneric for sixteen rows of b over nblk blocks, row
// r's packed codes at packed[r*rowBytes:] and its scale codes at
// scales[r*kb:]:
//
//	for r := 0; r < 16; r++ {
//		for q := 0; q < nblk; q++ {
//			s := e4m3Values32[scales[r*kb+q]]
//			for t, v := range packed[r*rowBytes+8*q : r*rowBytes+8*q+8] {
//				p[(16*q+2*t)*32+r] = e2m1Values32[v&0xF] * s
//				p[(16*q+2*t+1)*32+r] = e2m1Values32[v>>4] * s
//			}
//		}
//	}
//
//go:noescape
func panelAVX512(p *float32, packed *uint8, rowBytes int, scales *uint8, kb int, nblk int)

// panel writes the block values of b's rows j0..j0+asmTJ-1, positions k0
// to k1, transposed: p[(c-k0)*asmTJ + r-j0] is element (r, c), the value
// blockValues gives it. Sixteen rows at a time go through panelAVX512; a
// ragged rest, in the last panel, through panelGeneric. Rows past b's end
// are left as they are: zero, as p was made, since every call writes the
// same rows. Without AVX-512 every row goes through panelGeneric.
func (b *Matrix) panel(p []float32, j0, k0, k1 int) {
	rows, kb := min(asmTJ, b.Rows-j0), b.K/BlockSize
	r := 0
	if k1 > k0 && level == simd.AVX512 {
		for ; r+16 <= rows; r += 16 {
			panelAVX512(&p[r], &b.Packed[((j0+r)*b.K+k0)/2], b.K/2, &b.Scales[(j0+r)*kb+k0/BlockSize], kb, (k1-k0)/BlockSize)
		}
	}
	b.panelGeneric(p, j0, r, rows, k0, k1)
}

// panelGeneric is panel for rows j0+r0 to j0+r1-1, in plain Go, one block
// of the rows at a time so that the 2 KiB it writes to stay in L1.
func (b *Matrix) panelGeneric(p []float32, j0, r0, r1, k0, k1 int) {
	kb := b.K / BlockSize
	for bi := k0 / BlockSize; bi < k1/BlockSize; bi++ {
		dst := p[(bi*BlockSize-k0)*asmTJ:][:BlockSize*asmTJ]
		for r := r0; r < r1; r++ {
			blk := (j0+r)*kb + bi
			s := e4m3Values32[b.Scales[blk]]
			for t, v := range b.Packed[blk*BlockSize/2 : (blk+1)*BlockSize/2] {
				dst[2*t*asmTJ+r] = e2m1Values32[v&0xF] * s
				dst[(2*t+1)*asmTJ+r] = e2m1Values32[v>>4] * s
			}
		}
	}
}
