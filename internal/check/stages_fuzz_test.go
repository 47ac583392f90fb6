package check

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/kernel"
)

// FuzzStages fuzzes the pipeline stage parser (parseStages) on its own:
// a kcheck.stages list, metadata lines (KEY=VALUE), and a number of
// generated stages appended to both (count: the low 10 bits, or 100,000
// when the top bit is set: the capture of issue 11 item 12 that took a
// quarter of an hour). It must not panic, must stay linear, and must
// agree with the definition it replaced (parseStagesNaive, quadratic:
// every stage scans every key) on every input small enough to run that:
// the same stages, parameters and links, or an error from both.
//
//	go test -run='^$' -fuzz='^FuzzStages$' -fuzztime=10m ./internal/check
func FuzzStages(f *testing.F) {
	f.Add("quant,cache,attn,combine", "kcheck.quant.kernel=nvfp4_quantize\nkcheck.cache.kernel=kv_cache_write\nkcheck.attn.kernel=mla_decode\nkcheck.combine.kernel=splitk_combine\nkcheck.attn.from.kv_cache=cache.cache_after\nkcheck.combine.from.partial_out=attn.partial_out\nattn.softmax_scale=0.1", uint32(0))
	// testdata/fuzz/FuzzStages holds the 100,000-stage inputs.
	f.Add("s0.cache,s0.attn,s1.cache,s1.attn", "kcheck.s0.cache.kernel=kv_cache_write\nkcheck.s0.attn.kernel=mla_decode\nkcheck.s1.cache.kernel=kv_cache_write\nkcheck.s1.attn.kernel=mla_decode\nkcheck.s1.attn.from.kv_cache=s1.cache.cache_after\ns0.page_size=16", uint32(3))
	f.Add("a,a.b,a.b.c", "kcheck.a.kernel=splitk_combine\nkcheck.a.b.kernel=splitk_combine\nkcheck.a.b.c.kernel=splitk_combine\na.b.c.d=1\nkcheck.a.b.from.partial_out=a.out", uint32(0))
	// a repeated stage, an empty one, a link from a later stage
	f.Add("x, x", "kcheck.x.kernel=splitk_combine", uint32(0))
	f.Add("x,,y", "kcheck.x.kernel=splitk_combine", uint32(0))
	f.Add("y,x", "kcheck.y.kernel=splitk_combine\nkcheck.y.from.partial_out=x.out\nkcheck.x.kernel=splitk_combine", uint32(0))
	f.Add("x..y,.x", "kcheck.x..y.kernel=splitk_combine\nx..y.z=1\nkcheck..x.kernel=splitk_combine", uint32(0))
	f.Add("kcheck", "kcheck.kcheck.kernel=splitk_combine\nkcheck.kcheck.from.kernel=kcheck.out", uint32(2))
	f.Fuzz(func(t *testing.T, list, lines string, count uint32) {
		n := int(count & 0x3ff)
		if count&(1<<31) != 0 {
			n = 100000
		}
		// The generated stages name only their kernels (each input must run
		// in well under the fuzzer's 10 s a worker, instrumented, on a
		// small machine); the hand-written ones carry the rest.
		meta := make(map[string]string, n+16)
		generated := make([]string, n)
		for i := range generated {
			generated[i] = "g" + strconv.Itoa(i)
			meta["kcheck."+generated[i]+".kernel"] = "splitk_combine"
		}
		for _, line := range strings.Split(lines, "\n") {
			if k, v, ok := strings.Cut(line, "="); ok {
				meta[k] = v
			}
		}
		stagesList := list
		if len(generated) > 0 {
			stagesList = strings.Join(append([]string{list}, generated...), ",")
			if list == "" {
				stagesList = strings.Join(generated, ",")
			}
		}
		meta["kcheck.stages"] = stagesList
		stages, err := parseStages(meta)
		if err != nil && err.Error() == "" {
			t.Fatal("an empty error")
		}
		if err == nil {
			for i, st := range stages {
				if st.k == nil || st.params == nil || st.links == nil {
					t.Fatalf("stage %d (%s) is incomplete", i, st.prefix)
				}
			}
		}
		if len(meta) > 3000 {
			return // the quadratic definition would take too long
		}
		want, wantErr := parseStagesNaive(meta)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("parseStages: %v; the definition: %v", err, wantErr)
		}
		if err != nil {
			return
		}
		if len(stages) != len(want) {
			t.Fatalf("%d stages, the definition %d", len(stages), len(want))
		}
		for i := range stages {
			got, w := stages[i], want[i]
			if got.prefix != w.prefix || got.k.Spec().Name != w.k.Spec().Name || !reflect.DeepEqual(got.params, w.params) ||
				!reflect.DeepEqual(got.links, w.links) || got.prec != w.prec {
				t.Fatalf("stage %d: got %s %s %v %v, the definition %s %s %v %v", i, got.prefix, got.k.Spec().Name, got.params, got.links, w.prefix, w.k.Spec().Name, w.params, w.links)
			}
		}
	})
}

