//go:build cudaemu

package cuda

import (
	"errors"
	"testing"
)

// The first failed allocation or upload sticks: the later ones do nothing,
// and finish reports it before launching anything.
func TestBuffersStickyError(t *testing.T) {
	var b buffers
	defer b.free()
	if p := b.upload([]byte{1, 2, 3}); p == 0 || b.err != nil {
		t.Fatalf("upload: %v, %v", p, b.err)
	}
	first := errors.New("cuMemAlloc(64): out of memory")
	b.err = first
	if p := b.upload([]byte{4}); p != 0 {
		t.Errorf("an upload after a failure returned %v, want nothing", p)
	}
	if p := b.alloc(8); p != 0 || b.zeros(8) != 0 {
		t.Error("an allocation after a failure returned a buffer")
	}
	if len(b.a.ptrs) != 1 {
		t.Errorf("%d buffers held, want the 1 made before the failure", len(b.a.ptrs))
	}
	var d Device
	if _, err := d.finish(&b, nil, []launch{{fn: "never"}}, RunOptions{}, nil); err != first {
		t.Errorf("finish: %v, want the first failure %v", err, first)
	}
}
