package printable

import (
	"testing"
	"unicode/utf8"
)

func TestEscape(t *testing.T) {
	tests := []struct{ in, want string }{
		{"fixtures/examples/x.safetensors", "fixtures/examples/x.safetensors"},
		{"κ·s_i ≤ 2×floor, ulp_BF16", "κ·s_i ≤ 2×floor, ulp_BF16"}, // kcheck's own text is unchanged
		{"x\r\x1b[2KPASS", `x\r\x1b[2KPASS`},
		{"bad\nPASS fine", `bad\nPASS fine`},
		{"tab\there", `tab\there`},
		{"bell\a del\x7f", `bell\a del\x7f`},
		{"c1 \u009b31m", `c1 \u009b31m`},
		{"bidi \u202eSSAP\u202c", `bidi \u202eSSAP\u202c`},
		{"line\u2028sep", `line\u2028sep`},
		{"zero\u200bwidth", `zero\u200bwidth`},
		{"bad utf8 \xff\xfe end", `bad utf8 \xff\xfe end`},
		{"back\\slash", "back\\slash"},
		{"", ""},
	}
	for _, tc := range tests {
		got := Escape(tc.in)
		if got != tc.want {
			t.Errorf("Escape(%q) = %q, want %q", tc.in, got, tc.want)
		}
		// What Escape returns is shown as it is: escaping again changes nothing.
		if again := Escape(got); again != got {
			t.Errorf("Escape(Escape(%q)) = %q, changed", tc.in, again)
		}
	}
}

// No rune below U+0100 a terminal acts on survives Escape.
func TestEscapeEveryLatin1Rune(t *testing.T) {
	for r := rune(0); r < 0x100; r++ {
		got := Escape(string(r))
		for _, c := range got {
			if c < 0x20 || c >= 0x7f && c < 0xa0 {
				t.Errorf("Escape(%q) = %q keeps %U", string(r), got, c)
			}
		}
		if !utf8.ValidString(got) {
			t.Errorf("Escape(%q) = %q is not UTF-8", string(r), got)
		}
	}
}
