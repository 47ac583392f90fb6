package bounded

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadAllLimit(t *testing.T) {
	tests := []struct {
		name    string
		size    int
		limit   int64
		refused bool
	}{
		{"under the limit", 99, 100, false},
		{"exactly the limit", 100, 100, false},
		{"one byte over", 101, 100, true},
		{"far over", 1 << 20, 100, true},
		{"no limit", 1 << 20, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := bytes.Repeat([]byte{'x'}, tc.size)
			b, err := ReadAll(bytes.NewReader(in), "in.json", Memory(tc.limit))
			if tc.refused {
				var tl *TooLargeError
				if !errors.As(err, &tl) || !errors.Is(err, ErrTooLarge) {
					t.Fatalf("err = %v, want a TooLargeError", err)
				}
				if want := "in.json: a stream of more than 100 B, the memory bound: refused (raise it with --max-memory)"; err.Error() != want {
					t.Errorf("err = %q, want %q", err, want)
				}
				return
			}
			if err != nil || !bytes.Equal(b, in) {
				t.Fatalf("read %d bytes, %v; want all %d", len(b), err, tc.size)
			}
		})
	}
}

// A reader that never ends is refused after the limit, having handed a
// decoder no more than limit bytes.
func TestReaderEndlessJSONString(t *testing.T) {
	endless := io.MultiReader(strings.NewReader(`"`), repeatReader('a'))
	var counted countingReader
	counted.r = endless
	dec := json.NewDecoder(Reader(&counted, "shard.json", Limit{Bytes: 1 << 20, What: "the memory bound"}))
	var v any
	err := dec.Decode(&v)
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "shard.json: a stream of more than 1.0 MiB") {
		t.Fatalf("err = %v, want the 1 MiB refusal", err)
	}
	if counted.n > 1<<20+1<<16 {
		t.Errorf("read %d bytes of an endless stream under a 1 MiB limit", counted.n)
	}
}

func TestReaderExactlyAtLimit(t *testing.T) {
	b, err := io.ReadAll(Reader(strings.NewReader("0123456789"), "x", Memory(10)))
	if err != nil || string(b) != "0123456789" {
		t.Fatalf("got %q, %v", b, err)
	}
	b, err = io.ReadAll(Reader(strings.NewReader("0123456789!"), "x", Memory(10)))
	if !errors.Is(err, ErrTooLarge) || string(b) != "0123456789" {
		t.Fatalf("got %q, %v; want 10 bytes and the refusal", b, err)
	}
}

func TestReadFileRegular(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.json")
	if err := os.WriteFile(path, []byte(`{"cases":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := ReadFile(context.Background(), path, Limit{Bytes: 5, What: "the 5-byte limit of case files"})
	if want := path + ": a file of more than 5 B, the 5-byte limit of case files: refused"; err == nil || err.Error() != want {
		t.Fatalf("err = %v, want %q", err, want)
	}
	if b, err = ReadFile(context.Background(), path, Memory(1<<10)); err != nil || string(b) != `{"cases":[]}` {
		t.Fatalf("got %q, %v", b, err)
	}
	if _, err := ReadFile(context.Background(), filepath.Dir(path), Memory(0)); err == nil || !strings.Contains(err.Error(), "is a directory") {
		t.Errorf("reading a directory: %v", err)
	}
}

func TestOpenAfterDeadline(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Open(ctx, "/nonexistent")
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "interrupted before opening it") {
		t.Fatalf("err = %v", err)
	}
}

func TestLimitLess(t *testing.T) {
	if got := Memory(100).Less(30).Bytes; got != 70 {
		t.Errorf("100 less 30 = %d", got)
	}
	if got := Memory(100).Less(300).Bytes; got != 1 {
		t.Errorf("100 less 300 = %d, want 1 (still a bound)", got)
	}
	if got := Memory(0).Less(300).Bytes; got != 0 {
		t.Errorf("no bound less 300 = %d, want no bound", got)
	}
	_, err := ReadAll(strings.NewReader("0123456789"), "b.json", Memory(100).Less(95))
	if want := "b.json: a stream of more than 5 B, what is left of the memory bound 100 B: refused (raise it with --max-memory)"; err == nil || err.Error() != want {
		t.Errorf("err = %v, want %q", err, want)
	}
}

type repeatReader byte

func (r repeatReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(r)
	}
	return len(p), nil
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}
