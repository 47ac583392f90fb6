package cli

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/backend"
	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/faults"
	_ "github.com/kcheck-dev/kcheck/internal/worker" // --backend exec:
)

// TestRunAheadKeepsTheCasesOrder: cases run side by side give their
// results in the cases' order, whichever finishes first, with never more
// than jobs running at once; once the context is done no case starts.
func TestRunAheadKeepsTheCasesOrder(t *testing.T) {
	sel := make([]cases.Case, 9)
	for i := range sel {
		sel[i].Name = fmt.Sprintf("case-%d", i)
	}
	for _, jobs := range []int{1, 2, 4} {
		var running, most atomic.Int32
		next := runAhead(context.Background(), sel, jobs, func(c cases.Case) check.Result {
			n := running.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			// the later cases finish first
			time.Sleep(time.Duration(len(sel)-int(c.Name[len(c.Name)-1]-'0')) * time.Millisecond)
			running.Add(-1)
			return check.Result{File: c.Name}
		})
		for _, c := range sel {
			if r := next(); r.File != c.Name {
				t.Fatalf("jobs %d: got %s where %s comes", jobs, r.File, c.Name)
			}
		}
		if m := most.Load(); m > int32(jobs) || jobs > 1 && m < 2 {
			t.Errorf("jobs %d: %d cases ran at once", jobs, m)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	var started atomic.Int32
	next := runAhead(ctx, sel, 1, func(c cases.Case) check.Result {
		started.Add(1)
		cancel()
		return check.Result{File: c.Name}
	})
	for range sel {
		next() // every read is answered, none blocks
	}
	if n := started.Load(); n != 1 {
		t.Errorf("%d cases started after the context was done in the first", n)
	}
}

// TestCaseJobs: the in-process backends run cases side by side, a device
// or a worker process one at a time, and so does any run that keeps its
// captures (--out).
func TestCaseJobs(t *testing.T) {
	f := faults.All()[0]
	worker, err := backend.Parse("exec:/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	gpu, err := backend.Parse("cuda")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		be   backend.Backend
		want bool
	}{
		{backend.Reference{}, true},
		{backend.Exact{}, true},
		{faults.Proving{Backend: faults.Backend{Fault: f}}, true},
		{backend.Swapped{Base: faults.Backend{Fault: f}, Stage: "attention"}, true},
		{backend.Only{Base: worker, Stage: "attention"}, false},
		{worker, false},
		{gpu, false},
	} {
		if got := backend.Concurrent(c.be); got != c.want {
			t.Errorf("%s: concurrent %v, want %v", c.be.Name(), got, c.want)
		}
		want := 1
		if c.want {
			want = min(runtime.GOMAXPROCS(0), 2)
		}
		if got := caseJobs(c.be, ""); got != want {
			t.Errorf("%s: %d jobs, want %d", c.be.Name(), got, want)
		}
		// kept captures are written as their cases run: one at a time
		if got := caseJobs(c.be, t.TempDir()); got != 1 {
			t.Errorf("%s with --out: %d jobs, want 1", c.be.Name(), got)
		}
	}
}
