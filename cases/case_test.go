package cases_test

import (
	"fmt"
	"math"
	"strings"
	"testing"

	. "github.com/kcheck-dev/kcheck/cases"
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
		got, err := ContextExpr(tc.expr, tc.p, tc.s)
		if err != nil || got != tc.want {
			t.Errorf("ContextExpr(%q, P=%d, S=%d) = %d, %v; want %d", tc.expr, tc.p, tc.s, got, err, tc.want)
		}
	}
	for _, bad := range []struct {
		expr string
		p    int
		want string
	}{
		{"x", 4, "cannot read"},
		{"P-2P", 4, "negative"},
		{"2Q", 4, "cannot read"},
		// 288230376151711745 * 64 = 2^64 + 64: a product that wraps to 64
		{"288230376151711745P", 64, "overflows"},
		{"4611686018427387904+4611686018427387904", 64, "overflows"}, // 2^62 + 2^62 wraps negative
		{"-9223372036854775807-2", 64, "overflows"},
		{"9223372036854775807+1-1", 64, "overflows"},
	} {
		if got, err := ContextExpr(bad.expr, bad.p, 1); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("ContextExpr(%q, P=%d) = %d, %v; want an error saying %q", bad.expr, bad.p, got, err, bad.want)
		}
	}
}

// The presets' softmax scales against the published configs: DeepSeek-V3
// passes 192^-0.5 * (0.1 ln 40 + 1)^2 ~= 0.135234 (reference/CONTRACTS.md §6).
func TestPresetScales(t *testing.T) {
	if got := Presets["deepseek-v3"].SoftmaxScale; math.Abs(got-0.1352337788608801) > 1e-15 {
		t.Errorf("deepseek-v3 softmax scale %.16g, want 0.1352337788608801", got)
	}
	if got := Presets["glm-5"].SoftmaxScale; got != 0.0625 {
		t.Errorf("glm-5 softmax scale %g, want 1/16", got)
	}
	// DeepSeek-V4: head_dim^-0.5 (vllm 0.33.0
	// vllm/models/deepseek_v4/attention.py:244), which CPython computes as
	// 512**-0.5 = 0.04419417382415922 (python3 -c 'print(512**-0.5)'), L + R
	// = head_dim 512
	if p := Presets["deepseek-v4"]; p.SoftmaxScale != 0.04419417382415922 || p.Latent+p.Rope != 512 || p.Heads != 64 || p.TopK != 512 {
		t.Errorf("deepseek-v4 preset %+v: want scale 512**-0.5 = 0.04419417382415922, L + R = 512, 64 heads, top-k 512", p)
	}
	for name, want := range map[string]int{"deepseek-v3": 16, "kimi-k2": 8} {
		h, err := Presets[name].HeadsFor(8)
		if err != nil || h != want {
			t.Errorf("%s TP8 heads = %d, %v; want %d", name, h, err, want)
		}
	}
}

// explicitCases is a case file listing n cases by name.
func explicitCases(n int) string {
	var b strings.Builder
	b.WriteString(`{"cases":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"name":"c%d","kernel":"kv_cache_write"}`, i)
	}
	b.WriteString(`]}`)
	return b.String()
}

func TestParseRejects(t *testing.T) {
	tests := []struct{ name, json, want string }{
		{"not json", `{`, "unexpected EOF"},
		{"unknown field", `{"cases":[{"name":"a","kernel":"k","bogus":1}]}`, "bogus"},
		{"duplicate", `{"cases":[{"name":"a","kernel":"kv_cache_write"},{"name":"a","kernel":"kv_cache_write"}]}`, "twice"},
		{"no kernel", `{"cases":[{"name":"a"}]}`, "no name or no kernel"},
		{"bad tp", `{"cases":[{"name":"a","kernel":"kv_cache_write","preset":"kimi-k2","tp":3}]}`, "does not divide"},
		{"bad k", `{"cases":[{"name":"a","kernel":"nvfp4_gemm","k":40}]}`, "multiple of 16"},
		{"context that wraps", `{"families":[{"name":"f","base":{"kernel":"kv_cache_gather","page_size":64},"matrix":{"context":["288230376151711745P"]}}]}`, "overflows"},
		{"negative batch with a context", `{"families":[{"name":"f","base":{"kernel":"kv_cache_gather","batch":-5},"matrix":{"context":["P"]}}]}`, "batch = -5 is negative"},
		{"a context for 10^8 requests", `{"families":[{"name":"f","base":{"kernel":"kv_cache_gather","batch":100000000},"matrix":{"context":["P+1"]}}]}`, "more than 4194304 seq_lens"},
		{"explicit list over MaxCases", explicitCases(MaxCases + 1), "more than 100000 cases"},
		{"explicit list and a family over MaxCases", `{"cases":` + explicitCases(MaxCases)[len(`{"cases":`):len(explicitCases(MaxCases))-1] +
			`,"families":[{"name":"f","base":{"kernel":"kv_cache_write"}}]}`, "more than 100000 cases"},
	}
	for _, tc := range tests {
		_, err := Parse([]byte(tc.json), "user.json")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want it to mention %q", tc.name, err, tc.want)
		}
	}
}
