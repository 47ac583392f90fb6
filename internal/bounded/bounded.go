// Package bounded is how kcheck reads every input it is given, files and
// streams alike, within a byte bound and a deadline.
//
// A path on a command line can name anything: a capture of a few
// gigabytes, a named pipe whose writer never comes (open(2) waits for one
// for ever), /dev/zero (endless), a file in /proc that stats as 0 bytes
// and holds gigabytes (/proc/self/pagemap), or a JSON string that never
// ends. Each of these once hung kcheck past --timeout and past SIGINT, or
// grew it until the kernel killed it. So every reader here
//
//   - opens under a context: a file that is not regular (a FIFO, a device)
//     is opened in the background and given up on when the context is done,
//     and a FIFO's pending open is released by opening its write end;
//   - reads under the same context: a read that blocks (a pipe whose writer
//     stalls) is woken by a deadline when the context is done, and no read
//     starts after it;
//   - holds at most a Limit's bytes, refusing the input, with its name and
//     the limit, once more arrive.
//
// Regular files of known size are read or mapped by their readers as they
// see fit; what this package gives them is Open's deadline and the File's
// facts (Stream says whether its size can be trusted).
package bounded

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"time"
)

// Limit bounds how many bytes of one input may be held in memory.
type Limit struct {
	// Bytes is the most that may be read; 0 or less means no bound.
	Bytes int64
	// What names the limit in a refusal ("the memory bound").
	What string
	// Raise says how to lift it ("raise it with --max-memory"); empty for
	// a fixed limit.
	Raise string
	// Whole is the limit before Less took from it (0: nothing taken).
	Whole int64
}

// Memory is the limit --max-memory sets (bytes <= 0: none).
func Memory(bytes int64) Limit {
	return Limit{Bytes: bytes, What: "the memory bound", Raise: "raise it with --max-memory"}
}

// Less returns the limit with n bytes fewer (at least one byte remains, so
// a spent limit still refuses rather than turning into no bound).
func (l Limit) Less(n int64) Limit {
	if l.Bytes > 0 {
		if l.Whole == 0 {
			l.Whole = l.Bytes
		}
		l.Bytes = max(l.Bytes-max(n, 0), 1)
	}
	return l
}

// bound names the limit in a refusal: "the memory bound" or, once Less
// took from it, "what is left of the memory bound 16.0 MiB".
func (l Limit) bound() string {
	if l.Whole > l.Bytes {
		return fmt.Sprintf("what is left of %s %s", l.What, FormatBytes(l.Whole))
	}
	return l.What
}

// Refuse is the refusal of an input whose cost, as its reader measures it
// (what is said in cost), exceeds the limit: it wraps ErrTooLarge.
func (l Limit) Refuse(cost string) error {
	msg := fmt.Sprintf("%s, more than %s (%s): refused", cost, l.bound(), FormatBytes(l.Bytes))
	if l.Raise != "" {
		msg += " (" + l.Raise + ")"
	}
	return refusal(msg)
}

type refusal string

func (r refusal) Error() string { return string(r) }
func (r refusal) Unwrap() error { return ErrTooLarge }

// ErrTooLarge is wrapped by the refusal of an input over its Limit.
var ErrTooLarge = errors.New("over its read limit")

// ErrTimeout is wrapped by the error of an open or a read stopped by the
// context's deadline.
var ErrTimeout = errors.New("timed out")

// TooLargeError is the refusal of an input over its limit.
type TooLargeError struct {
	Name   string // the input
	Stream bool   // read as a stream (its size says nothing)
	Limit  Limit
}

func (e *TooLargeError) Error() string {
	kind := "a file"
	if e.Stream {
		kind = "a stream"
	}
	msg := fmt.Sprintf("%s: %s of more than %s, %s: refused", e.Name, kind, FormatBytes(e.Limit.Bytes), e.Limit.bound())
	if e.Limit.Raise != "" {
		msg += " (" + e.Limit.Raise + ")"
	}
	return msg
}

