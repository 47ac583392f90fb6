package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kcheck-dev/kcheck/internal/bounded"
	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/printable"
	"github.com/spf13/pflag"
)

// Interrupts and resource bounds of the commands that loop over files or
// cases (check, run).
//
// SIGINT or SIGTERM cancels the command's context: the command stops before
// the next file or case (a reference running in-process stops between its
// units of work; opening and reading a file give up), prints on stderr what
// finished, writes no report, and exits 130 (128 + SIGINT, what a shell
// reports for an interrupted command). A capture being written when the
// signal arrives is finished first (files are written to a temporary name
// and renamed), so an interrupt never leaves half a file. Whatever does not
// stop by itself within interruptGrace of the first signal is not waited
// for: the process ends then, once a write in flight is done, so that the
// first signal always ends the run; a second signal kills it at once.

// ExitInterrupted is the status of a command stopped by SIGINT or SIGTERM.
const ExitInterrupted ExitCode = 130

// interruptGrace is how long a command has, after the first signal, to
// stop by itself.
const interruptGrace = 5 * time.Second

// notifyInterrupt returns a context canceled by the first SIGINT or
// SIGTERM, and a stop function to call when the command has returned.
// After that first signal the default handling is restored, so a second
// one ends the process even if something does not stop; and if the
// command has not returned interruptGrace later, the process exits 130
// (saying so on errw) without it.
func notifyInterrupt(parent context.Context, errw io.Writer) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	returned := make(chan struct{})
	go func() {
		var sig os.Signal
		select {
		case sig = <-sigs:
		case <-returned:
			return
		}
		signal.Stop(sigs)
		cancel()
		select {
		case <-returned:
			return
		case <-time.After(interruptGrace):
		}
		writeMu.Lock() // a write in flight finishes; none starts after this
		fmt.Fprintf(errw, "kcheck: interrupted (%v): exiting without waiting longer for the command to stop (%v after the signal)\n", sig, interruptGrace)
		os.Exit(int(ExitInterrupted))
	}()
	var once sync.Once
	return ctx, func() {
		once.Do(func() {
			close(returned)
			signal.Stop(sigs)
			cancel()
		})
	}
}

// writeMu is held while a command writes a file it was asked for (run
// --out). An interrupted command takes it before returning, so the process
// never exits halfway through a write; a writer checks the context under it
// and starts no new file once interrupted.
var writeMu sync.Mutex

// progressLog remembers what finished, for the message an interrupt prints.
type progressLog struct {
	total int
	done  []string
}

func (p *progressLog) add(name string, verdict compare.Verdict) {
	p.done = append(p.done, fmt.Sprintf("%s (%s)", printable.Escape(name), verdict))
}

// interrupted prints "interrupted after N of M; finished: ..." on stderr
// and returns the exit error (130).
func (p *progressLog) interrupted(s *IO, note string) error {
	writeMu.Lock() // let a write in flight finish; none starts after this
	defer writeMu.Unlock()
	list := p.done
	const show = 20
	more := ""
	if len(list) > show {
		more = fmt.Sprintf(" and %d more", len(list)-show)
		list = list[:show]
	}
	finished := "nothing"
	if len(list) > 0 {
		finished = strings.Join(list, ", ") + more
	}
	fmt.Fprintf(s.Err, "kcheck: interrupted after %d of %d; finished: %s\n", len(p.done), p.total, finished)
	if note != "" {
		fmt.Fprintln(s.Err, "kcheck:", printable.Escape(note))
	}
	return exitError{ExitInterrupted}
}

// stoppedError says why work started at started under ctx, a case's,
// stopped: the per-case time limit, or an interrupt.
func stoppedError(ctx context.Context, started time.Time) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%w after %v (the per-case time limit; raise it with --timeout)", check.ErrTimeout, time.Since(started).Round(time.Millisecond))
	}
	return fmt.Errorf("interrupted: %w", ctx.Err())
}

// bounds holds --max-memory.
type bounds struct {
	maxMemory string
}

func addMemoryFlag(f *pflag.FlagSet, b *bounds) {
	f.StringVar(&b.maxMemory, "max-memory", "",
		fmt.Sprintf("refuse a check whose reference would need more memory than this, estimated from the shapes before it runs (e.g. 8G, 512M; 0 or unlimited = no bound; default half the physical memory, at most 8 GiB: %s here)",
			bounded.FormatBytes(check.DefaultMaxMemory())))
}

// limit returns the bound in bytes for check.Options.MaxMemory.
func (b bounds) limit() (int64, error) {
	if b.maxMemory == "" {
		return 0, nil
	}
	v, err := check.ParseBytes(b.maxMemory)
	if err != nil {
		return 0, fmt.Errorf("--max-memory: %v", err)
	}
	return v, nil
}

// inputBounds are --max-memory and --timeout of the commands that only
// read results (report, merge): what they read is held in memory whole.
type inputBounds struct {
	memory  bounds
	timeout time.Duration
}

func (b *inputBounds) addFlags(f *pflag.FlagSet) {
	f.StringVar(&b.memory.maxMemory, "max-memory", "",
		fmt.Sprintf("refuse inputs of more bytes than this, all together (e.g. 8G, 512M; 0 or unlimited = no bound; default half the physical memory, at most 8 GiB: %s here)",
			bounded.FormatBytes(check.DefaultMaxMemory())))
	f.DurationVar(&b.timeout, "timeout", 10*time.Minute, "time limit for reading the inputs (0: none); a named pipe that has not delivered by then is an error")
}

// reading returns the context and the byte limit to read the inputs under.
func (b inputBounds) reading(ctx context.Context) (context.Context, bounded.Limit, context.CancelFunc, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	limit, err := b.memory.limit()
	if err != nil {
		return nil, bounded.Limit{}, nil, err
	}
	if limit == 0 {
		limit = check.DefaultMaxMemory()
	}
	ctx, cancel := fileContext(ctx, b.timeout)
	return ctx, bounded.Memory(limit), cancel, nil
}

// fileContext is the context of one file or case: ctx with the per-item
// timeout when there is one.
func fileContext(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if timeout > 0 {
		return context.WithTimeout(ctx, timeout)
	}
	return context.WithCancel(ctx)
}

// reportNote says, after an interrupt, that --report was not written.
func reportNote(dir string) string {
	if dir == "" {
		return ""
	}
	return "--report " + dir + " not written (interrupted: it would be partial)"
}
