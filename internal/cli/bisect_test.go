package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
)

func TestBisectCommand(t *testing.T) {
	code, out, errs := run(t, append([]string{"bisect", "--simulate", "--json", "--backend", "faulty:stale_pages"}, small...)...)
	var res struct {
		Verdict         string `json:"verdict"`
		FirstStep       *int   `json:"first_step"`
		FirstContextLen *int   `json:"first_context_len"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != ExitFail {
		t.Fatalf("exit %d, %v\n%s\n%s", code, err, out, errs)
	}
	// Two steps a prompt: stale pages first show at the second prompt's first step.
	if res.Verdict != "fail" || res.FirstStep == nil || *res.FirstStep != 2 || res.FirstContextLen == nil {
		t.Errorf("result %+v, want first step 2", res)
	}
	if code, _, _ := run(t, append([]string{"bisect", "--simulate"}, small...)...); code != ExitPass {
		t.Errorf("reference: exit %d, want 0", code)
	}
	code, out, _ = run(t, "bisect", "--json", "--case", "kv_cache_gather/bf16/p16/ctx-3P", "--backend", "faulty:page_boundary_off_by_one")
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != ExitFail || res.FirstContextLen == nil || *res.FirstContextLen != 17 {
		t.Errorf("context bisection: exit %d, %+v, %v; want the first context 17 (P+1)", code, res, err)
	}
	for _, args := range [][]string{
		{"bisect"},
		{"bisect", "--simulate", "--case", "kv_cache_gather/bf16/p16/ctx-3P"},
		{"bisect", "--case", "nvfp4_gemm/down_n7168_k2048/m16", "--backend", "faulty:nibble_order"},
		{"bisect", "--simulate", "--backend", "nonesuch"},
	} {
		if code, _, _ := run(t, args...); code != ExitUsage {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
}

// An interrupted search exits 130, as every other command does: it used to
// exit 2 (unusable input), which a script running kcheck bisect reads as
// its own mistake, and git bisect run as a bad commit.
func TestBisectInterrupted(t *testing.T) {
	for _, args := range [][]string{
		append([]string{"bisect", "--simulate", "--backend", "faulty:stale_pages"}, small...),
		{"bisect", "--case", "kv_cache_gather/bf16/p16/ctx-3P", "--backend", "faulty:page_boundary_off_by_one"},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		var out, errw bytes.Buffer
		code := MainContext(ctx, args, strings.NewReader(""), &out, &errw)
		if code != ExitInterrupted || !strings.Contains(errw.String(), "interrupted") {
			t.Errorf("%v, interrupted: exit %d, want 130\n%s", args, code, errw.String())
		}
	}
}
