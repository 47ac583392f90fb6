package parallel

// Why Group exists: two things panic in a worker, a kcheck bug and a memory
// fault. A capture is read through a read-only mapping of its file
// (zero-copy), and when the file shrinks while it is checked (a re-capture
// into the same path: safetensors' save_file truncates it first) the pages
// past its new end raise SIGBUS, which Go turns into "fatal error: fault"
// and the end of the whole run unless the goroutine asked for a panic
// instead (debug.SetPanicOnFault). A panic is recovered only on its own
// goroutine, so every goroutine that may read a mapping asks for that panic
// and recovers it: Group does both, and Wait raises the first panic again
// on the caller's goroutine, where the check turns it into verdict error
// for that file (internal/check), and the run goes on.

import (
	"fmt"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
)

// Group is a set of worker goroutines (a sync.WaitGroup that carries
// panics). The zero Group is ready to use; a Group must not be copied.
type Group struct {
	wg     sync.WaitGroup
	once   sync.Once
	first  *Panic
	failed atomic.Bool
}

// Panic is a worker's panic as Wait raises it again: the value the worker
// panicked with and where.
type Panic struct {
	Value any
	// Site is the function and line that panicked (Site).
	Site string
}

func (p *Panic) Error() string { return fmt.Sprintf("%v (in a worker, at %s)", p.Value, p.Site) }

// Go runs fn on a new goroutine of the group, with panic-on-fault on: a
// fault reading a mapped file that shrank is a panic there, recovered and
// kept for Wait.
func (g *Group) Go(fn func()) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		debug.SetPanicOnFault(true)
		defer func() {
			if v := recover(); v != nil {
				p := &Panic{Value: v, Site: Site(3)}
				if inner, ok := v.(*Panic); ok { // a group inside a worker
					p = inner
				}
				g.once.Do(func() { g.first = p })
				g.failed.Store(true)
			}
		}()
		fn()
	}()
}

// Failed reports whether a worker has panicked, so that the others can
// stop taking work.
func (g *Group) Failed() bool { return g.failed.Load() }

// Wait waits for every goroutine of the group and then, if one panicked,
// panics with the first one's *Panic.
func (g *Group) Wait() {
	g.wg.Wait()
	if g.first != nil {
		panic(g.first)
	}
}

// Site names the first function outside the runtime on the stack of a
// deferred recover, skip frames up, with its file and line: where a panic
// was raised.
func Site(skip int) string {
	pc := make([]uintptr, 32)
	frames := runtime.CallersFrames(pc[:runtime.Callers(skip, pc)])
	for {
		f, more := frames.Next()
		if !strings.HasPrefix(f.Function, "runtime.") && f.Function != "" {
			return fmt.Sprintf("%s (%s:%d)", f.Function, filepath.Base(f.File), f.Line)
		}
		if !more {
			return "unknown"
		}
	}
}
