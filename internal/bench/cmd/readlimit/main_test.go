package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadsEveryByte: readlimit prints each file's size and the sum of all
// of its bytes (a file of a length that is no multiple of 8, so the tail
// counts), and names a file it cannot read.
func TestReadsEveryByte(t *testing.T) {
	dir := t.TempDir()
	var paths []string
	var want []result
	for i, n := range []int{0, 5, 1<<16 + 3} {
		b := make([]byte, n)
		var sum uint64
		for j := range b {
			b[j] = byte(j*31 + i + 1)
			sum += uint64(b[j])
		}
		p := filepath.Join(dir, string(rune('a'+i)))
		os.WriteFile(p, b, 0o644)
		paths = append(paths, p)
		want = append(want, result{File: p, Bytes: int64(n), Sum: sum})
	}
	var out, errb bytes.Buffer
	if code := run(paths, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	dec := json.NewDecoder(&out)
	for _, w := range want {
		var r result
		if err := dec.Decode(&r); err != nil {
			t.Fatal(err)
		}
		if r.File != w.File || r.Bytes != w.Bytes || r.Sum != w.Sum {
			t.Errorf("readlimit printed %+v, want %+v", r, w)
		}
	}
	missing := filepath.Join(dir, "missing")
	errb.Reset()
	if code := run([]string{missing}, &out, &errb); code != 1 || !strings.Contains(errb.String(), missing) {
		t.Errorf("missing file: exit %d, %q", code, errb.String())
	}
	if code := run(nil, &out, &errb); code != 2 {
		t.Errorf("no files: exit %d", code)
	}
}
