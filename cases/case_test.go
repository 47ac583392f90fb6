package cases

import (
	"math"
	"strings"
	"testing"
)

func TestContextExpr(t *testing.T) {
	tests := []struct {
		expr string
		p, s int
		want int
	}{
		{"1", 64, 4, 1},
		{"P-1", 64, 4, 63},
		{"P-1", 1, 4, 0}, // page size 1: a row that sees nothing
		{"P+1", 16, 4, 17},
		{"4P+3", 16, 4, 67},
		{"S-1", 64, 16, 15},
		{"8P+1", 64, 16, 513},
		{"131072", 64, 16, 131072},
	}
	for _, tc := range tests {
		got, err := contextExpr(tc.expr, tc.p, tc.s)
		if err != nil || got != tc.want {
			t.Errorf("contextExpr(%q, P=%d, S=%d) = %d, %v; want %d", tc.expr, tc.p, tc.s, got, err, tc.want)
		}
	}
	for _, bad := range []string{"x", "P-2P", "2Q"} {
		if _, err := contextExpr(bad, 4, 1); err == nil {
			t.Errorf("contextExpr(%q) accepted", bad)
		}
	}
}

// The presets' softmax scales against the published configs: DeepSeek-V3
// passes 192^-0.5 * (0.1 ln 40 + 1)^2 ~= 0.135234 (spec section 6).
func TestPresetScales(t *testing.T) {
	if got := Presets["deepseek-v3"].SoftmaxScale; math.Abs(got-0.1352337788608801) > 1e-15 {
		t.Errorf("deepseek-v3 softmax scale %.16g, want 0.1352337788608801", got)
	}
	if got := Presets["glm-5"].SoftmaxScale; got != 0.0625 {
		t.Errorf("glm-5 softmax scale %g, want 1/16", got)
	}
	for name, want := range map[string]int{"deepseek-v3": 16, "kimi-k2": 8} {
		h, err := Presets[name].HeadsFor(8)
		if err != nil || h != want {
			t.Errorf("%s TP8 heads = %d, %v; want %d", name, h, err, want)
		}
	}
}

func TestParseRejects(t *testing.T) {
	tests := []struct{ name, json, want string }{
		{"not json", `{`, "unexpected EOF"},
		{"unknown field", `{"cases":[{"name":"a","kernel":"k","bogus":1}]}`, "bogus"},
		{"duplicate", `{"cases":[{"name":"a","kernel":"kv_cache_write"},{"name":"a","kernel":"kv_cache_write"}]}`, "twice"},
		{"no kernel", `{"cases":[{"name":"a"}]}`, "no name or no kernel"},
		{"bad tp", `{"cases":[{"name":"a","kernel":"kv_cache_write","preset":"kimi-k2","tp":3}]}`, "does not divide"},
		{"bad k", `{"cases":[{"name":"a","kernel":"nvfp4_gemm","k":40}]}`, "multiple of 16"},
	}
	for _, tc := range tests {
		_, err := Parse([]byte(tc.json), "user.json")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want it to mention %q", tc.name, err, tc.want)
		}
	}
}
