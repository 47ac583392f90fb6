// Package parallel shares a reference's work out to goroutines in units,
// and stops handing units out once the caller's context is done: the one
// place a reference checks for a deadline or an interrupt, so that a
// timed-out check stops within a unit of work instead of running on in
// the background with its memory (kcheck check --timeout).
//
// A unit is computed whole by one goroutine and writes only its own
// outputs, so results never depend on the number of goroutines; a unit
// should be small enough (a tile, a run of rows, a request's run of
// tokens) that the time to finish the ones in flight is short.
package parallel

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
)

// Run calls work(u) for every unit u in [0, n) on at most workers
// goroutines (workers <= 0: GOMAXPROCS). Each goroutine calls newWorker
// once for the function it runs its units with, so it can keep scratch
// space from unit to unit. Once ctx is done no unit starts; Run waits for
// the units in flight and returns ctx.Err() (nil when every unit ran).
func Run(ctx context.Context, n, workers int, newWorker func() func(u int)) error {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < min(workers, n); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			work := newWorker()
			for ctx.Err() == nil {
				u := int(next.Add(1) - 1)
				if u >= n {
					return
				}
				work(u)
			}
		}()
	}
	wg.Wait()
	return ctx.Err()
}

// Each is Run with a work function that keeps no state of its own.
func Each(ctx context.Context, n int, work func(u int)) error {
	return Run(ctx, n, 0, func() func(int) { return work })
}