// parseStagesNaive is parseStages as it was (main at 92d3f11): every stage
// scans every metadata key, and every link every earlier stage. It defines
// what the linear parser must compute.
func parseStagesNaive(meta map[string]string) ([]stage, error) {
	list, ok := meta["kcheck.stages"]
	if !ok || strings.TrimSpace(list) == "" {
		return nil, fmt.Errorf("metadata kcheck.stages is missing: a pipeline must list its stages")
	}
	var stages []stage
	seen := map[string]bool{}
	for _, prefix := range strings.Split(list, ",") {
		prefix = strings.TrimSpace(prefix)
		if prefix == "" || seen[prefix] {
			return nil, fmt.Errorf("metadata kcheck.stages = %q: stage prefix %q is empty or repeated", list, prefix)
		}
		seen[prefix] = true
		kname := meta["kcheck."+prefix+".kernel"]
		if kname == "" {
			return nil, fmt.Errorf("metadata kcheck.%s.kernel is missing: stage %s does not say its kernel", prefix, prefix)
		}
		k, err := kernel.Lookup(kname)
		if err != nil {
			return nil, fmt.Errorf("metadata kcheck.%s.kernel: %v", prefix, err)
		}
		st := stage{prefix: prefix, k: k, params: kernel.Params{}, links: map[string]string{}}
		for key, v := range meta {
			if strings.HasPrefix(key, prefix+".") {
				st.params[strings.TrimPrefix(key, prefix+".")] = v
			}
			if from := "kcheck." + prefix + ".from."; strings.HasPrefix(key, from) {
				st.links[strings.TrimPrefix(key, from)] = v
			}
		}
		if st.prec, err = kernel.PrecisionFrom(st.params); err != nil {
			return nil, fmt.Errorf("stage %s: %v", prefix, err)
		}
		stages = append(stages, st)
	}
	// A link must name an earlier stage's output.
	for i, st := range stages {
		for input, src := range st.links {
			if !hasInput(st.k, input) {
				return nil, fmt.Errorf("metadata kcheck.%s.from.%s: %s has no input %s", st.prefix, input, st.k.Spec().Name, input)
			}
			dot := strings.LastIndex(src, ".")
			if dot <= 0 {
				return nil, fmt.Errorf("metadata kcheck.%s.from.%s = %q: want <earlier stage>.<tensor>", st.prefix, input, src)
			}
			srcPrefix, srcTensor := src[:dot], src[dot+1:]
			found := false
			for _, earlier := range stages[:i] {
				if earlier.prefix == srcPrefix {
					found = hasOutput(earlier.k, srcTensor)
					if !found {
						return nil, fmt.Errorf("metadata kcheck.%s.from.%s = %q: stage %s (%s) has no output %s", st.prefix, input, src, srcPrefix, earlier.k.Spec().Name, srcTensor)
					}
				}
			}
			if !found {
				return nil, fmt.Errorf("metadata kcheck.%s.from.%s = %q: %s is not an earlier stage", st.prefix, input, src, srcPrefix)
			}
		}
	}
	return stages, nil
}
