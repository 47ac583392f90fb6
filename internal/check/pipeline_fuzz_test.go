package check

import (
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/kernel"
)

// FuzzPipeline fuzzes pipeline link resolution (parseStages, stageInputs,
// fitLink) and the stage-by-stage check over the shipped pipeline capture
// (fixtures/examples/pipeline_ok.safetensors): random kcheck.stages lists
// (dropped, repeated, reordered, unknown, blank stages), random
// kcheck.<stage>.from.<input> links (to later stages, to missing outputs,
// into missing inputs, malformed), random stage kernels and parameters, and
// the tensor mutations FuzzKernel uses. The same invariants hold: a
// verdict, no panic, no hang, no runaway allocation, inputs untouched.
// CI runs it for a short fixed time (make fuzz-short):
//
//	go test -run='^$' -fuzz='^FuzzPipeline$' -fuzztime=10m -parallel 1 ./internal/check
func FuzzPipeline(f *testing.F) {
	base := loadCapture(f, "../../fixtures/examples/pipeline_ok.safetensors")
	f.Add(encodeSeed())                        // as shipped: pass
	f.Add(encodeSeed(7, 0))                    // a stage dropped
	f.Add(encodeSeed(7, 1, 0, 1))              // two stages swapped
	f.Add(encodeSeed(8, 3, 0, 1, 1))           // a link into combine from cache
	f.Add(encodeSeed(8, 1, 0, 2, 0))           // a link from a later stage
	f.Add(encodeSeed(9, 2))                    // a link removed
	f.Add(encodeSeed(10, 2, 3))                // attn runs another kernel
	f.Add(encodeSeed(11, 2, 2, 2, 12))         // attn.num_splits = 2^31-1
	f.Add(encodeSeed(2, 10, 2, 3, 5, 8, 1, 0)) // a reshaped tensor under a link
	stages := []string{"quant", "cache", "attn", "combine"}
	names := kernel.Names()
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &fuzzBytes{b: data}
		c := cloneCapture(base)
		pick := func(list []string) string {
			if r.byte()%16 == 15 { // sometimes a name from the fuzzer
				return string(r.take(r.intn(8)))
			}
			return list[r.intn(len(list))]
		}
		for steps := 0; r.more() && steps < 12; steps++ {
			switch op := r.intn(12); op {
			case 0, 1, 2, 3, 4, 5, 6:
				mutateTensors(&c, r, op)
			case 7: // the stage list
				list := strings.Split(c.Metadata["kcheck.stages"], ",")
				switch r.intn(5) {
				case 0:
					if len(list) > 0 {
						i := r.intn(len(list))
						list = append(list[:i], list[i+1:]...)
					}
				case 1:
					if len(list) > 1 {
						i, j := r.intn(len(list)), r.intn(len(list))
						list[i], list[j] = list[j], list[i]
					}
				case 2:
					list = append(list, pick(append(stages, "", " attn ", "bogus")))
				case 3:
					list = []string{pick(stages)}
				case 4:
					c.Metadata["kcheck.stages"] = string(r.take(r.intn(24)))
					continue
				}
				c.Metadata["kcheck.stages"] = strings.Join(list, ",")
			case 8: // set a link
				st := pick(stages)
				k, _ := kernel.Lookup(c.Metadata["kcheck."+st+".kernel"])
				inputs := []string{"bogus"}
				if k != nil {
					for _, s := range k.Spec().Inputs {
						inputs = append(inputs, s.Name)
					}
				}
				src := pick(stages)
				outputs := []string{"bogus", "out", "lse", "partial_out", "partial_lse", "cache_after", "gathered", "packed"}
				c.Metadata["kcheck."+st+".from."+pick(inputs)] = src + "." + pick(outputs)
			case 9: // remove a link
				var links []string
				for k := range c.Metadata {
					if strings.Contains(k, ".from.") {
						links = append(links, k)
					}
				}
				if len(links) > 0 {
					sortStrings(links)
					delete(c.Metadata, links[r.intn(len(links))])
				}
			case 10: // a stage's kernel
				c.Metadata["kcheck."+pick(stages)+".kernel"] = pick(names)
			case 11: // a stage's parameter
				mutateMeta(&c, r, pick(stages)+".")
			}
		}
		if estimateOps(c) > maxFuzzOps {
			return
		}
		checkInvariants(t, c)
	})
}
