package kvcache

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// kv_cache_transfer (reference/CONTRACTS.md §3.10): a prefill node's cache
// entries moved into a decode node's cache. Where a token lives on each side
// follows from that side's block table and page size; what its destination
// entry holds follows from the two layouts:
//
//	same layout and scales   the source entry's bytes (NIXL and SGLang's
//	                         disaggregation move raw bytes)
//	different layouts        the source entry decoded as kv_cache_gather does
//	                         to F32 (e4m3·scale as one fp32 product; bf16
//	                         exactly), then written by kv_cache_write's
//	                         encoder of the destination layout (Overlay)
//
// Every other destination byte is unchanged. A Transfer holds the routing
// (Move: which source entry lands where) and computes a destination entry
// when asked for, so that a check of a whole decode-side cache holds no copy
// of either cache.

// Move is one destination entry a transfer writes: slot Dst (block*P +
// offset of the destination cache) receives the entry at slot Src of the
// source cache, request Request's token Token (a token at or past seq_len
// when a whole page moves).
type Move struct {
	Dst, Src       int64
	Request, Token int32
}

// CopyMode is how a destination entry is made from its source entry.
type CopyMode int

const (
	// CopyBytes: the two sides share a layout; the entry's bytes move as
	// they are.
	CopyBytes CopyMode = iota
	// CopyConvert: the layouts differ; the entry is decoded and re-encoded
	// by the destination's writer.
	CopyConvert
	// CopyRaw is no correct transfer: bytes moved as they are between
	// layouts that differ (the first bytes of the source entry, as many as
	// the destination entry has, the rest of a longer destination entry
	// unchanged). It is what a transport that never converts leaves, and
	// what a signature compares a failing destination with.
	CopyRaw
)

// Routing is where a transfer's tokens live on both sides: the contract's
// positions, checked against both caches.
type Routing struct {
	Src, Dst *Pages
	Moves    []Move // sorted by Dst, distinct destinations
}

// RouteTransfer places every token t < seq_lens[b] of every request b:
// source slot src_block_table[b, t/P_src]·P_src + t%P_src, destination slot
// dst_block_table[b, t/P]·P + t%P. With wholePages (equal page sizes
// only), the slots past seq_len in each destination page a request uses
// take the source page's slots too. srcNB and dstNB are the caches' block
// counts. Errors name the tensor and the index: a table entry outside its
// cache, a seq_len past a table's capacity, two tokens landing in one
// destination entry.
func RouteTransfer(srcTable, dstTable, seqLens *tensor.Tensor, srcPage, dstPage, srcNB, dstNB int, wholePages bool) (*Routing, error) {
	src, err := NewPagesNamed("src_block_table", srcTable, seqLens, srcPage, srcNB)
	if err != nil {
		return nil, err
	}
	dst, err := NewPagesNamed("dst_block_table", dstTable, seqLens, dstPage, dstNB)
	if err != nil {
		return nil, err
	}
	if wholePages && srcPage != dstPage {
		return nil, fmt.Errorf("parameter whole_pages = true needs equal page sizes on both sides: src_page_size = %d, page_size = %d (a transport that moves whole pages cannot split or join them)", srcPage, dstPage)
	}
	n := dst.Total()
	if wholePages {
		n = 0
		for _, s := range dst.SeqLens {
			n += (s + dstPage - 1) / dstPage * dstPage
		}
	}
	moves := make([]Move, 0, n)
	for b, s := range dst.SeqLens {
		end := s
		if wholePages {
			end = (s + dstPage - 1) / dstPage * dstPage
		}
		for t := 0; t < end; t++ {
			sb, so := src.Locate(b, t)
			db, do := dst.Locate(b, t)
			moves = append(moves, Move{Dst: int64(db)*int64(dstPage) + int64(do), Src: int64(sb)*int64(srcPage) + int64(so), Request: int32(b), Token: int32(t)})
		}
	}
	r := &Routing{Src: src, Dst: dst, Moves: moves}
	return r, r.sortDistinct()
}

