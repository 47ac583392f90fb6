package npy

import (
	"archive/zip"
	"bytes"
	"testing"
)

// FuzzReadZip feeds the .npz reader arbitrary bytes, with and without a
// byte limit. It must never panic, what it accepts must be consistent
// tensors, and under a limit the accepted arrays must fit it (a deflated
// member can claim gigabytes from a few bytes). CI runs it for a short
// fixed time (make fuzz-short):
//
//	go test -run='^$' -fuzz='^FuzzReadZip$' -fuzztime=10m -parallel 1 ./internal/npy
func FuzzReadZip(f *testing.F) {
	for _, m := range []struct {
		name   string
		body   []byte
		method uint16
	}{
		{"x.npy", npyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", zeros(16)), zip.Deflate},
		{"y.npy", npyFile("{'descr': '<i8', 'fortran_order': True, 'shape': (3,), }", zeros(24)), zip.Store},
		{"big.npy", npyFile("{'descr': '<f8', 'fortran_order': False, 'shape': (4096,), }", zeros(4096*8)), zip.Deflate},
	} {
		var buf bytes.Buffer
		zw := zip.NewWriter(&buf)
		w, err := zw.CreateHeader(&zip.FileHeader{Name: m.name, Method: m.method})
		if err != nil {
			f.Fatal(err)
		}
		w.Write(m.body)
		zw.Close()
		f.Add(buf.Bytes(), int64(1024))
	}
	f.Fuzz(func(t *testing.T, b []byte, limit int64) {
		ts, err := readZip(bytes.NewReader(b), int64(len(b)), nil)
		if err == nil {
			for name, tn := range ts {
				if err := tn.Check(); err != nil {
					t.Fatalf("member %q: accepted an inconsistent tensor: %v", name, err)
				}
			}
		}
		if limit < 0 {
			limit = -limit
		}
		budget := limit % (1 << 20)
		start := budget
		ts, err = readZip(bytes.NewReader(b), int64(len(b)), &budget)
		if err != nil {
			return
		}
		total := int64(0)
		for _, tn := range ts {
			total += int64(len(tn.Data))
		}
		if total > start || budget != start-total {
			t.Fatalf("read %d bytes under a limit of %d (left %d)", total, start, budget)
		}
	})
}
