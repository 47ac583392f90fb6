package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestShrinkCommand(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "min.safetensors")
	code, stdout, stderr := run(t, "shrink", fx+"examples/nvfp4_dequant_nibble_order.safetensors", "-o", out)
	if code != ExitPass || !strings.Contains(stdout, "wrote "+out) || !strings.Contains(stdout, "alternating_nibbles") {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	if code, _, _ := run(t, "check", out); code != ExitFail {
		t.Errorf("the shrunk evidence checks with exit %d, want 1 (it must still fail)", code)
	}
	// Refuses to overwrite without --force.
	if code, _, stderr := run(t, "shrink", fx+"examples/nvfp4_dequant_nibble_order.safetensors", "-o", out); code != ExitUsage || !strings.Contains(stderr, "--force") {
		t.Errorf("overwrite: exit %d, stderr %q; want 2 and a hint at --force", code, stderr)
	}
	if code, _, _ := run(t, "shrink", fx+"examples/nvfp4_dequant_nibble_order.safetensors", "-o", out, "--force"); code != ExitPass {
		t.Errorf("--force: exit %d", code)
	}
	// A case on a faulty backend, as JSON.
	out2 := filepath.Join(dir, "case.safetensors")
	code, stdout, stderr = run(t, "shrink", "--json", "--case", "splitk_combine/deepseek-v3/tp8/s4", "--backend", "faulty:lse_base_mixed", "-o", out2)
	var res struct {
		File        string `json:"file"`
		BeforeBytes int64  `json:"before_bytes"`
		AfterBytes  int64  `json:"after_bytes"`
		Case        *struct {
			Kernel string `json:"kernel"`
		} `json:"case"`
	}
	if err := json.Unmarshal([]byte(stdout), &res); err != nil || code != ExitPass {
		t.Fatalf("exit %d, %v\nstdout: %s\nstderr: %s", code, err, stdout, stderr)
	}
	if res.File != out2 || res.AfterBytes >= res.BeforeBytes || res.Case == nil || res.Case.Kernel != "splitk_combine" {
		t.Errorf("result %+v", res)
	}
	if _, err := os.Stat(out2); err != nil {
		t.Error(err)
	}
	for _, args := range [][]string{
		{"shrink"},
		{"shrink", "--case", "splitk_combine/deepseek-v3/tp8/s4"},                                    // no backend
		{"shrink", "--case", "splitk_combine/deepseek-v3/tp8/s4", "--backend", "reference"},          // passes
		{"shrink", fx + "examples/pipeline_ok.safetensors", "-o", filepath.Join(dir, "x")},           // passes
		{"shrink", fx + "examples/nvfp4_dequant_ok.safetensors", "--backend", "faulty:nibble_order"}, // backend with a file
	} {
		if code, _, _ := run(t, args...); code != ExitUsage {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
}
