// Package progress shows a progress bar for long runs (many cases, long
// simulations) on a terminal, and nothing anywhere else: a bar written into
// a log file or a pipe is noise, so the bar appears only when its writer is
// a terminal and the user did not ask for --quiet.
package progress

import (
	"io"
	"os"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/schollz/progressbar/v3"
)

// Bar is a progress bar, or a no-op when there is no terminal to draw on.
// The zero value and a nil *Bar are no-ops too.
type Bar struct {
	bar *progressbar.ProgressBar
}

// New returns a bar counting to total on w (normally os.Stderr, so that
// stdout stays data). It draws nothing when quiet is set, when total < 2,
// or when w is not a terminal.
func New(total int, w io.Writer, quiet bool) *Bar {
	if quiet || total < 2 || !IsTerminal(w) {
		return &Bar{}
	}
	return &Bar{bar: progressbar.NewOptions(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetWidth(30),
		progressbar.OptionShowCount(),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish(),
		progressbar.OptionShowDescriptionAtLineEnd(),
	)}
}

// IsTerminal reports whether w is a terminal (a character device that the
// isatty check accepts, Cygwin's included).
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fd := f.Fd()
	return isatty.IsTerminal(fd) || isatty.IsCygwinTerminal(fd)
}

// Active reports whether the bar draws anything.
func (b *Bar) Active() bool { return b != nil && b.bar != nil }

// Describe sets the text beside the bar (the case being run).
func (b *Bar) Describe(s string) {
	if b.Active() {
		b.bar.Describe(s)
	}
}

// Add advances the bar by n.
func (b *Bar) Add(n int) {
	if b.Active() {
		_ = b.bar.Add(n) // a failed redraw is not worth stopping a run for
	}
}

// Clear erases the bar from its line, so that other output can be
// written there; the next Add draws it again.
func (b *Bar) Clear() {
	if b.Active() {
		_ = b.bar.Clear()
	}
}

// Finish completes and clears the bar.
func (b *Bar) Finish() {
	if b.Active() {
		_ = b.bar.Finish()
	}
}
