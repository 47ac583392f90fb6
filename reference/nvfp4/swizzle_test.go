package nvfp4

import (
	"testing"
)

// Offsets worked out by hand from reference/CONTRACTS.md §5, not from SwizzledOffset:
// offset = ((m/128)*numKTiles + k/4)*512 + (m%32)*16 + ((m%128)/32)*4 + k%4.
func TestSwizzledOffsetByHand(t *testing.T) {
	tests := []struct {
		m, k, kSF int
		want      int
		why       string
	}{
		{0, 0, 5, 0, "origin"},
		{1, 0, 5, 16, "next row: 1*16"},
		{0, 1, 5, 1, "next column: k%4 = 1"},
		{0, 3, 5, 3, "last column of the first tile"},
		{32, 0, 5, 4, "row 32 shares row 0's 16-byte line: (32/32)*4"},
		{64, 0, 5, 8, "(64/32)*4"},
		{96, 0, 5, 12, "(96/32)*4"},
		{33, 2, 5, 22, "1*16 + 1*4 + 2"},
		{127, 3, 5, 511, "31*16 + 3*4 + 3: last byte of tile 0"},
		{0, 4, 5, 512, "k=4 opens column tile 1: (0*2+1)*512"},
		{127, 4, 5, 1020, "(0*2+1)*512 + 31*16 + 3*4 + 0 = 512+508"},
		{128, 0, 5, 1024, "row tile 1 of numKTiles=2: (1*2+0)*512"},
		{129, 4, 5, 1552, "(1*2+1)*512 + 1*16 = 1536+16"},
		{5, 0, 1, 80, "kSF=1: 5*16"},
		{128, 0, 1, 512, "kSF=1 has one column tile: (1*1+0)*512"},
		{128, 3, 4, 515, "kSF=4: 512 + 3"},
		{200, 7, 8, 1024 + 512 + 8*16 + 2*4 + 3, "(1*2+1)*512 + (200%32=8)*16 + ((200%128=72)/32=2)*4 + 3 = 1675"},
	}
	for _, tc := range tests {
		if got := SwizzledOffset(tc.m, tc.k, tc.kSF); got != tc.want {
			t.Errorf("SwizzledOffset(m=%d, k=%d, kSF=%d) = %d, want %d (%s)", tc.m, tc.k, tc.kSF, got, tc.want, tc.why)
		}
		m, k := SwizzledPosition(tc.want, tc.kSF)
		if m != tc.m || k != tc.k {
			t.Errorf("SwizzledPosition(%d, kSF=%d) = (%d, %d), want (%d, %d)", tc.want, tc.kSF, m, k, tc.m, tc.k)
		}
	}
}

func TestPaddedShape(t *testing.T) {
	tests := []struct{ rows, kSF, mPad, kPad int }{
		{1, 1, 128, 4},
		{128, 4, 128, 4},
		{129, 4, 256, 4},
		{130, 5, 256, 8},
		{256, 448, 256, 448}, // K = 7168: 448 scale columns, already a multiple of 4
		{7168, 128, 7168, 128},
		{0, 0, 0, 0},
	}
	for _, tc := range tests {
		mp, kp := PaddedShape(tc.rows, tc.kSF)
		if mp != tc.mPad || kp != tc.kPad {
			t.Errorf("PaddedShape(%d, %d) = (%d, %d), want (%d, %d)", tc.rows, tc.kSF, mp, kp, tc.mPad, tc.kPad)
		}
	}
}

// ndarray is just enough of numpy/torch to replay torchao's to_blocked with
// row-major reshapes and a materializing permute, so the swizzle formula is
// checked against an independent formulation rather than itself.
type ndarray struct {
	shape []int
	data  []int
}

func (a ndarray) reshape(shape ...int) ndarray {
	n, neg := 1, -1
	for i, s := range shape {
		if s == -1 {
			neg = i
		} else {
			n *= s
		}
	}
	shape = append([]int(nil), shape...)
	if neg >= 0 {
		shape[neg] = len(a.data) / n
	}
	return ndarray{shape, a.data}
}

func (a ndarray) permute(perm ...int) ndarray {
	inStrides := make([]int, len(a.shape))
	s := 1
	for i := len(a.shape) - 1; i >= 0; i-- {
		inStrides[i] = s
		s *= a.shape[i]
	}
	outShape := make([]int, len(perm))
	for i, p := range perm {
		outShape[i] = a.shape[p]
	}
	out := make([]int, len(a.data))
	idx := make([]int, len(perm))
	for o := range out {
		src := 0
		for i, p := range perm {
			src += idx[i] * inStrides[p]
		}
		out[o] = a.data[src]
		for d := len(idx) - 1; d >= 0; d-- {
			idx[d]++
			if idx[d] < outShape[d] {
				break
			}
			idx[d] = 0
		}
	}
	return ndarray{outShape, out}
}

