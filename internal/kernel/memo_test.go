package kernel

import (
	"context"
	"fmt"
	"sync"
	"testing"
)

// TestMemoKeepsTheRecentWithinBudget: values are kept up to the budget,
// the least recently used (by Get or Put) leaving first; a value over
// the budget is never kept, and putting a key again replaces its value.
func TestMemoKeepsTheRecentWithinBudget(t *testing.T) {
	m := NewMemo(100)
	m.Put("a", 1, 40)
	m.Put("b", 2, 40)
	if _, ok := m.Get("a"); !ok { // a is now more recent than b
		t.Fatal("a not kept")
	}
	m.Put("c", 3, 40) // over 100: b, the least recent, leaves
	for key, want := range map[string]bool{"a": true, "b": false, "c": true} {
		if _, ok := m.Get(key); ok != want {
			t.Errorf("after c: %s kept %v, want %v", key, ok, want)
		}
	}
	m.Put("huge", 4, 101)
	if _, ok := m.Get("huge"); ok {
		t.Error("a value over the budget was kept")
	}
	m.Put("a", 5, 60) // replaces a's 40 bytes: with c's 40, 100 fit
	if _, ok := m.Get("c"); !ok {
		t.Error("c dropped for a's new 60 bytes: a's old 40 were counted too")
	}
	m.Put("a", 6, 70) // with c's 40 over the budget: c leaves
	if v, ok := m.Get("a"); !ok || v != 6 {
		t.Errorf("a = %v, %v after its third Put; want 6", v, ok)
	}
	if _, ok := m.Get("c"); ok {
		t.Error("c kept beside a's 70 bytes")
	}
	if m.used != 70 {
		t.Errorf("%d bytes counted, want 70", m.used)
	}
}

// TestMemoConcurrent: Get and Put from many goroutines (under -race).
func TestMemoConcurrent(t *testing.T) {
	m := NewMemo(1000)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				key := fmt.Sprint((g + i) % 30)
				if _, ok := m.Get(key); !ok {
					m.Put(key, i, 64)
				}
			}
		})
	}
	wg.Wait()
	if m.used > 1000 {
		t.Errorf("%d bytes kept, over the budget of 1000", m.used)
	}
}

// TestMemoFromContext: a context carries the memo it was given; one
// without carries none.
func TestMemoFromContext(t *testing.T) {
	m := NewMemo(1)
	if MemoFrom(context.Background()) != nil {
		t.Error("a plain context carries a memo")
	}
	if MemoFrom(WithMemo(context.Background(), m)) != m {
		t.Error("WithMemo's context does not carry its memo")
	}
}

// TestRNGRestore: a generator restored to a State draws what it drew
// after that State, a pending Box-Muller spare included.
func TestRNGRestore(t *testing.T) {
	for _, skip := range []int{0, 1, 2, 7} { // odd: a spare is pending
		r := NewRNG(42, 1)
		for range skip {
			r.Normal()
		}
		s := r.State()
		var want []float64
		for range 5 {
			want = append(want, r.Normal(), r.Uniform())
		}
		q := NewRNG(7, 3)
		if err := q.Restore(s); err != nil {
			t.Fatal(err)
		}
		for k := range 5 {
			if a, b := q.Normal(), q.Uniform(); a != want[2*k] || b != want[2*k+1] {
				t.Fatalf("after %d normals: draw %d is %v, %v; want %v, %v", skip, k, a, b, want[2*k], want[2*k+1])
			}
		}
	}
	if err := NewRNG(1, 1).Restore([]byte{1, 2}); err == nil {
		t.Error("a 2-byte state restored without an error")
	}
}
