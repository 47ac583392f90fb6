//go:build unix

package bounded

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func mkfifo(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "pipe.safetensors")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	return path
}

// A FIFO nobody writes to: open(2) would wait for ever. Open gives up at
// the deadline, says why, and releases the open it left waiting (nobody
// holds the read end afterwards, so a non-blocking writer finds no reader).
func TestOpenFIFOWithoutWriter(t *testing.T) {
	path := mkfifo(t)
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want error
		says string
	}{
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 100*time.Millisecond)
		}, ErrTimeout, "timed out after"},
		{"interrupt", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(100*time.Millisecond, cancel)
			return ctx, cancel
		}, context.Canceled, "interrupted waiting to open it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := tc.ctx()
			defer cancel()
			start := time.Now()
			f, err := Open(ctx, path)
			if err == nil {
				f.Close()
				t.Fatal("opened a FIFO that has no writer")
			}
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), "named pipe") {
				t.Fatalf("err = %v, want %v saying %q and naming the pipe", err, tc.want, tc.says)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("Open took %v after a 100 ms deadline", d)
			}
			released := false
			for i := 0; i < 300 && !released; i++ {
				w, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0)
				if err == nil {
					w.Close()
					time.Sleep(10 * time.Millisecond)
					continue
				}
				released = errors.Is(err, syscall.ENXIO) // no reader left waiting
			}
			if !released {
				t.Error("the abandoned open still holds the FIFO's read end")
			}
		})
	}
}

// A writer that opens the FIFO, writes a little and stalls: the read
// stops at the deadline instead of waiting for the rest.
func TestReadFIFOStalledWriter(t *testing.T) {
	path := mkfifo(t)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		w, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return
		}
		w.Write([]byte("partial"))
		<-stop
		w.Close()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	b, err := ReadFile(ctx, path, Memory(1<<20))
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "while reading it") {
		t.Fatalf("read %q, err = %v; want the deadline", b, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("ReadFile took %v after a 300 ms deadline", d)
	}
}

// A FIFO whose writer comes: read whole, as `kcheck check <(cmd)` needs.
func TestReadFIFOWithWriter(t *testing.T) {
	path := mkfifo(t)
	go func() {
		w, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
		w.Write([]byte("whole"))
		w.Close()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := ReadFile(ctx, path, Memory(1<<20))
	if err != nil || string(b) != "whole" {
		t.Fatalf("got %q, %v", b, err)
	}
}

// Endless or size-less inputs: /dev/zero, and /proc/self/pagemap, which
// stats as a 0-byte regular file and holds 8 bytes per page of the
// address space (terabytes). Both are streams, read no further than the
// limit.
func TestStreamsAreBounded(t *testing.T) {
	for _, path := range []string{"/dev/zero", "/proc/self/pagemap"} {
		t.Run(path, func(t *testing.T) {
			f, err := Open(context.Background(), path)
			if err != nil {
				t.Skipf("%v", err)
			}
			defer f.Close()
			if !f.Stream() {
				t.Errorf("%s is not read as a stream", path)
			}
			b, err := ReadAll(f, path, Memory(1<<20))
			if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), path+": a stream of more than 1.0 MiB") {
				t.Fatalf("read %d bytes, err = %v; want the 1 MiB refusal", len(b), err)
			}
		})
	}
}

// Reading /dev/zero, which never blocks, stops at a deadline all the same
// (into one reused buffer: only the deadline ends it).
func TestDeviceReadHonoursDeadline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	f, err := Open(ctx, "/dev/zero")
	if err != nil {
		t.Skipf("%v", err)
	}
	defer f.Close()
	buf := make([]byte, 1<<16)
	start := time.Now()
	for time.Since(start) < 10*time.Second {
		if _, err = f.Read(buf); err != nil {
			break
		}
	}
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v; want the deadline", err)
	}
}
