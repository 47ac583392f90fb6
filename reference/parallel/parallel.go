// Package parallel runs the worker goroutines of the references and the
// comparison: it shares a reference's work out in units, stops handing
// units out once the caller's context is done (the one place a reference
// checks for a deadline or an interrupt, so that a timed-out check stops
// within a unit of work instead of running on in the background with its
// memory: kcheck check --timeout), and brings a worker's panic back to the
// goroutine that waits (Group), instead of ending the process.
//
// A unit is computed whole by one goroutine and writes only its own
// outputs, so results never depend on the number of goroutines; a unit
// should be small enough (a tile, a run of rows, a request's run of
// tokens) that the time to finish the ones in flight is short.
package parallel

import (
	"context"
	"runtime"
	"sync/atomic"
)

// Run calls work(u) for every unit u in [0, n) on at most workers
// goroutines (workers <= 0: GOMAXPROCS). Each goroutine calls newWorker
// once for the function it runs its units with, so it can keep scratch
// space from unit to unit. Once ctx is done no unit starts; Run waits for
// the units in flight and returns ctx.Err() (nil when every unit ran). A
// worker's panic stops the others taking units and is raised again by Run
// on the caller's goroutine, as Group.Wait raises it.
func Run(ctx context.Context, n, workers int, newWorker func() func(u int)) error {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	var next atomic.Int64
	var g Group
	for w := 0; w < min(workers, n); w++ {
		g.Go(func() {
			work := newWorker()
			for ctx.Err() == nil && !g.Failed() {
				u := int(next.Add(1) - 1)
				if u >= n {
					return
				}
				work(u)
			}
		})
	}
	g.Wait()
	return ctx.Err()
}

// Each is Run with a work function that keeps no state of its own.
func Each(ctx context.Context, n int, work func(u int)) error {
	return Run(ctx, n, 0, func() func(int) { return work })
}
