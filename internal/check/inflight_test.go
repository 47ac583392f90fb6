package check

import (
	"context"
	"github.com/kcheck-dev/kcheck/internal/evidence"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Charges: work that fits runs at once; work that does not fit beside what
// is held waits until it is released, or until its context is done (then
// saying what holds the memory); work alone never waits, whatever its
// estimate; no bound, no waiting.
func TestCharges(t *testing.T) {
	const limit = 1000
	release, err := charge(context.Background(), 600, limit)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := charge(context.Background(), 400, limit); err != nil { // fits beside it
		t.Fatal(err)
	} else {
		r()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	_, err = charge(ctx, 500, limit)
	cancel()
	if err == nil || !strings.Contains(err.Error(), "600 B of the bound 1000 B is held by 1 other check") {
		t.Fatalf("err = %v, want a wait that names the memory held", err)
	}
	got := make(chan error, 1)
	go func() {
		r, err := charge(context.Background(), 500, limit)
		if err == nil {
			r()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("charged beside 600 of 1000 held: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	release()
	release() // twice: once counts
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if held, n := heldBytes(); held != 0 || n != 0 {
		t.Fatalf("held %d bytes in %d charges after every release", held, n)
	}
	for _, lim := range []int64{limit, -1} {
		r, err := charge(context.Background(), 1<<40, lim) // alone: never waits
		if err != nil {
			t.Fatal(err)
		}
		r2, err := charge(context.Background(), 1<<40, -1) // no bound: never waits
		if err != nil {
			t.Fatal(err)
		}
		r2()
		r()
	}
}

// Charged holds its charge while fn runs and releases it when fn returns;
// work that does not fit beside what is held waits, and gives up when its
// context is done before it fits, without running.
func TestCharged(t *testing.T) {
	const limit = 1000
	r, err := Charged(context.Background(), 800, limit, func() int {
		if held, n := heldBytes(); held != 800 || n != 1 {
			t.Errorf("held %d bytes in %d charges while fn runs, want 800 in 1", held, n)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		ran := false
		if _, err := Charged(ctx, 800, limit, func() int { ran = true; return 2 }); err == nil || !strings.Contains(err.Error(), "800 B of the bound 1000 B") || ran {
			t.Errorf("beside 800 held: err = %v, ran %v: want a wait for the memory held, and no run", err, ran)
		}
		return 1
	})
	if err != nil || r != 1 {
		t.Fatalf("Charged = %d, %v", r, err)
	}
	if held, n := heldBytes(); held != 0 || n != 0 {
		t.Fatalf("held %d bytes in %d charges after fn returned", held, n)
	}
}

// gemmCapture is an nvfp4_gemm capture of random codes, [m, k] by [n, k],
// with a placeholder output: a check whose reference (about m·n·k
// multiply-adds) runs long, holding a's and b's block values and both
// m·n answers.
func gemmCapture(m, n, k int) evidence.Capture {
	r := rand.New(rand.NewPCG(uint64(m), uint64(n)))
	mat := func(rows int) (*tensor.Tensor, *tensor.Tensor) {
		p := tensor.New(tensor.U8, rows, k/2)
		for i := range p.Data {
			p.Data[i] = byte(r.Uint32())
		}
		s := tensor.New(tensor.F8E4M3, rows, k/16)
		for i := range s.Data {
			s.Data[i] = byte(0x30 + r.IntN(16))
		}
		return p, s
	}
	ap, as := mat(m)
	bp, bs := mat(n)
	one := tensor.FromFloat64s(tensor.F32, []int{}, []float64{1})
	return evidence.Capture{Name: "gemm", Metadata: map[string]string{"kcheck.format": "1", "kcheck.kernel": "nvfp4_gemm"},
		Tensors: map[string]*tensor.Tensor{"a_packed": ap, "a_scale": as, "a_global": one, "b_packed": bp, "b_scale": bs, "b_global": one,
			"out": tensor.New(tensor.BF16, 1, 1)}}
}

// Timed-out checks do not pile up (issue 11 item 9): after four checks of
// about 1.7e10 multiply-adds each, every one past a 50ms deadline, nothing
// of theirs is still running or still holds memory. Before the references
// stopped at a deadline, each went on in the background holding its
// working set (here about 100 MB of live heap a check; 40 checks of a
// file estimated at 3.6 GiB once reached 14 GB of RSS).
func TestTimedOutChecksHoldNothing(t *testing.T) {
	c := gemmCapture(2048, 2048, 2048)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	goroutines := runtime.NumGoroutine()
	for i := 0; i < 4; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		res := Run(ctx, c, Options{})
		cancel()
		if res.Verdict != Error || res.Error == nil || !strings.Contains(*res.Error, "timed out") {
			t.Fatalf("check %d: verdict %s, error %v: want a timeout", i, res.Verdict, res.Error)
		}
	}
	// Run returns once its work has stopped: nothing is charged, and no
	// goroutine of the checks is left (the workers of reference/parallel
	// exit as they return, so only a moment's settling is allowed).
	if held, n := heldBytes(); held != 0 || n != 0 {
		t.Errorf("%d bytes in %d charges held after the checks returned", held, n)
	}
	settleGoroutines(t, goroutines)
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grown := int64(after.HeapAlloc) - int64(before.HeapAlloc); grown > 32<<20 {
		t.Errorf("the live heap grew by %d MiB over four timed-out checks: they hold their memory", grown>>20)
	}
}