// toBlocked replays torchao.prototype.mx_formats.utils.to_blocked on a
// [rows, kSF] matrix whose entries are their own linear index (-1 for
// padding): pad to [nRB*128, nCB*4]; view as (nRB, 128, nCB, 4); permute to
// (nRB, nCB, 128, 4); reshape to (-1, 4, 32, 4); transpose dims 1 and 2;
// reshape to (-1, 32, 16); flatten. The result says which source element
// each swizzled byte holds.
func toBlocked(rows, kSF int) []int {
	nRB, nCB := (rows+127)/128, (kSF+3)/4
	padded := make([]int, nRB*128*nCB*4)
	for i := range padded {
		m, k := i/(nCB*4), i%(nCB*4)
		if m < rows && k < kSF {
			padded[i] = m*kSF + k
		} else {
			padded[i] = -1
		}
	}
	a := ndarray{[]int{nRB * 128, nCB * 4}, padded}
	a = a.reshape(nRB, 128, nCB, 4).permute(0, 2, 1, 3)
	a = a.reshape(-1, 4, 32, 4).permute(0, 2, 1, 3)
	return a.reshape(-1, 32, 16).data
}

func TestSwizzleMatchesToBlocked(t *testing.T) {
	shapes := [][2]int{{1, 1}, {3, 2}, {32, 4}, {127, 5}, {128, 4}, {130, 5}, {257, 9}, {300, 13}}
	for _, sh := range shapes {
		rows, kSF := sh[0], sh[1]
		blocked := toBlocked(rows, kSF)
		mPad, kPad := PaddedShape(rows, kSF)
		if len(blocked) != mPad*kPad {
			t.Fatalf("[%d,%d]: to_blocked gives %d bytes, PaddedShape says %d", rows, kSF, len(blocked), mPad*kPad)
		}
		seen := 0
		for pos, src := range blocked {
			m, k := SwizzledPosition(pos, kSF)
			if src < 0 {
				if m < rows && k < kSF {
					t.Errorf("[%d,%d]: byte %d is padding in to_blocked, SwizzledPosition says (%d,%d)", rows, kSF, pos, m, k)
				}
				continue
			}
			seen++
			wm, wk := src/kSF, src%kSF
			if got := SwizzledOffset(wm, wk, kSF); got != pos {
				t.Errorf("[%d,%d]: scale (%d,%d) is at byte %d in to_blocked, SwizzledOffset says %d", rows, kSF, wm, wk, pos, got)
			}
			if m != wm || k != wk {
				t.Errorf("[%d,%d]: SwizzledPosition(%d) = (%d,%d), to_blocked has (%d,%d)", rows, kSF, pos, m, k, wm, wk)
			}
		}
		if seen != rows*kSF {
			t.Errorf("[%d,%d]: to_blocked placed %d scales, want %d", rows, kSF, seen, rows*kSF)
		}
	}
}

func TestSwizzleRoundTripAndPadding(t *testing.T) {
	rows, kSF := 130, 5
	lin := make([]uint8, rows*kSF)
	for i := range lin {
		lin[i] = uint8(i%254 + 1) // never 0, so a zero byte can only be padding
	}
	sw, err := Swizzled128x4.FromLinear(lin, rows, kSF)
	if err != nil {
		t.Fatal(err)
	}
	if len(sw) != 256*8 {
		t.Fatalf("swizzled length %d, want 256*8", len(sw))
	}
	zeros := 0
	for _, b := range sw {
		if b == 0 {
			zeros++
		}
	}
	if want := 256*8 - rows*kSF; zeros != want {
		t.Errorf("%d zero (padding) bytes, want %d", zeros, want)
	}
	back, err := Swizzled128x4.ToLinear(sw, rows, kSF)
	if err != nil {
		t.Fatal(err)
	}
	for i := range lin {
		if back[i] != lin[i] {
			t.Fatalf("round trip: element %d = %d, want %d", i, back[i], lin[i])
		}
	}
	if _, err := Swizzled128x4.ToLinear(sw[:100], rows, kSF); err == nil {
		t.Error("ToLinear accepted a short buffer")
	}
	if _, err := Swizzled128x4.FromLinear(lin[:10], rows, kSF); err == nil {
		t.Error("FromLinear accepted a short buffer")
	}
}

