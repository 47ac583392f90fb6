package parallel

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// Every unit runs exactly once, whatever the number of workers.
func TestRunEveryUnitOnce(t *testing.T) {
	for _, workers := range []int{0, 1, 3, 64} {
		for _, n := range []int{0, 1, 7, 1000} {
			counts := make([]atomic.Int32, n)
			made := atomic.Int32{}
			err := Run(context.Background(), n, workers, func() func(int) {
				made.Add(1)
				return func(u int) { counts[u].Add(1) }
			})
			if err != nil {
				t.Fatalf("workers %d, n %d: %v", workers, n, err)
			}
			for u := range counts {
				if c := counts[u].Load(); c != 1 {
					t.Fatalf("workers %d, n %d: unit %d ran %d times", workers, n, u, c)
				}
			}
			if workers > 0 && int(made.Load()) > workers {
				t.Errorf("workers %d, n %d: %d workers made", workers, n, made.Load())
			}
		}
	}
}

// Once the context is done no unit starts: a deadline in the middle of a
// long run stops it within the units in flight, and says why.
func TestRunStopsAtTheDeadline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	var ran atomic.Int64
	start := time.Now()
	err := Each(ctx, 1_000_000, func(int) {
		ran.Add(1)
		time.Sleep(time.Millisecond)
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the deadline", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("returned after %v, want soon after the 20ms deadline", took)
	}
	if n := ran.Load(); n >= 1_000_000 {
		t.Errorf("all %d units ran", n)
	}
	// Canceled before it starts: nothing runs.
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	ran.Store(0)
	if err := Each(ctx, 10, func(int) { ran.Add(1) }); !errors.Is(err, context.Canceled) || ran.Load() != 0 {
		t.Errorf("canceled: err %v, %d units ran", err, ran.Load())
	}
}
