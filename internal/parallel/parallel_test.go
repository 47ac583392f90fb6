package parallel

import (
	"strings"
	"sync/atomic"
	"testing"
)

// A worker's panic comes back to Wait's caller, once, with where it was
// raised; the other workers see Failed and stop taking work.
func TestWorkerPanicReachesWait(t *testing.T) {
	var ran atomic.Int64
	p := catch(func() {
		For(4, 1000, func(u int) {
			ran.Add(1)
			if u == 3 {
				panic("unit 3 broke")
			}
		})
	})
	if p == nil {
		t.Fatal("For returned after a worker panicked")
	}
	if p.Value != "unit 3 broke" || !strings.Contains(p.Site, "parallel.TestWorkerPanicReachesWait") {
		t.Errorf("panic %v at %s", p.Value, p.Site)
	}
	if n := ran.Load(); n == 1000 {
		t.Errorf("all %d units ran after a worker panicked", n)
	}
}

func TestForRunsEveryUnitOnce(t *testing.T) {
	for _, workers := range []int{1, 3, 64} {
		seen := make([]atomic.Int32, 500)
		For(workers, len(seen), func(u int) { seen[u].Add(1) })
		for u := range seen {
			if n := seen[u].Load(); n != 1 {
				t.Fatalf("%d workers: unit %d ran %d times", workers, u, n)
			}
		}
	}
	For(4, 0, func(int) { t.Fatal("a unit of none ran") })
}

// A group inside a worker: the inner panic comes out as it was raised.
func TestNestedGroups(t *testing.T) {
	p := catch(func() {
		var outer Group
		outer.Go(func() { For(2, 2, func(u int) { panic(u) }) })
		outer.Wait()
	})
	if p == nil || !strings.Contains(p.Site, "TestNestedGroups") {
		t.Fatalf("panic %+v", p)
	}
}

func catch(fn func()) (p *Panic) {
	defer func() {
		if v := recover(); v != nil {
			p = v.(*Panic)
		}
	}()
	fn()
	return nil
}
