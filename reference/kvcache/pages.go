package kvcache

import (
	"fmt"

	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Pages is a validated block table: request b's token t lives in cache block
// Table[b*MaxBlocks + t/P] at offset t%P. Only the entries that seq_lens
// reaches are checked (and used): engines pad the rest of a row with 0, -1 or
// whatever the allocator left there.
type Pages struct {
	PageSize  int
	MaxBlocks int
	Table     []int32 // [B * MaxBlocks], row-major block_table
	SeqLens   []int   // [B]
	CuSeqLens []int   // [B+1]: request b's rows of a gathered tensor start at CuSeqLens[b]
	// name is the block table's tensor name in errors (block_table, or a
	// transfer's src_block_table and dst_block_table).
	name string
}

// NewPages reads block_table [B, max_blocks] and seq_lens [B] (any integer
// dtype) and checks them against a cache of nb blocks of pageSize tokens.
// Errors name the tensor and the index.
func NewPages(blockTable, seqLens *tensor.Tensor, pageSize, nb int) (*Pages, error) {
	return NewPagesNamed("block_table", blockTable, seqLens, pageSize, nb)
}

// NewPagesNamed is NewPages for a block table the contract calls name
// (kv_cache_transfer has two), so that errors name it.
func NewPagesNamed(name string, blockTable, seqLens *tensor.Tensor, pageSize, nb int) (*Pages, error) {
	if err := blockTable.Check(); err != nil {
		return nil, fmt.Errorf("tensor %s: %v", name, err)
	}
	if err := seqLens.Check(); err != nil {
		return nil, fmt.Errorf("tensor seq_lens: %v", err)
	}
	if !blockTable.DType.IsInt() {
		return nil, fmt.Errorf("tensor %s has dtype %s; want an integer dtype (I32)", name, blockTable.DType)
	}
	if !seqLens.DType.IsInt() {
		return nil, fmt.Errorf("tensor seq_lens has dtype %s; want an integer dtype (I32)", seqLens.DType)
	}
	if len(blockTable.Shape) != 2 {
		return nil, fmt.Errorf("tensor %s has shape %v; want [B, max_blocks]", name, blockTable.Shape)
	}
	if len(seqLens.Shape) != 1 {
		return nil, fmt.Errorf("tensor seq_lens has shape %v; want [B]", seqLens.Shape)
	}
	b, mb := blockTable.Shape[0], blockTable.Shape[1]
	if seqLens.Shape[0] != b {
		return nil, fmt.Errorf("tensor seq_lens has %d entries but %s has %d rows (one per request)", seqLens.Shape[0], name, b)
	}
	table := make([]int32, b*mb)
	for i := range table {
		v := blockTable.Int64At(i)
		table[i] = int32(v)
		if int64(table[i]) != v { // kept for the range check below
			table[i] = -1
		}
	}
	lens := make([]int, b)
	for i := range lens {
		lens[i] = int(seqLens.Int64At(i))
	}
	p := &Pages{PageSize: pageSize, MaxBlocks: mb, Table: table, SeqLens: lens, name: name}
	return p, p.validate(blockTable, nb)
}

// validate checks seq_lens against the table's capacity and every used
// block_table entry against the cache, and fills CuSeqLens.
func (p *Pages) validate(blockTable *tensor.Tensor, nb int) error {
	if p.PageSize <= 0 {
		return fmt.Errorf("parameter page_size = %d: want a positive page size", p.PageSize)
	}
	p.CuSeqLens = make([]int, len(p.SeqLens)+1)
	capacity := p.MaxBlocks * p.PageSize
	for b, n := range p.SeqLens {
		if n < 0 {
			return fmt.Errorf("seq_lens[%d] = %d is negative", b, n)
		}
		if n > capacity {
			return fmt.Errorf("seq_lens[%d] = %d exceeds the %s capacity %d*%d = %d",
				b, n, p.tableWords(), p.MaxBlocks, p.PageSize, capacity)
		}
		used := (n + p.PageSize - 1) / p.PageSize
		for j := 0; j < used; j++ {
			v := blockTable.Int64At(b*p.MaxBlocks + j)
			if v < 0 || v >= int64(nb) {
				return fmt.Errorf("%s[%d,%d] = %d is outside the cache (NB = %d); request %d uses %d blocks for seq_lens[%d] = %d",
					p.name, b, j, v, nb, b, used, b, n)
			}
		}
		p.CuSeqLens[b+1] = p.CuSeqLens[b] + n
	}
	return nil
}

// tableWords names the table in a sentence: "block table's" for the one
// table of a read, the tensor's own name for one of a transfer's two.
func (p *Pages) tableWords() string {
	if p.name == "" || p.name == "block_table" {
		return "block table's"
	}
	return p.name + "'s"
}

// B is the number of requests.
func (p *Pages) B() int { return len(p.SeqLens) }

// Total is sum(seq_lens), the number of rows a gather produces.
func (p *Pages) Total() int { return p.CuSeqLens[len(p.SeqLens)] }

// Locate returns the cache position of request b's token t (t < seq_lens[b]).
func (p *Pages) Locate(b, t int) (block, offset int) {
	return int(p.Table[b*p.MaxBlocks+t/p.PageSize]), t % p.PageSize
}

// Request returns the request and in-request token of a gathered row.
func (p *Pages) Request(row int) (b, t int) {
	lo, hi := 0, len(p.SeqLens)
	for lo < hi { // the last b with CuSeqLens[b] <= row
		m := (lo + hi) / 2
		if p.CuSeqLens[m+1] <= row {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, row - p.CuSeqLens[lo]
}

// CheckSlots reports the first slot_mapping entry that points outside a cache
// of slots = NB*P entries, or that repeats an earlier token's slot (two
// tokens writing one entry leave a result that depends on thread order).
// Negative slots mean "skip this token" and are fine.
func CheckSlots(slots []int64, nb, pageSize int) error {
	n := int64(nb) * int64(pageSize)
	first := make(map[int64]int)
	for t, s := range slots {
		if s < 0 {
			continue
		}
		if s >= n {
			return fmt.Errorf("slot_mapping[%d] = %d is outside the cache (NB*P = %d*%d = %d)", t, s, nb, pageSize, n)
		}
		if u, dup := first[s]; dup {
			return fmt.Errorf("slot_mapping[%d] = %d repeats slot_mapping[%d]: two tokens would write one cache entry", t, s, u)
		}
		first[s] = t
	}
	return nil
}

// Gather returns the [sum(seq_lens), D] rows of every request, row
// CuSeqLens[b]+t holding cache[block_table[b, t/P], t%P] dequantized at
// precision deq (as Row). It is kv_cache_gather before the output rounding.
func Gather(c *Cache, p *Pages, deq tensor.DType) ([]float64, error) {
	if p.PageSize != c.Layout.PageSize {
		return nil, fmt.Errorf("block table pages of %d tokens, cache pages of %d", p.PageSize, c.Layout.PageSize)
	}
	for i, blk := range p.Table {
		b, j := i/p.MaxBlocks, i%p.MaxBlocks
		if j*p.PageSize < p.SeqLens[b] && (blk < 0 || int(blk) >= c.NB) {
			return nil, fmt.Errorf("block_table[%d,%d] = %d is outside the cache (NB = %d)", b, j, blk, c.NB)
		}
	}
	d := c.D()
	out := make([]float64, p.Total()*d)
	for b, n := range p.SeqLens {
		base := p.CuSeqLens[b]
		for t := 0; t < n; t++ {
			blk, off := p.Locate(b, t)
			c.Row(blk, off, out[(base+t)*d:(base+t+1)*d], deq)
		}
	}
	return out, nil
}
