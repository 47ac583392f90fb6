package kernel

import (
	"context"
	"sync"
)

// Memo keeps what generators built, for the later cases of one run that
// would build it again: the catalog's cases of one seed and cache geometry
// (every head count, TP size and query length of a preset) draw the same
// paged cache from the same RNG state, and building it (its tokens drawn
// and written through the kv_cache_write reference) was most of an MLA
// case's input generation (issue 17). A value is kept under a key that
// names everything it was made from, so a hit is the value a build would
// give; the caller copies what it takes out and what it puts in, so no
// case sees another's tensors. At most budget bytes are kept, the least
// recently used value leaving first; a value larger than the budget is not
// kept. Safe for concurrent use.
type Memo struct {
	mu      sync.Mutex
	budget  int64
	used    int64
	clock   uint64
	hits    int
	entries map[string]*memoEntry
}

type memoEntry struct {
	v    any
	size int64
	last uint64 // the clock at its last use
}

// NewMemo returns an empty memo that keeps at most budget bytes.
func NewMemo(budget int64) *Memo {
	return &Memo{budget: budget, entries: map[string]*memoEntry{}}
}

type memoKey struct{}

// WithMemo returns ctx carrying m: the generators run under it consult it.
func WithMemo(ctx context.Context, m *Memo) context.Context {
	return context.WithValue(ctx, memoKey{}, m)
}

// MemoFrom returns the memo ctx carries, or nil.
func MemoFrom(ctx context.Context) *Memo {
	m, _ := ctx.Value(memoKey{}).(*Memo)
	return m
}

// Get returns the value kept under key.
func (m *Memo) Get(key string) (any, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[key]
	if !ok {
		return nil, false
	}
	m.clock++
	e.last = m.clock
	m.hits++
	return e.v, true
}

// Hits is how many Gets found their key.
func (m *Memo) Hits() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.hits
}

// Keeps reports whether a value of size bytes can be kept at all (Put
// drops one over the budget): a caller that copies what it puts asks
// first, so that a value too large to keep is never copied.
func (m *Memo) Keeps(size int64) bool { return size <= m.budget }

// Put keeps v, of size bytes, under key, making room by dropping the least
// recently used values.
func (m *Memo) Put(key string, v any, size int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if size > m.budget {
		return
	}
	if old, ok := m.entries[key]; ok {
		m.used -= old.size
		delete(m.entries, key)
	}
	for m.used+size > m.budget {
		var lru string
		var oldest uint64
		first := true
		for k, e := range m.entries {
			if first || e.last < oldest {
				lru, oldest, first = k, e.last, false
			}
		}
		m.used -= m.entries[lru].size
		delete(m.entries, lru)
	}
	m.clock++
	m.entries[key] = &memoEntry{v: v, size: size, last: m.clock}
	m.used += size
}
