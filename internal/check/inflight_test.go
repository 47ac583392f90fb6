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
	if err == nil || !strings.Contains(err.Error(), "600 B of the bound 1000 B is still held by 1 earlier check") {
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

// Work that does not stop at its deadline is left running, still charged:
// the next work waits for its memory (and the deadline it waited under is
// named), and runs once the first has returned.
func TestChargedWorkThatDoesNotStop(t *testing.T) {
	defer func(g time.Duration) { stopGrace = g }(stopGrace)
	stopGrace = 10 * time.Millisecond
	const limit = 1000
	unblock := make(chan struct{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	_, finished, err := Charged(ctx, 800, limit, func() int { <-unblock; return 1 }) // watches no context
	if err != nil || finished {
		t.Fatalf("finished %v, err %v: want it left running", finished, err)
	}
	if held, n := heldBytes(); held != 800 || n != 1 {
		t.Fatalf("held %d bytes in %d charges, want the 800 of the work left running", held, n)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel2()
	if _, _, err := Charged(ctx2, 800, limit, func() int { return 2 }); err == nil || !strings.Contains(err.Error(), "800 B of the bound 1000 B") {
		t.Fatalf("err = %v, want a wait for the memory still held", err)
	}
	close(unblock)
	r, finished, err := Charged(context.Background(), 800, limit, func() int { return 3 })
	if err != nil || !finished || r != 3 {
		t.Fatalf("after the first returned: %d, %v, %v", r, finished, err)
	}
	if held, n := heldBytes(); held != 0 || n != 0 {
		t.Fatalf("held %d bytes in %d charges at the end", held, n)
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
		res := RunContext(ctx, c, Options{})
		cancel()
		if res.Verdict != Error || res.Error == nil || !strings.Contains(*res.Error, "timed out") {
			t.Fatalf("check %d: verdict %s, error %v: want a timeout", i, res.Verdict, res.Error)
		}
	}
	// A check past its deadline is waited for stopGrace, then left to stop
	// at its next unit of work, still charged. On a loaded machine (and
	// under -race) a unit can outlast stopGrace, so what is asserted is that
	// every one does stop and let go, within a bound far above a unit.
	waitUncharged(t, 60*time.Second)
	if n := runtime.NumGoroutine(); n > goroutines+2 {
		t.Errorf("%d goroutines, %d before: timed-out checks are still running", n, goroutines)
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grown := int64(after.HeapAlloc) - int64(before.HeapAlloc); grown > 32<<20 {
		t.Errorf("the live heap grew by %d MiB over four timed-out checks: they hold their memory", grown>>20)
	}
}

// waitUncharged fails t unless every charge is released within bound. A
// check past its deadline returns after at most stopGrace and its work
// stops at its next unit, still charged until then; on a loaded machine
// (and under -race) a unit can outlast stopGrace, so tests wait for the
// work to let go, with a bound far above one unit, instead of assuming it
// already has.
func waitUncharged(t *testing.T, bound time.Duration) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		held, n := heldBytes()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v after the deadline: %d checks still charged (%d bytes): their work never stopped", bound, n, held)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
