package check

import (
	"context"
	"fmt"
	"github.com/kcheck-dev/kcheck/internal/bounded"
	"sync"
	"time"
)

// Memory admission for work in flight.
//
// Every step of a check stops soon after its context is done (Run), so a
// check holds its memory only while it runs. Checks can still run side by
// side in one process (tests in parallel, a program checking several
// captures at once), and each is bounded alone: so each charges its estimated working set against the
// memory bound while it runs, and one that does not fit beside what is held
// waits, under its context, until it does.

// charges is the memory charged to the work running in this process.
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
			return nil, fmt.Errorf("waited %v for memory: %s of the bound %s is held by %d other check(s) running in this process",
				time.Since(waited).Round(time.Millisecond), bounded.FormatBytes(held), bounded.FormatBytes(limit), n)
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
// against the memory bound limit (charge) until fn returns. fn watches ctx
// itself. An error means fn never started: ctx was done while it waited
// for memory that other work held.
func Charged[T any](ctx context.Context, bytes, limit int64, fn func() T) (res T, err error) {
	release, err := charge(ctx, bytes, limit)
	if err != nil {
		return res, err
	}
	defer release()
	return fn(), nil
}
