package parallel

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A worker's panic comes back to Wait's caller, once, with where it was
// raised; the other workers see Failed and stop taking work.
func TestWorkerPanicReachesWait(t *testing.T) {
	var ran atomic.Int64
	p := catch(func() {
		Run(context.Background(), 1000, 4, func() func(int) {
			return func(u int) {
				ran.Add(1)
				if u == 3 {
					panic("unit 3 broke")
				}
				// Units that take time, as a reference's do: the others
				// would otherwise finish all 1000 before the panic's
				// recovery has marked the group failed.
				time.Sleep(100 * time.Microsecond)
			}
		})
	})
	if p == nil {
		t.Fatal("Run returned after a worker panicked")
	}
	if p.Value != "unit 3 broke" || !strings.Contains(p.Site, "parallel.TestWorkerPanicReachesWait") {
		t.Errorf("panic %v at %s", p.Value, p.Site)
	}
	if n := ran.Load(); n == 1000 {
		t.Errorf("all %d units ran after a worker panicked", n)
	}
}

// A group inside a worker: the inner panic comes out as it was raised.
func TestNestedGroups(t *testing.T) {
	p := catch(func() {
		var outer Group
		outer.Go(func() { _ = Each(context.Background(), 2, func(u int) { panic(u) }) })
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
