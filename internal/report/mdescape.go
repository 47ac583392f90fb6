package report

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/kcheck-dev/kcheck/internal/printable"
)

// Everything report.md shows that kcheck did not write itself (file,
// tensor, kernel, stage and case names, messages and notes that quote them,
// provenance, every string of a report.json given to `kcheck report`) goes
// through one of three functions, so that no name can end a code span,
// close the sh fence, start a table cell, a link, an HTML tag, emphasis or a
// heading, or put a control character into the file (printable.Escape runs
// first in each).

// code is s as an inline code span outside a table: its fence is one
// backtick longer than the longest run of backticks in s (CommonMark 6.1),
// padded with a space where s starts or ends with a backtick or a space.
func code(s string) string {
	s = printable.Escape(s)
	if s == "" {
		return "` `"
	}
	fence := strings.Repeat("`", longestRun(s, '`')+1)
	if s[0] == '`' || s[0] == ' ' || s[len(s)-1] == '`' || s[len(s)-1] == ' ' {
		s = " " + s + " "
	}
	return fence + s + fence
}

// cellCode is code for a table cell, where GFM reads a pipe inside a code
// span as the end of the cell unless it is escaped.
func cellCode(s string) string {
	return strings.ReplaceAll(code(s), "|", `\|`)
}

// fenced is s as a fenced code block of the given info string: one line
// (printable.Escape writes a newline as \n), inside a fence longer than any
// run of backticks in it.
func fenced(info, s string) string {
	s = printable.Escape(s)
	fence := strings.Repeat("`", max(3, longestRun(s, '`')+1))
	return fence + info + "\n" + s + "\n" + fence
}

func longestRun(s string, c byte) int {
	best, run := 0, 0
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			run++
			best = max(best, run)
		} else {
			run = 0
		}
	}
	return best
}

// text is s as literal prose, in a paragraph, a list item or a table cell:
// the ASCII punctuation that opens inline Markdown anywhere is
// backslash-escaped (an underscore only where it can open or close
// emphasis, not inside a word like kv_cache), and so is a first character
// that would start a heading, block quote, list or setext underline.
func text(s string) string {
	s = printable.Escape(s)
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '\\', '`', '*', '[', ']', '<', '|', '~', '&', '$':
			b.WriteByte('\\')
		case '_':
			if !(wordBefore(s, i) && wordAfter(s, i+1)) {
				b.WriteByte('\\')
			}
		}
		b.WriteByte(c)
	}
	return blockSafe(b.String())
}

// blockSafe escapes what would make s, first on a line, a block other than
// a paragraph: #, >, +, -, = or an ordered-list number (1. or 1)).
func blockSafe(s string) string {
	lead := len(s) - len(strings.TrimLeft(s, " "))
	rest := s[lead:]
	if rest == "" {
		return s
	}
	switch rest[0] {
	case '#', '>', '+', '-', '=':
		return s[:lead] + `\` + rest
	}
	digits := len(rest) - len(strings.TrimLeft(rest, "0123456789"))
	if digits > 0 && digits < len(rest) && (rest[digits] == '.' || rest[digits] == ')') {
		return s[:lead+digits] + `\` + rest[digits:]
	}
	return s
}

func wordBefore(s string, i int) bool {
	r, _ := utf8.DecodeLastRuneInString(s[:i])
	return i > 0 && (unicode.IsLetter(r) || unicode.IsDigit(r))
}

func wordAfter(s string, i int) bool {
	r, _ := utf8.DecodeRuneInString(s[i:])
	return i < len(s) && (unicode.IsLetter(r) || unicode.IsDigit(r))
}
