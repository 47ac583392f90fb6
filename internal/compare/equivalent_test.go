package compare

import (
	"bytes"
	"encoding/json"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// TestConcurrentEquivalenceRule: a rule declared EquivalentConcurrent is
// asked from several goroutines at once, and the check is the same bytes
// as a rule asked from one. The rule's first call in the first chunk
// waits until a call in the second chunk has begun: on one goroutine
// that never comes (the wait gives up after a minute and the test fails),
// on the comparison's forks it comes at once.
func TestConcurrentEquivalenceRule(t *testing.T) {
	n := 4 * parallelChunk
	exact := make([]float64, n)
	actual := tensor.New(tensor.F32, n/64, 64)
	for i := range exact {
		exact[i] = float64(i%97) - 48
		a := exact[i]
		if i%7 == 0 {
			a += 1 // far over any tolerance: the rule decides
		}
		actual.SetFloat64(i, a)
	}
	pure := func(i int, a float64) bool { return i%14 == 0 }
	check := func(o kernel.Output, procs int) []byte {
		t.Helper()
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
		c, err := Compare(o, actual, nil, Options{WorstK: 5})
		if err != nil {
			t.Fatal(err)
		}
		if c.Metrics.Excused == 0 || c.Metrics.OverTol == 0 {
			t.Fatalf("the case lacks excused (%d) or failing (%d) elements", c.Metrics.Excused, c.Metrics.OverTol)
		}
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	o := kernel.Output{Name: "y", Shape: []int{n / 64, 64}, Reduction: 1, Mode: kernel.Bitwise,
		Exact: kernel.Dense(exact), Expected: kernel.Dense(exact), Equivalent: pure}
	want := check(o, 1)

	secondBegun := make(chan struct{})
	var once sync.Once
	asked, waited := false, false // about element 0, the first time
	o.EquivalentConcurrent = true
	o.Equivalent = func(i int, a float64) bool {
		switch {
		case i == 0 && !asked:
			asked = true
			select {
			case <-secondBegun:
				waited = true
			case <-time.After(time.Minute):
			}
		case i >= parallelChunk && i < 2*parallelChunk:
			once.Do(func() { close(secondBegun) })
		}
		return pure(i, a)
	}
	got := check(o, 2)
	if !waited {
		t.Fatal("the rule was not asked about the second chunk while it was asked about the first: it ran on one goroutine")
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("the check with the rule asked on every core differs from the one asked on one:\n%s\n%s", got, want)
	}
}
