package npy

import (
	"fmt"
	"strconv"
	"strings"
)

// The .npy header is a Python dict literal. numpy writes it with
// repr() and reads it with ast.literal_eval; parser accepts the subset
// that can appear: string keys, and values that are strings, True/False,
// None, integers, tuples of integers (Python 2 files spell them 3L) and,
// for structured dtypes, lists (kept as text, only to be refused).

type (
	tuple []int64
	list  struct{ text string }
	none  struct{}
)

type parser struct {
	s   string
	pos int
}

func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("at byte %d: %s", p.pos, fmt.Sprintf(format, args...))
}

func (p *parser) space() {
	for p.pos < len(p.s) && strings.IndexByte(" \t\r\n", p.s[p.pos]) >= 0 {
		p.pos++
	}
}

func (p *parser) peek() byte {
	p.space()
	if p.pos < len(p.s) {
		return p.s[p.pos]
	}
	return 0
}

func (p *parser) expect(c byte) error {
	if p.peek() != c {
		if p.pos >= len(p.s) {
			return p.errorf("want %q, the header ends", c)
		}
		return p.errorf("want %q, found %q", c, p.s[p.pos])
	}
	p.pos++
	return nil
}

// dict parses the whole header: one dict and nothing but whitespace after.
func (p *parser) dict() (map[string]any, error) {
	if err := p.expect('{'); err != nil {
		return nil, err
	}
	d := map[string]any{}
	for p.peek() != '}' {
		k, err := p.str()
		if err != nil {
			return nil, err
		}
		if err := p.expect(':'); err != nil {
			return nil, err
		}
		v, err := p.value()
		if err != nil {
			return nil, err
		}
		if _, dup := d[k]; dup {
			return nil, p.errorf("key %q appears twice", k)
		}
		d[k] = v
		if p.peek() == ',' {
			p.pos++
		} else if p.peek() != '}' {
			return nil, p.errorf("want ',' or '}' after the value of %q", k)
		}
	}
	p.pos++ // '}'
	if p.peek() != 0 {
		return nil, p.errorf("text after the header dict")
	}
	return d, nil
}

func (p *parser) value() (any, error) {
	switch c := p.peek(); {
	case c == '\'' || c == '"':
		return p.str()
	case c == '(':
		return p.tuple()
	case c == '[':
		return p.list()
	case c == '-' || c >= '0' && c <= '9':
		return p.int()
	case c == 0:
		return nil, p.errorf("want a value, the header ends")
	}
	for _, w := range []struct {
		word string
		v    any
	}{{"True", true}, {"False", false}, {"None", none{}}} {
		if strings.HasPrefix(p.s[p.pos:], w.word) {
			p.pos += len(w.word)
			return w.v, nil
		}
	}
	return nil, p.errorf("unexpected %q", p.s[p.pos])
}

// str parses a quoted string without escapes (dtype strings and key names
// have none; a backslash is refused rather than misread).
func (p *parser) str() (string, error) {
	q := p.peek()
	if q != '\'' && q != '"' {
		if q == 0 {
			return "", p.errorf("want a quoted key, the header ends")
		}
		return "", p.errorf("want a quoted string, found %q", q)
	}
	start := p.pos + 1
	for i := start; i < len(p.s); i++ {
		switch p.s[i] {
		case q:
			p.pos = i + 1
			return p.s[start:i], nil
		case '\\':
			return "", p.errorf("escapes in strings are not supported")
		}
	}
	return "", p.errorf("unterminated string")
}

func (p *parser) int() (int64, error) {
	p.space()
	start := p.pos
	if p.pos < len(p.s) && p.s[p.pos] == '-' {
		p.pos++
	}
	for p.pos < len(p.s) && p.s[p.pos] >= '0' && p.s[p.pos] <= '9' {
		p.pos++
	}
	v, err := strconv.ParseInt(p.s[start:p.pos], 10, 64)
	if err != nil {
		return 0, p.errorf("bad integer %q", p.s[start:p.pos])
	}
	if p.pos < len(p.s) && (p.s[p.pos] == 'L' || p.s[p.pos] == 'l') {
		p.pos++ // Python 2 long
	}
	return v, nil
}

// tuple parses (), (n,) or (a, b, ...), integers only (shapes).
func (p *parser) tuple() (tuple, error) {
	if err := p.expect('('); err != nil {
		return nil, err
	}
	t := tuple{}
	for p.peek() != ')' {
		if c := p.peek(); c != '-' && (c < '0' || c > '9') {
			if c == 0 {
				return nil, p.errorf("unterminated tuple")
			}
			return nil, p.errorf("want an integer in the tuple, found %q", c)
		}
		v, err := p.int()
		if err != nil {
			return nil, err
		}
		t = append(t, v)
		if p.peek() == ',' {
			p.pos++
		} else if p.peek() != ')' {
			return nil, p.errorf("want ',' or ')' in the tuple")
		}
	}
	p.pos++
	return t, nil
}

// list skips a (possibly nested) list, keeping its text: it only appears
// as a structured dtype, which is refused with the text in the message.
func (p *parser) list() (list, error) {
	start := p.pos
	depth := 0
	var quote byte
	for ; p.pos < len(p.s); p.pos++ {
		c := p.s[p.pos]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '[' || c == '(':
			depth++
		case c == ']' || c == ')':
			depth--
			if depth == 0 {
				p.pos++
				return list{p.s[start:p.pos]}, nil
			}
		}
	}
	return list{}, p.errorf("unterminated list")
}
