// Package printable keeps the text kcheck prints for people from acting on
// the terminal that shows it. File, tensor, kernel, stage, case and archive
// member names come from files anyone can craft; printed raw, a carriage
// return or an escape sequence in one can overwrite a FAIL line with a PASS,
// and a newline can forge a line of its own. Every name or message that
// reaches human-readable output goes through Escape; JSON output does not
// (encoding/json escapes control characters itself, and keeps names exact).
package printable

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Escape returns s with every rune a terminal would act on instead of
// showing written as its Go escape: control characters (newline included),
// DEL, C1 controls, Unicode format characters such as the bidi overrides,
// line and paragraph separators, and bytes that are not UTF-8 (as \xNN).
// Text without them, which is all text kcheck writes itself, is returned as
// it is.
func Escape(s string) string {
	if clean(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			b.WriteString(`\x`)
			b.WriteString(strconv.FormatUint(uint64(s[i])>>4, 16))
			b.WriteString(strconv.FormatUint(uint64(s[i])&15, 16))
		case printable(r):
			b.WriteString(s[i : i+n])
		default:
			q := strconv.QuoteRune(r) // '\x1b', '\n', '\u202e'
			b.WriteString(q[1 : len(q)-1])
		}
		i += n
	}
	return b.String()
}

// printable reports whether a terminal shows r as itself.
func printable(r rune) bool { return strconv.IsPrint(r) }

func clean(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == 0x7f || c >= 0x80 {
			return cleanUTF8(s[i:])
		}
	}
	return true
}

func cleanUTF8(s string) bool {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 || !printable(r) {
			return false
		}
		i += n
	}
	return true
}