// sortDistinct sorts the moves by destination and refuses two that share
// one, naming both requests' table entries.
func (r *Routing) sortDistinct() error {
	slices.SortStableFunc(r.Moves, func(a, b Move) int { return cmp.Compare(a.Dst, b.Dst) })
	p := r.Dst.PageSize
	for i := 1; i < len(r.Moves); i++ {
		a, b := r.Moves[i-1], r.Moves[i]
		if a.Dst == b.Dst {
			return fmt.Errorf("dst_block_table[%d,%d] and dst_block_table[%d,%d] both put a token at block %d offset %d (request %d token %d, request %d token %d): two tokens would land in one decode-side entry",
				a.Request, int(a.Token)/p, b.Request, int(b.Token)/p, a.Dst/int64(p), a.Dst%int64(p), a.Request, a.Token, b.Request, b.Token)
		}
	}
	return nil
}

// Transfer is a transfer held as what it changes: the destination cache
// before (never copied, never modified) and the moves into it.
type Transfer struct {
	Src, Dst *Cache // Dst views dst_cache_before
	// Before is dst_cache_before.
	Before *tensor.Tensor
	Moves  []Move // sorted by Dst
	Mode   CopyMode
	// srcBytes is the source cache's bytes an entry (its dtype's size
	// times its entry size).
	srcBytes int
}

// NewTransfer returns the transfer of moves (sorted by destination, as
// RouteTransfer makes them) from src into before, viewed as dst. Mode is
// CopyBytes or CopyConvert by whether the layouts agree (SameLayout) unless
// the caller asks for CopyRaw. The entries must hold the same values (L and
// R) on both sides: a transfer converts a format, never a model.
func NewTransfer(src *Cache, before *tensor.Tensor, dst *Cache, moves []Move, mode CopyMode) (*Transfer, error) {
	if src.Layout.L != dst.Layout.L || src.Layout.R != dst.Layout.R {
		return nil, fmt.Errorf("src_cache entries hold L = %d, R = %d values, dst_cache_before entries L = %d, R = %d: a transfer moves a token between two caches of one model", src.Layout.L, src.Layout.R, dst.Layout.L, dst.Layout.R)
	}
	if len(before.Data) != dst.Slots()*dst.Layout.EntrySize()*before.DType.Size() {
		return nil, fmt.Errorf("tensor dst_cache_before holds %d bytes, not the %d of its view", len(before.Data), dst.Slots()*dst.Layout.EntrySize()*before.DType.Size())
	}
	srcBytes := len(src.data) / max(src.Slots(), 1)
	for _, m := range moves {
		if m.Dst < 0 || m.Dst >= int64(dst.Slots()) || m.Src < 0 || m.Src >= int64(src.Slots()) {
			return nil, fmt.Errorf("request %d token %d moves from slot %d (of %d) to slot %d (of %d): outside the caches", m.Request, m.Token, m.Src, src.Slots(), m.Dst, dst.Slots())
		}
	}
	return &Transfer{Src: src, Dst: dst, Before: before, Moves: moves, Mode: mode, srcBytes: srcBytes}, nil
}

// SameLayout reports whether entries move between caches of layouts a and
// b (with per-tensor scales ka and kb for fp8_e4m3) as bytes: same
// kv_cache_dtype and widths, the same stored fp32 k_scale, the same tile
// scale convention for fp8_ds_mla. Page sizes only move entries around.
func SameLayout(a, b Layout, ka, kb float64) bool {
	if a.Kind != b.Kind || a.L != b.L || a.R != b.R {
		return false
	}
	switch a.Kind {
	case FP8E4M3:
		return float32(ka) == float32(kb)
	case FP8DSMLA:
		return a.DSScale == b.DSScale
	}
	return true
}

// Find returns the index of the move into destination slot, -1 when none.
func (x *Transfer) Find(slot int) int {
	k, ok := slices.BinarySearchFunc(x.Moves, int64(slot), func(m Move, s int64) int { return cmp.Compare(m.Dst, s) })
	if !ok {
		return -1
	}
	return k
}

// EntryBytes is the size in bytes of one destination entry.
func (x *Transfer) EntryBytes() int {
	return x.Dst.Layout.EntrySize() * x.Before.DType.Size()
}