func (e *TooLargeError) Unwrap() error { return ErrTooLarge }

// File is an input opened by Open: reads honour the context and a File
// knows whether its size can be trusted.
type File struct {
	f       *os.File
	name    string
	info    fs.FileInfo
	ctx     context.Context
	started time.Time
	stop    func() bool // unregisters the wake-up on ctx
}

// Open opens path for reading under ctx. A regular file opens at once;
// anything else (a FIFO waits in open(2) for a writer, a device may wait
// too) is opened in the background, and Open gives up when ctx is done,
// with an error that says so (wrapping ErrTimeout or context.Canceled).
func Open(ctx context.Context, path string) (*File, error) {
	started := time.Now()
	if err := ctx.Err(); err != nil {
		return nil, contextError(ctx, path, "before opening it", started)
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	var f *os.File
	if st.Mode().IsRegular() || st.IsDir() {
		if f, err = os.Open(path); err != nil {
			return nil, err
		}
	} else if f, err = openInBackground(ctx, path, st.Mode()); err != nil {
		if ctx.Err() != nil {
			return nil, contextError(ctx, path, "waiting to open it ("+waitReason(st.Mode())+")", started)
		}
		return nil, err
	}
	if st, err = f.Stat(); err != nil { // what was opened, not what was named
		f.Close()
		return nil, err
	}
	bf := &File{f: f, name: path, info: st, ctx: ctx, started: started, stop: func() bool { return false }}
	if ctx.Done() != nil {
		// A read blocked on a pipe or a terminal wakes when the deadline
		// passes; files that cannot be polled (regular files, /dev/zero)
		// never block long, and Read checks ctx before each read.
		bf.stop = context.AfterFunc(ctx, func() { f.SetReadDeadline(time.Now()) })
	}
	return bf, nil
}

// waitReason says why opening a file of mode m can wait.
func waitReason(m fs.FileMode) string {
	if m&fs.ModeNamedPipe != 0 {
		return "a named pipe opens only once a writer opens it too"
	}
	return "it is not a regular file"
}

// opened is the outcome of a background open.
type opened struct {
	f   *os.File
	err error
}

// openInBackground opens path in a goroutine and returns when it is open
// or ctx is done. A FIFO left waiting is then released (releaseOpen) and
// what it opened is closed, so no goroutine or descriptor outlives the
// wait; an open of anything else that never returns leaves one goroutine
// blocked in the kernel (nothing can stop it), not the command.
func openInBackground(ctx context.Context, path string, mode fs.FileMode) (*os.File, error) {
	done := make(chan opened, 1)
	go func() {
		f, err := os.Open(path)
		done <- opened{f, err}
	}()
	select {
	case o := <-done:
		return o.f, o.err
	case <-ctx.Done():
		go func() {
			if o := releaseOpen(path, mode, done); o.f != nil {
				o.f.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// contextError says that ctx stopped what was being done to path.
func contextError(ctx context.Context, path, doing string, started time.Time) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w after %v %s", path, ErrTimeout, time.Since(started).Round(time.Millisecond), doing)
	}
	return fmt.Errorf("%s: interrupted %s: %w", path, doing, context.Canceled)
}

// Name is the path the file was opened by.
func (f *File) Name() string { return f.name }

// Info is what the opened file's fstat says.
func (f *File) Info() fs.FileInfo { return f.info }

// Stream reports whether the file's size says nothing about what it
// holds: a pipe, a device, or a file that stats as 0 bytes (the files of
// /proc do, whatever they hold). Such a file is read to its end, within a
// Limit; a regular file of known size may be mapped or read by its size.
func (f *File) Stream() bool { return !f.info.Mode().IsRegular() || f.info.Size() == 0 }

// OS is the underlying file, for mapping a regular file; reads must go
// through the File.
func (f *File) OS() *os.File { return f.f }

// Read reads from the file; once the context is done it returns an error
// that says so (wrapping ErrTimeout or context.Canceled).
func (f *File) Read(p []byte) (int, error) {
	if f.ctx.Err() != nil {
		return 0, contextError(f.ctx, f.name, "while reading it", f.started)
	}
	n, err := f.f.Read(p)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) && f.ctx.Err() != nil {
		return n, contextError(f.ctx, f.name, "while reading it", f.started)
	}
	return n, err
}

// ReadAt reads at off (a regular file: a zip archive's directory), under
// the context as Read is.
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	if f.ctx.Err() != nil {
		return 0, contextError(f.ctx, f.name, "while reading it", f.started)
	}
	return f.f.ReadAt(p, off)
}

// Close closes the file.
func (f *File) Close() error {
	f.stop()
	return f.f.Close()
}

// ReadAll reads r to its end, refusing (with a TooLargeError naming name
// and the limit) once more than limit bytes arrive: at most limit+16 bytes
// are ever held. A *File tells whether it is read as a stream.
func ReadAll(r io.Reader, name string, limit Limit) ([]byte, error) {
	stream := true
	if f, ok := r.(*File); ok {
		stream = f.Stream()
	}
	if limit.Bytes <= 0 {
		return io.ReadAll(r)
	}
	// Reading past the limit tells an input that ends at it from one that
	// goes on; by a multiple of 8 bytes, because some files take only
	// whole entries (/proc/self/pagemap's are 8 bytes).
	b, err := io.ReadAll(io.LimitReader(r, limit.Bytes-limit.Bytes%8+16))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit.Bytes {
		return nil, &TooLargeError{Name: name, Stream: stream, Limit: limit}
	}
	return b, nil
}

// ReadFile opens path under ctx and reads it whole within limit.
func ReadFile(ctx context.Context, path string, limit Limit) ([]byte, error) {
	f, err := Open(ctx, path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if f.Info().IsDir() {
		return nil, fmt.Errorf("%s: is a directory", path)
	}
	return ReadAll(f, path, limit)
}

// Reader is r refusing (with a TooLargeError) the read that would take it
// past limit, for decoders that consume a stream as it arrives (a JSON
// decoder buffers a whole value, however long). Count says how much it
// has passed on, to charge against what follows.
func Reader(r io.Reader, name string, limit Limit) *LimitedReader {
	stream := true
	if f, ok := r.(*File); ok {
		stream = f.Stream()
	}
	return &LimitedReader{r: r, limit: limit, err: &TooLargeError{Name: name, Stream: stream, Limit: limit}}
}

// LimitedReader is what Reader returns.
type LimitedReader struct {
	r     io.Reader
	limit Limit
	n     int64 // bytes read from r
	err   error
}

func (l *LimitedReader) Read(p []byte) (int, error) {
	if l.limit.Bytes <= 0 {
		n, err := l.r.Read(p)
		l.n += int64(n)
		return n, err
	}
	left := l.limit.Bytes - l.n
	if left < 0 {
		return 0, l.err
	}
	// One byte past the limit tells an input that ends exactly at it from
	// one that goes on.
	if int64(len(p)) > left+1 {
		p = p[:left+1]
	}
	n, err := l.r.Read(p)
	l.n += int64(n)
	if l.n > l.limit.Bytes {
		return n - 1, l.err
	}
	return n, err
}

// Count is how many bytes have been read (one more than the limit at most).
func (l *LimitedReader) Count() int64 { return l.n }

// sat is where FormatBytes stops counting: sizes estimated from untrusted
// shapes saturate there (internal/check).
const sat = math.MaxInt64 / 4

// FormatBytes writes n in binary units, as refusals print it.
func FormatBytes(n int64) string {
	switch {
	case n >= sat:
		return "more than 2^61 B"
	case n >= 1<<40:
		return fmt.Sprintf("%.1f TiB", float64(n)/(1<<40))
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
