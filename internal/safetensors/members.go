package safetensors

import (
	"bytes"
	"encoding/json"
)

// eachMember calls fn with each member of the JSON object obj, in order:
// its key, unescaped, and its value's bytes, a subslice of obj (nothing is
// copied, so a header costs little more than itself to split). obj must
// be an object that json.Valid accepts: the scan relies on it and checks
// nothing. It stops at fn's first error.
//
// A JSON decoder would keep the last of two members with the same key;
// walking the members lets every reader of the header see both.
func eachMember(obj []byte, fn func(key string, value []byte) error) error {
	i := skipSpace(obj, 0) + 1 // past '{'
	for {
		i = skipSpace(obj, i)
		switch obj[i] {
		case '}':
			return nil
		case ',':
			i = skipSpace(obj, i+1)
		}
		end := skipString(obj, i)
		key := unquote(obj[i:end])
		i = skipSpace(obj, skipSpace(obj, end)+1) // past ':'
		vend := skipValue(obj, i)
		if err := fn(key, obj[i:vend]); err != nil {
			return err
		}
		i = vend
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index just past the string that starts at b[i].
func skipString(b []byte, i int) int {
	for j := i + 1; ; j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
}

// skipValue returns the index just past the value that starts at b[i].
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for j := i; ; j++ {
			switch b[j] {
			case '"':
				j = skipString(b, j) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
	}
	j := i // a number, true, false or null
	for j < len(b) && !endsLiteral(b[j]) {
		j++
	}
	return j
}

func endsLiteral(c byte) bool {
	switch c {
	case ',', '}', ']', ' ', '\t', '\r', '\n':
		return true
	}
	return false
}

// unquote returns the string a valid JSON string literal q stands for.
func unquote(q []byte) string {
	if bytes.IndexByte(q, '\\') < 0 {
		return string(q[1 : len(q)-1])
	}
	var s string
	_ = json.Unmarshal(q, &s) // valid: json.Valid held
	return s
}