// Encoder makes destination entries; each reader keeps its own (it holds
// the scratch of the one entry it last converted).
type Encoder struct {
	x    *Transfer
	row  []float64
	kvc  *tensor.Tensor // [1, L], F32 or F64
	kpe  *tensor.Tensor // [1, R]
	one  *tensor.Tensor // a one-entry cache_before for the writer
	deq  tensor.DType
	prec tensor.DType
	// eqK is the move whose overlay eq is (-1: none), kept for
	// Equivalent, whose calls come element by element.
	eqK int
	eq  *Overlay
}

// NewEncoder returns an encoder of x's entries: exact (the source decoded
// in float64, divided in float64) or as the engines' kernels compute (the
// fp32 product, the fp32 quotient).
func (x *Transfer) NewEncoder(exact bool) *Encoder {
	l := x.Dst.Layout
	deq := tensor.F32
	if exact {
		deq = tensor.F64
	}
	return &Encoder{x: x, row: make([]float64, l.D()), deq: deq, prec: deq, eqK: -1,
		kvc: tensor.New(deq, 1, l.L), kpe: tensor.New(deq, 1, l.R),
		one: tensor.New(x.Before.DType, 1, 1, l.EntrySize())}
}

// EntryInto writes the bytes move k leaves in its destination entry into
// dst[:EntryBytes()].
func (e *Encoder) EntryInto(k int, dst []byte) {
	x := e.x
	e.eqK = -1 // the overlay's token tensors are rewritten below
	m := x.Moves[k]
	dst = dst[:x.EntryBytes()]
	switch x.Mode {
	case CopyBytes, CopyRaw:
		src := x.Src.data[int(m.Src)*x.srcBytes : int(m.Src+1)*x.srcBytes]
		if x.Mode == CopyRaw && len(src) < len(dst) {
			copy(dst, x.Before.Data[int(m.Dst)*len(dst):int(m.Dst+1)*len(dst)])
		}
		copy(dst, src)
	default:
		o := e.overlay(m)
		o.EntryInto(0, e.deq == tensor.F64, dst)
	}
}

// overlay is the destination writer over move m's decoded source entry:
// kv_cache_write of one token into a one-entry cache of the destination's
// layout.
func (e *Encoder) overlay(m Move) *Overlay {
	x := e.x
	l := x.Dst.Layout
	x.Src.RowSlot(int(m.Src), e.row, e.deq)
	for j := 0; j < l.L; j++ {
		e.kvc.SetFloat64(j, e.row[j])
	}
	for j := 0; j < l.R; j++ {
		e.kpe.SetFloat64(j, e.row[l.L+j])
	}
	one := l
	one.PageSize = 1
	o, err := NewOverlay(e.one, e.kvc, e.kpe, []int64{0}, one, x.Dst.KScale)
	if err != nil {
		// NewTransfer checked the layouts, the widths and the scale the
		// writer is given: nothing here depends on the data.
		panic("kvcache: the destination writer refused a checked transfer: " + err.Error())
	}
	return o
}

// Equivalent reports whether actual, element col of move k's destination
// entry (as tensor.Float64At reads it), differs from the expected entry only
// as another correct writer's may (Overlay.Equivalent: an fp8 code at a
// rounding midpoint, a tile scale of the same convention). Copied bytes have
// no alternative. Successive calls for one entry reuse its writer.
func (e *Encoder) Equivalent(k, col int, actual float64) bool {
	if e.x.Mode != CopyConvert {
		return false
	}
	if e.eqK != k {
		e.eq, e.eqK = e.overlay(e.x.Moves[k]), k
	}
	return e.eq.Equivalent(col, actual)
}

// After returns the whole destination cache after the transfer, as a new
// tensor (for tests and small caches: a checker reads entries on demand).
func (x *Transfer) After(exact bool) *tensor.Tensor {
	c := x.Before.Clone()
	eb := x.EntryBytes()
	enc := x.NewEncoder(exact)
	for k, m := range x.Moves {
		enc.EntryInto(k, c.Data[int(m.Dst)*eb:int(m.Dst+1)*eb])
	}
	return c
}
