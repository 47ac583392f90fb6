package sim

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kcheck-dev/kcheck/internal/backend"
)

// The simulation watched no context: the first SIGINT (or --timeout) left
// diagnose --simulate running to its end, a minute on the defaults
// (issue 11 item 8). It stops before its next kernel call once the
// context is done, and says why.
func TestSimulationStopsAtTheContext(t *testing.T) {
	s, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{"interrupted", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx, cancel
		}, context.Canceled},
		{"past its deadline", func() (context.Context, context.CancelFunc) {
			return context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		}, context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := tc.ctx()
			defer cancel()
			start := time.Now()
			_, err := s.Diagnose(ctx, backend.Reference{}, DiagnoseOptions{})
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("stopped after %v", d)
			}
		})
	}
}
