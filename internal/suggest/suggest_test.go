package suggest

import "testing"

func TestDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"abc", "abc", 0}, {"", "abc", 3}, {"kitten", "sitting", 3},
		{"mla_decode", "mla_deocde", 1}, // a swap is one edit
		{"ab", "ba", 1}, {"flaw", "lawn", 2},
	} {
		if got := distance(tc.a, tc.b); got != tc.want {
			t.Errorf("distance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestClosest(t *testing.T) {
	kernels := []string{"dsa_indexer", "kv_cache_gather", "kv_cache_write", "mla_decode", "mla_decode_sparse", "nvfp4_dequantize", "nvfp4_gemm", "nvfp4_quantize", "splitk_combine"}
	for _, tc := range []struct{ name, want string }{
		{"mla_decod", "mla_decode"},
		{"MLA_DECODE", "mla_decode"},
		{"kv_cache_gahter", "kv_cache_gather"},
		{"nvfp4_quantise", "nvfp4_quantize"},
		{"splitk", "splitk_combine"}, // held whole by one name
		{"nvfp4", ""},                // held by three: no guess
		{"xyz", ""},                  // near nothing
		{"gemm", "nvfp4_gemm"},       // held by one
		{"mla_decode_sprase", "mla_decode_sparse"},
		{"cache_write", "kv_cache_write"}, // words in order, one left out
		{"nvfp4_quant", "nvfp4_quantize"}, // held by one
		{"decode_mla", ""},                // words out of order
		{"kv_cache", ""},                  // held by two
		{"kv_cache_flush", ""},            // a word nothing holds
	} {
		if got := Closest(tc.name, kernels); got != tc.want {
			t.Errorf("Closest(%q) = %q, want %q", tc.name, got, tc.want)
		}
	}
	if got := DidYouMean("mla_decod", kernels); got != `; did you mean "mla_decode"?` {
		t.Errorf("DidYouMean = %q", got)
	}
	if got := DidYouMean("xyz", kernels); got != "" {
		t.Errorf("DidYouMean(xyz) = %q, want nothing", got)
	}
}

// Names with a word left out, as users remember them: the fault and case
// names of the catalog.
func TestClosestByWords(t *testing.T) {
	faults := []string{"empty_split_nan", "fp8_scale_applied_twice", "fp8_scale_ignored", "neighbour_block_table_row", "page_boundary_off_by_one", "page_tail_attended", "stale_pages", "stale_partial"}
	cases := []string{"splitk_combine/deepseek-v3/tp8/s1", "splitk_combine/deepseek-v3/tp8/s2", "splitk_combine/kimi-k2/tp8/s2", "kv_cache_gather/bf16/p16/ctx-3P"}
	for _, tc := range []struct {
		name       string
		candidates []string
		want       string
	}{
		{"page_of_by_one", faults, "page_boundary_off_by_one"},
		{"page_off_by_one", faults, "page_boundary_off_by_one"},
		{"fp8_scale_twice", faults, "fp8_scale_applied_twice"},
		{"scale_applied", faults, "fp8_scale_applied_twice"},
		{"stale", faults, ""}, // one word, held by two
		{"page_by", faults, "page_boundary_off_by_one"},
		{"split_nan_empty", faults, ""},   // out of order
		{"splitk_combine/s2x", cases, ""}, // s2 in two cases: no guess
		{"splitk_combine/kimi/s2", cases, "splitk_combine/kimi-k2/tp8/s2"},
		{"splitk_combine/deepseek/s1", cases, "splitk_combine/deepseek-v3/tp8/s1"},
		{"kv_cache_gather/bf16/ctx-3P", cases, "kv_cache_gather/bf16/p16/ctx-3P"},
		{"a_b", []string{"a_x_b"}, "a_x_b"}, // one-letter words match exactly
		{"a_c", []string{"a_x_b"}, ""},
	} {
		if got := Closest(tc.name, tc.candidates); got != tc.want {
			t.Errorf("Closest(%q) = %q, want %q", tc.name, got, tc.want)
		}
	}
}
