package check

import (
	"github.com/kcheck-dev/kcheck/internal/evidence"
	"path/filepath"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/kernel"
)

// FuzzKernel runs check.Run on captures of every kernel mutated by the
// fuzzer (mutate_fuzz_test.go): random shapes, dtypes, payloads of NaN,
// Inf, subnormal and max-magnitude values in every dtype, indices out of
// range, random metadata parameters, missing tensors, the wrong kernel. The
// check must return a verdict (an error naming the problem for unusable
// input), never panic, never hang, never allocate far beyond its memory
// estimate, and never write into its inputs. CI runs it for a short fixed
// time (make fuzz-short):
//
//	go test -run='^$' -fuzz='^FuzzKernel$' -fuzztime=10m -parallel 1 ./internal/check
//
// The first byte picks the golden fixture; the rest is a mutation program:
// each step an opcode byte and its operands.
func FuzzKernel(f *testing.F) {
	paths, err := filepath.Glob("../../fixtures/golden/*.safetensors")
	if err != nil || len(paths) == 0 {
		f.Fatalf("no golden fixtures: %v", err)
	}
	bases := make([]evidence.Capture, len(paths))
	for i, p := range paths {
		bases[i] = loadCapture(f, p)
	}
	for i := range bases {
		f.Add(encodeSeed(byte(i)))                           // the fixture as it is: a verdict
		f.Add(encodeSeed(byte(i), 0, 0, 0, 0, 0))            // NaN planted in the first tensor
		f.Add(encodeSeed(byte(i), 2, 1, 2, 9))               // a reshape
		f.Add(encodeSeed(byte(i), 8, 2, 2, 12))              // num_splits = 2147483647
		f.Add(encodeSeed(byte(i), 8, 3, 2, 12, 8, 0, 2, 13)) // topk = 2^31-1, page_size = 2^31
		f.Add(encodeSeed(byte(i), 8, 4, 2, 12))              // max_seq = 2^31-1
		f.Add(encodeSeed(byte(i), 9, 3))                     // the wrong kernel
		f.Add(encodeSeed(byte(i), 0, 3, 0, 5, 0, 7, 255))    // a planted extreme in the fourth tensor
	}
	names := kernel.Names()
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &fuzzBytes{b: data}
		c := cloneCapture(bases[r.intn(len(bases))])
		for steps := 0; r.more() && steps < 12; steps++ {
			switch op := r.intn(10); {
			case op < 7:
				mutateTensors(&c, r, op)
			case op < 9:
				mutateMeta(&c, r, "")
			case op == 9:
				c.Metadata["kcheck.kernel"] = names[r.intn(len(names))]
			}
		}
		if estimateOps(c) > maxFuzzOps {
			return
		}
		checkInvariants(t, c)
	})
}
