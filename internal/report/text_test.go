package report

import (
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/compare"
)

// What a new user found in the terminal summary (issue 11 item 15): an
// empty "()" on the ERROR line of a file that names no kernel, and
// coordinates ("token -1", "part 0") printed without saying what they mean.
func TestTextForANewUser(t *testing.T) {
	msg := "file is 4 bytes, too short"
	var b strings.Builder
	Text(&b, check.Result{File: "junk.safetensors", Verdict: check.Error, Error: &msg}, TextOptions{})
	if first, _, _ := strings.Cut(b.String(), "\n"); strings.Contains(first, "()") || strings.TrimSpace(first) != "ERROR        junk.safetensors" {
		t.Errorf("ERROR line %q", first)
	}
	b.Reset()
	worst := compare.Element{Coords: []compare.Coord{{Name: "block", Value: 5}, {Name: "part", Value: 0}, {Name: "token", Value: -1}}}
	Text(&b, check.Result{File: "w.safetensors", Kernel: "kv_cache_write", Verdict: check.Fail,
		Checks: []compare.Check{{Tensor: "cache_after", Verdict: compare.Fail, Worst: []compare.Element{worst, worst}}}}, TextOptions{})
	out := b.String()
	if !strings.Contains(out, "(kv_cache_write)") {
		t.Errorf("the kernel is not named:\n%s", out)
	}
	want := "(part: region of the cache entry, 0 latent, 1 fp8_ds_mla scales, 2 rope; token: position in its request; -1: no token is written to the entry, which must keep cache_before)"
	if !strings.Contains(out, want) || strings.Count(out, "part:") != 1 {
		t.Errorf("the coordinates are not explained once:\n%s", out)
	}
}
