package jsonnul

import (
	"bytes"
	"strings"
	"unicode/utf8"
)

// Refused says why PostgreSQL's jsonb refuses b, valid JSON, or "" if it
// does not: a string holds U+0000 or a surrogate escape that is not half of
// a pair, or b is not UTF-8.
func Refused(b []byte) string {
	if !utf8.Valid(b) {
		return "not valid UTF-8"
	}
	for {
		i := bytes.IndexByte(b, '\\')
		if i < 0 || i+1 >= len(b) {
			return ""
		}
		if b[i+1] != 'u' {
			b = b[i+2:] // the escaped character, whatever it is, is not a new escape
			continue
		}
		r, ok := hex4(b[i+2:])
		if !ok {
			return "" // not valid JSON: not ours to judge
		}
		b = b[i+6:]
		switch {
		case r == 0:
			return "a JSON string holds \\u0000, which PostgreSQL's jsonb cannot store"
		case 0xDC00 <= r && r <= 0xDFFF:
			return "a JSON string holds a lone surrogate escape, which PostgreSQL's jsonb cannot store"
		case 0xD800 <= r && r <= 0xDBFF:
			// A high half must be followed by a low half, escaped.
			if len(b) < 6 || b[0] != '\\' || b[1] != 'u' {
				return "a JSON string holds a lone surrogate escape, which PostgreSQL's jsonb cannot store"
			}
			lo, ok := hex4(b[2:])
			if !ok || lo < 0xDC00 || lo > 0xDFFF {
				return "a JSON string holds a lone surrogate escape, which PostgreSQL's jsonb cannot store"
			}
			b = b[6:]
		}
	}
}

// hex4 reads the four hex digits at the start of b.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			r = r<<4 | rune(c-'0')
		case 'a' <= c && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case 'A' <= c && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// RefusedText says why PostgreSQL's text refuses s, or "" if it does not:
// s holds a NUL (a guest's "\u0000" decodes to one) or is not UTF-8.
func RefusedText(s string) string {
	switch {
	case strings.IndexByte(s, 0) >= 0:
		return "holds U+0000, which PostgreSQL's text cannot store"
	case !utf8.ValidString(s):
		return "not valid UTF-8"
	}
	return ""
}
