package jsonnul

import "bytes"

// Has reports whether b, valid JSON, has a string (a value or a key) that
// holds U+0000. A raw NUL byte is not valid JSON, so the escape is the only
// way one gets in; `\\u0000` is an escaped backslash, not a NUL.
func Has(b []byte) bool {
	for {
		i := bytes.IndexByte(b, '\\')
		if i < 0 || i+1 >= len(b) {
			return false
		}
		if b[i+1] == 'u' && len(b) >= i+6 && string(b[i+2:i+6]) == "0000" {
			return true
		}
		b = b[i+2:] // the escaped character, whatever it is, is not a new escape
	}
}
