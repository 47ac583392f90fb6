//go:build unix

package bounded

import (
	"io/fs"
	"os"
	"syscall"
	"time"
)

// releaseOpen ends an open of path still waiting in the background and
// returns its outcome. A FIFO's reader waits in open(2) until a writer
// opens it; opening the write end without blocking (which succeeds once a
// reader waits) lets it return, and closing it at once gives that reader
// an end of file. The opener may not be in open(2) yet, so this retries
// for a while; anything else is waited for.
func releaseOpen(path string, mode fs.FileMode, done <-chan opened) opened {
	if mode&fs.ModeNamedPipe != 0 {
		for try := 0; try < 200; try++ {
			select {
			case o := <-done:
				return o
			default:
			}
			if w, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				o := <-done
				w.Close()
				return o
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return <-done
}
