//go:build unix

package safetensors

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kcheck-dev/kcheck/internal/bounded"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Inputs whose size says nothing (issue 11 items 8 and 10): a symlink to
// /proc/self/pagemap (a 0-byte regular file holding terabytes), /dev/zero,
// and a named pipe nobody writes to. Each gives an error naming it, within
// the memory bound and the deadline.
func TestOpenContextBoundsStreams(t *testing.T) {
	dir := t.TempDir()
	pagemap := filepath.Join(dir, "pagemap.safetensors")
	if err := os.Symlink("/proc/self/pagemap", pagemap); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "pipe.safetensors")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path    string
		timeout time.Duration
		want    error
		says    string
	}{
		{pagemap, time.Minute, bounded.ErrTooLarge, "pagemap.safetensors: a stream of more than 16.0 MiB, the memory bound: refused (raise it with --max-memory)"},
		{"/dev/zero", time.Minute, bounded.ErrTooLarge, "/dev/zero: a stream of more than 16.0 MiB"},
		{fifo, 200 * time.Millisecond, bounded.ErrTimeout, "pipe.safetensors: timed out after"},
	} {
		t.Run(filepath.Base(tc.path), func(t *testing.T) {
			if _, err := os.Stat(tc.path); err != nil {
				t.Skip(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), tc.timeout)
			defer cancel()
			start := time.Now()
			f, err := OpenContext(ctx, tc.path, bounded.Memory(16<<20))
			if err == nil {
				f.Close()
				t.Fatal("opened")
			}
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("err = %v, want %v saying %q", err, tc.want, tc.says)
			}
			if d := time.Since(start); d > tc.timeout+10*time.Second {
				t.Errorf("took %v", d)
			}
		})
	}
}

// A capture arriving through a pipe is read and parsed, and what it takes
// is charged before its header is: a header that fits the bound on its
// own is refused when the stream has used the rest.
func TestOpenContextStream(t *testing.T) {
	var buf bytes.Buffer
	ts := map[string]*tensor.Tensor{"x": tensor.New(tensor.F32, 256, 256)} // 256 KiB of data
	if err := Encode(&buf, map[string]string{"k": "v"}, ts); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(t.TempDir(), "pipe.safetensors")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	feed := func() {
		go func() {
			if w, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
				w.Write(buf.Bytes())
				w.Close()
			}
		}()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	feed()
	f, err := OpenContext(ctx, fifo, bounded.Memory(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	if f.Metadata["k"] != "v" || len(f.Tensors["x"].Data) != 256*256*4 {
		t.Errorf("read %v, %d bytes of x", f.Metadata, len(f.Tensors["x"].Data))
	}
	f.Close()
	// The header (about 100 bytes) costs 6.4 KB to parse: within 270 KB,
	// not within what 270 KB leaves after the 262 KB stream.
	feed()
	_, err = OpenContext(ctx, fifo, bounded.Memory(int64(buf.Len())+1000))
	if !errors.Is(err, bounded.ErrTooLarge) || !strings.Contains(err.Error(), "header could take") {
		t.Fatalf("err = %v, want the header refused within what the stream left", err)
	}
}

// A file that shrinks between being mapped and its header being parsed
// (Open maps it by the size it had): the fault is the error ErrShrank,
// not the end of the process.
func TestParseMappedShrunk(t *testing.T) {
	var buf bytes.Buffer
	if err := Encode(&buf, map[string]string{"k": strings.Repeat("v", 3*os.Getpagesize())}, nil); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "c.safetensors")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	m, err := mmap(fh, buf.Len())
	fh.Close()
	if err != nil {
		t.Skipf("mmap: %v", err)
	}
	defer munmap(m)
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := parseMapped(m, bounded.Limit{}); !errors.Is(err, ErrShrank) {
		t.Fatalf("err = %v, want ErrShrank", err)
	}
}
