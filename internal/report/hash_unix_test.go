//go:build unix

package report

import (
	"context"
	"strings"
	"testing"
	"time"
)

// --report hashed /dev/zero for ever before it printed the verdict (issue
// 11 item 10): a stream is not hashed, and the evidence says why.
func TestHashFilesStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	ev, err := HashFilesContext(ctx, "/dev/zero")
	if err != nil {
		t.Fatal(err)
	}
	if len(ev) != 1 || ev[0].SHA256 != "" || !strings.HasPrefix(ev[0].NotHashed, "a stream") {
		t.Fatalf("evidence %+v, want /dev/zero not hashed, as a stream", ev)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %v", d)
	}
}
