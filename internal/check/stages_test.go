package check

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// manyStages is the metadata of a pipeline of n splitk_combine stages,
// each with a parameter and a link from the stage before.
func manyStages(n int) map[string]string {
	meta := map[string]string{"kcheck.format": "1", "kcheck.kernel": "pipeline"}
	names := make([]string, n)
	for i := range names {
		p := fmt.Sprintf("s%d.combine", i)
		names[i] = p
		meta["kcheck."+p+".kernel"] = "splitk_combine"
		meta[p+".note"] = "x"
		if i > 0 {
			meta["kcheck."+p+".from.partial_out"] = names[i-1] + ".out"
		}
	}
	meta["kcheck.stages"] = strings.Join(names, ",")
	return meta
}

// Stage parsing was O(stages x keys): every stage scanned every metadata
// key, and every link every earlier stage (issue 11 item 12: 100,000
// stages took about 15 minutes). It is linear now: 20,000 stages, which
// took tens of seconds, parse in well under a second.
func TestParseStagesLinear(t *testing.T) {
	meta := manyStages(20000)
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		stages, err := parseStages(meta)
		if err == nil && len(stages) != 20000 {
			err = fmt.Errorf("%d stages, want 20000", len(stages))
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("20,000 stages parsed in %v", time.Since(start))
	case <-time.After(10 * time.Second):
		t.Fatal("20,000 stages take more than 10 s to parse (quadratic?)")
	}
}

// What each stage gets: its kernel, its parameters (keys under its
// prefix, a dotted prefix's included, as before) and its links.
func TestParseStagesParams(t *testing.T) {
	meta := map[string]string{
		"kcheck.stages":                "s0,s0.cache,s0.attn",
		"kcheck.s0.kernel":             "splitk_combine",
		"kcheck.s0.cache.kernel":       "kv_cache_gather",
		"kcheck.s0.attn.kernel":        "mla_decode",
		"s0.cache.page_size":           "16",
		"s0.attn.softmax_scale":        "0.5",
		"s0.x":                         "1",
		"kcheck.s0.attn.from.kv_cache": "s0.cache.cache",
	}
	_, err := parseStages(meta)
	if err == nil || !strings.Contains(err.Error(), "stage s0.cache (kv_cache_gather) has no output cache") {
		t.Fatalf("err = %v", err)
	}
	delete(meta, "kcheck.s0.attn.from.kv_cache")
	stages, err := parseStages(meta)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]map[string]string{
		// s0 is a prefix of the others' keys too: it sees them, as it always did.
		"s0":       {"x": "1", "cache.page_size": "16", "attn.softmax_scale": "0.5"},
		"s0.cache": {"page_size": "16"},
		"s0.attn":  {"softmax_scale": "0.5"},
	}
	for _, st := range stages {
		if fmt.Sprint(map[string]string(st.params)) != fmt.Sprint(want[st.prefix]) {
			t.Errorf("stage %s params %v, want %v", st.prefix, st.params, want[st.prefix])
		}
	}
}
