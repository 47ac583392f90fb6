package check

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Work in flight, and what a deadline does to it.
//
// Every reference and comparison stops soon after its context is done
// (kernel.Kernel.Reference; reference/parallel), so a check past its
// deadline is waited for: it returns within a unit of work and its memory
// is free for the next file. Should something not stop within stopGrace
// (a pass over a whole capture that watches no context), it is left to
// finish in the background, but its estimated working set stays charged
// against the memory bound until it does: the next check waits until its
// own estimate fits beside what is still held, so abandoned work can never
// pile up past --max-memory (40 copies of a file estimated at 3.6 GiB once
// reached 14 GB under --max-memory 4G --timeout 2s).

// stopGrace is how long work past its deadline is waited for before it is
// left to finish in the background, still charged.
var stopGrace = 2 * time.Second

// charges is the memory charged to the work running in this process,
// abandoned work included.
var charges = struct {
	sync.Mutex
	held    int64
	count   int           // how many charges are held
	changed chan struct{} // closed (and replaced) whenever held falls
}{changed: make(chan struct{})}

// charge waits, under ctx, until bytes fit under limit beside what is held
// (limit < 0: no bound; 0: DefaultMaxMemory), then holds them until
// release is called. Work alone is never made to wait, whatever its
// estimate (a check over the bound refuses itself, with the numbers).
func charge(ctx context.Context, bytes, limit int64) (release func(), err error) {
	if limit == 0 {
		limit = DefaultMaxMemory()
	}
	if limit < 0 {
		return func() {}, nil
	}
	bytes = min(max(bytes, 0), limit)
	var waited time.Time
	for {
		charges.Lock()
		if charges.count == 0 || charges.held+bytes <= limit {
			charges.held += bytes
			charges.count++
			charges.Unlock()
			var once sync.Once
			return func() {
				once.Do(func() {
					charges.Lock()
					charges.held -= bytes
					charges.count--
					close(charges.changed)
					charges.changed = make(chan struct{})
					charges.Unlock()
				})
			}, nil
		}
		held, n, changed := charges.held, charges.count, charges.changed
		charges.Unlock()
		if waited.IsZero() {
			waited = time.Now()
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, fmt.Errorf("waited %v for memory: %s of the bound %s is still held by %d earlier check(s) past their deadline that have not stopped yet",
				time.Since(waited).Round(time.Millisecond), FormatBytes(held), FormatBytes(limit), n)
		}
	}
}

// heldBytes reports what is charged now (for tests).
func heldBytes() (bytes int64, count int) {
	charges.Lock()
	defer charges.Unlock()
	return charges.held, charges.count
}

// Charged runs fn, work that runs references in this process (a check;
// kcheck run's backends), with bytes, its estimated working set, charged
// against the memory bound limit (charge), on its own goroutine when ctx
// can be done. It returns fn's result, or finished = false when ctx was
// done and fn had not returned stopGrace later: fn then runs on, and its
// charge is released when it returns. An error means fn never started
// (ctx was done while it waited for memory held by earlier work).
func Charged[T any](ctx context.Context, bytes, limit int64, fn func() T) (res T, finished bool, err error) {
	release, err := charge(ctx, bytes, limit)
	if err != nil {
		return res, false, err
	}
	if ctx.Done() == nil {
		defer release()
		return fn(), true, nil
	}
	done := make(chan T, 1)
	go func() {
		defer release()
		done <- fn()
	}()
	select {
	case r := <-done:
		return r, true, nil
	case <-ctx.Done():
	}
	grace := time.NewTimer(stopGrace)
	defer grace.Stop()
	select {
	case r := <-done:
		return r, true, nil
	case <-grace.C:
		return res, false, nil
	}
}
