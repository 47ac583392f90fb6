package cli

import (
	"encoding/json"
	"strings"
	"testing"
)

// small is a simulation that runs in a fraction of a second.
var small = []string{"--tp", "64", "--prompts", "2", "--steps", "2", "--hidden", "80"}

func TestDiagnoseExitCodes(t *testing.T) {
	sim := func(extra ...string) []string {
		return append(append([]string{"diagnose", "--simulate"}, small...), extra...)
	}
	tests := []struct {
		name string
		args []string
		want ExitCode
	}{
		{"capture pass", []string{"diagnose", fx + "examples/pipeline_ok.safetensors"}, ExitPass},
		{"capture fail", []string{"diagnose", fx + "examples/pipeline_quant_nibble_order.safetensors"}, ExitFail},
		{"single-kernel capture", []string{"diagnose", fx + "examples/nvfp4_dequant_nibble_order.safetensors"}, ExitFail},
		{"missing file", []string{"diagnose", "/nonexistent.safetensors"}, ExitUsage},
		{"missing file, bisect", []string{"diagnose", "--bisect", "/nonexistent.safetensors"}, ExitSkip},
		{"nothing to do", []string{"diagnose"}, ExitUsage},
		{"simulation flag without --simulate", []string{"diagnose", "--tp", "8", fx + "examples/pipeline_ok.safetensors"}, ExitUsage},
		{"simulation with files", append(sim(), fx+"examples/pipeline_ok.safetensors"), ExitUsage},
		{"unknown backend", sim("--backend", "faulty:bogus"), ExitUsage},
		{"unknown backend, bisect", sim("--backend", "faulty:bogus", "--bisect"), ExitSkip},
		{"bad tp", sim("--tp", "3"), ExitUsage},
		{"reference passes", sim(), ExitPass},
		{"fault fails", sim("--backend", "faulty:unweighted_average", "--quick"), ExitFail},
		{"fault fails, bisect", sim("--backend", "faulty:unweighted_average", "--quick", "--bisect"), ExitFail},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if code, out, errs := run(t, tc.args...); code != tc.want {
				t.Errorf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tc.want, out, errs)
			}
		})
	}
}

// The JSON object reference/CONTRACTS.md §7.5 fixes: verdict, stage, first_step,
// first_context_len and steps (step, prompt, context_len, error, floor).
func TestDiagnoseJSON(t *testing.T) {
	tests := []struct {
		name      string
		args      []string
		verdict   string
		stage     any
		firstStep any
	}{
		{"simulation", append([]string{"diagnose", "--simulate", "--json", "--backend", "faulty:stale_pages", "--quick"}, small...),
			"fail", "cache", float64(2)}, // the second prompt's first step: 2 steps a prompt
		{"simulation pass", append([]string{"diagnose", "--simulate", "--json"}, small...), "pass", nil, nil},
		{"capture", []string{"diagnose", "--json", fx + "examples/pipeline_quant_nibble_order.safetensors"}, "fail", "quant", float64(0)},
		{"capture pass", []string{"diagnose", "--json", fx + "examples/pipeline_ok.safetensors"}, "pass", nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, out, errs := run(t, tc.args...)
			var obj map[string]any
			if err := json.Unmarshal([]byte(out), &obj); err != nil {
				t.Fatalf("stdout is not one JSON object: %v\n%s\n%s", err, out, errs)
			}
			for _, k := range []string{"verdict", "stage", "first_step", "first_context_len", "steps"} {
				if _, ok := obj[k]; !ok {
					t.Errorf("key %q missing", k)
				}
			}
			if obj["verdict"] != tc.verdict || obj["stage"] != tc.stage || obj["first_step"] != tc.firstStep {
				t.Errorf("verdict %v, stage %v, first_step %v; want %v, %v, %v", obj["verdict"], obj["stage"], obj["first_step"], tc.verdict, tc.stage, tc.firstStep)
			}
			steps, _ := obj["steps"].([]any)
			if len(steps) == 0 {
				t.Fatal("no steps")
			}
			for _, s := range steps {
				m := s.(map[string]any)
				for _, k := range []string{"step", "prompt", "context_len", "error", "floor"} {
					if _, ok := m[k]; !ok {
						t.Errorf("step %v lacks %q", m, k)
					}
				}
			}
			if tc.firstStep != nil && obj["first_context_len"] == nil {
				t.Error("first_step set but first_context_len null")
			}
		})
	}
}

func TestDiagnoseText(t *testing.T) {
	_, out, _ := run(t, "diagnose", fx+"examples/pipeline_quant_nibble_order.safetensors")
	for _, want := range []string{"culprit stage quant", "> quant", "nvfp4_gemm", "propagated", "worst elements", "signature"} {
		if !strings.Contains(out, want) {
			t.Errorf("text lacks %q:\n%s", want, out)
		}
	}
	_, out, _ = run(t, append([]string{"diagnose", "--simulate", "--backend", "faulty:rope_dropped"}, small...)...)
	for _, want := range []string{"culprit stage attn", "OFF THE FLOOR", "each stage swapped for its reference", "removes the drift", "still drifts"} {
		if !strings.Contains(out, want) {
			t.Errorf("simulation text lacks %q:\n%s", want, out)
		}
	}
}