func TestParseLayout(t *testing.T) {
	for _, s := range []string{"linear", "swizzled_128x4"} {
		l, err := ParseLayout(s)
		if err != nil || l.String() != s {
			t.Errorf("ParseLayout(%q) = %v, %v", s, l, err)
		}
	}
	if _, err := ParseLayout("swizzled"); err == nil {
		t.Error("ParseLayout accepted \"swizzled\"")
	}
}

// The 8x4 layout as a permutation of the padded linear matrix: TensorRT-LLM's
// get_sf_out_offset_8x4 indexes [mTile, kTile, innerM, innerK]
// (quantization_utils.cuh:1026-1048 in flashinfer 0.7.2.post1), i.e. the
// padded [mPad, kPad] matrix viewed as [mt, 8, kt, 4] and permuted (0, 2, 1,
// 3). Built here by that permutation, independently of Swizzled8x4Offset's
// arithmetic, with hand-computed offsets from the source's strides.
func TestSwizzled8x4MatchesPermutation(t *testing.T) {
	for _, tc := range []struct{ m, k, kSF, want int }{
		{0, 0, 1, 0}, {0, 3, 4, 3}, {1, 0, 4, 4}, {7, 3, 4, 31}, {8, 0, 4, 32},
		{9, 5, 8, 101}, // mTile 1 (stride 2 tiles x 32), kTile 1 (32), innerM 1 (4), innerK 1
	} {
		if got := Swizzled8x4Offset(tc.m, tc.k, tc.kSF); got != tc.want {
			t.Errorf("Swizzled8x4Offset(%d, %d, kSF %d) = %d, want %d", tc.m, tc.k, tc.kSF, got, tc.want)
		}
	}
	for _, sh := range [][2]int{{1, 1}, {3, 2}, {8, 4}, {9, 5}, {32, 7}, {33, 13}} {
		rows, kSF := sh[0], sh[1]
		mPad, kPad := Swizzled8x4.PaddedShape(rows, kSF)
		if mPad%8 != 0 || kPad%4 != 0 || mPad < rows || kPad < kSF || mPad-rows >= 8 || kPad-kSF >= 4 {
			t.Fatalf("[%d,%d]: padded shape [%d,%d]", rows, kSF, mPad, kPad)
		}
		mt, kt := mPad/8, kPad/4
		perm := make([][2]int, 0, mPad*kPad) // byte position -> (m, k)
		for a := 0; a < mt; a++ {
			for b := 0; b < kt; b++ {
				for c := 0; c < 8; c++ {
					for d := 0; d < 4; d++ {
						perm = append(perm, [2]int{a*8 + c, b*4 + d})
					}
				}
			}
		}
		for pos, mk := range perm {
			if m, k := Swizzled8x4.Position(pos, kSF); m != mk[0] || k != mk[1] {
				t.Errorf("[%d,%d]: Position(%d) = (%d,%d), the permutation has (%d,%d)", rows, kSF, pos, m, k, mk[0], mk[1])
			}
			if mk[0] < rows && mk[1] < kSF {
				if got := Swizzled8x4.Offset(mk[0], mk[1], kSF); got != pos {
					t.Errorf("[%d,%d]: Offset(%d,%d) = %d, the permutation has %d", rows, kSF, mk[0], mk[1], got, pos)
				}
			}
		}
	}
}

// Every layout round-trips and leaves its padding zero.
func TestLayoutsRoundTrip(t *testing.T) {
	for _, name := range Layouts {
		l, err := ParseLayout(name)
		if err != nil || l.String() != name {
			t.Fatalf("ParseLayout(%q) = %v, %v", name, l, err)
		}
		for _, sh := range [][2]int{{1, 1}, {9, 5}, {130, 3}} {
			rows, kSF := sh[0], sh[1]
			lin := make([]uint8, rows*kSF)
			for i := range lin {
				lin[i] = uint8(i%251 + 1)
			}
			st, err := l.FromLinear(lin, rows, kSF)
			if err != nil {
				t.Fatal(err)
			}
			nonzero := 0
			for _, b := range st {
				if b != 0 {
					nonzero++
				}
			}
			if nonzero != len(lin) {
				t.Errorf("%s [%d,%d]: %d nonzero bytes stored, want %d (padding must be zero)", name, rows, kSF, nonzero, len(lin))
			}
			back, err := l.ToLinear(st, rows, kSF)
			if err != nil {
				t.Fatal(err)
			}
			for i := range lin {
				if back[i] != lin[i] {
					t.Fatalf("%s [%d,%d]: round trip differs at %d", name, rows, kSF, i)
				}
			}
		}
	}
	if _, err := ParseLayout("swizzled_16x4"); err == nil {
		t.Error("ParseLayout accepted swizzled_16x4")
	}
}
