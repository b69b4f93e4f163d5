package pdk

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// JSON without reflection. encoding/json decodes by reflection, which in a
// WASM guest costs more than everything else a projector does. A payload or
// record type that implements JSONDecoder (and JSONAppender, with a value
// receiver) is decoded and encoded by its own methods instead; any other
// type goes through encoding/json. The helpers below (Fields, Elements,
// String, Float, Int, AppendString, AppendFloat) make such methods a few
// lines each; plugins/examples/client_orders has a pair.

// JSONDecoder is a type that decodes itself from a JSON object. The kit
// uses it, when *T implements it, for pdk.On payloads and Context.Load.
type JSONDecoder interface {
	DecodeJSON(b []byte) error
}

// JSONAppender is a type that appends its JSON encoding to b. The kit uses
// it for Save, Emit and Dispatch when the value passed implements it.
type JSONAppender interface {
	AppendJSON(b []byte) ([]byte, error)
}

func decodeJSON(b []byte, v any) error {
	if d, ok := v.(JSONDecoder); ok {
		return d.DecodeJSON(b)
	}
	return json.Unmarshal(b, v)
}

func encodeJSON(v any) ([]byte, error) { return encodeJSONSized(v, 128) }

func encodeJSONSized(v any, size int) ([]byte, error) {
	if a, ok := v.(JSONAppender); ok {
		return a.AppendJSON(make([]byte, 0, size))
	}
	return json.Marshal(v)
}

// ErrJSON is the cause of every error of the JSON helpers.
var ErrJSON = errors.New("invalid JSON")

func jsonErr(b []byte, i int, what string) error {
	return fmt.Errorf("%w: %s at offset %d", ErrJSON, what, i)
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// valueEnd returns the offset just past the JSON value starting at b[i].
func valueEnd(b []byte, i int) (int, error) {
	if i >= len(b) {
		return 0, jsonErr(b, i, "missing value")
	}
	switch c := b[i]; {
	case c == '"':
		for j := i + 1; j < len(b); j++ {
			switch b[j] {
			case '\\':
				j++
			case '"':
				return j + 1, nil
			}
		}
		return 0, jsonErr(b, i, "unterminated string")
	case c == '{' || c == '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				end, err := valueEnd(b, j)
				if err != nil {
					return 0, err
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1, nil
				}
			}
		}
		return 0, jsonErr(b, i, "unterminated "+string(c))
	default:
		j := i
		for j < len(b) && (b[j] == '-' || b[j] == '+' || b[j] == '.' || (b[j] >= '0' && b[j] <= '9') ||
			b[j] == 'e' || b[j] == 'E' || (b[j] >= 'a' && b[j] <= 'z')) {
			j++
		}
		if j == i {
			return 0, jsonErr(b, i, "unexpected character")
		}
		return j, nil
	}
}

// Fields calls fn with each member of the JSON object b: its key (raw
// bytes between the quotes; keys with escapes are unescaped) and its raw
// value. It checks the object's structure, not every value's syntax: the
// value helpers do that for the values fn reads.
func Fields(b []byte, fn func(key []byte, value []byte) error) error {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return jsonErr(b, i, "expected an object")
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return trailing(b, i+1)
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return jsonErr(b, i, "expected a key")
		}
		end, err := valueEnd(b, i)
		if err != nil {
			return err
		}
		key := b[i+1 : end-1]
		for _, c := range key {
			if c == '\\' {
				s, err := String(b[i:end])
				if err != nil {
					return err
				}
				key = []byte(s)
				break
			}
		}
		i = skipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return jsonErr(b, i, "expected ':'")
		}
		i = skipSpace(b, i+1)
		vend, err := valueEnd(b, i)
		if err != nil {
			return err
		}
		if err := fn(key, b[i:vend]); err != nil {
			return err
		}
		i = skipSpace(b, vend)
		if i < len(b) && b[i] == ',' {
			i = skipSpace(b, i+1)
			continue
		}
		if i < len(b) && b[i] == '}' {
			return trailing(b, i+1)
		}
		return jsonErr(b, i, "expected ',' or '}'")
	}
}

func trailing(b []byte, i int) error {
	if i = skipSpace(b, i); i != len(b) {
		return jsonErr(b, i, "trailing data")
	}
	return nil
}

// Elements calls fn with each raw element of the JSON array b. null is an
// empty array.
func Elements(b []byte, fn func(value []byte) error) error {
	i := skipSpace(b, 0)
	if string(b[i:]) == "null" {
		return nil
	}
	if i >= len(b) || b[i] != '[' {
		return jsonErr(b, i, "expected an array")
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		return trailing(b, i+1)
	}
	for {
		end, err := valueEnd(b, i)
		if err != nil {
			return err
		}
		if err := fn(b[i:end]); err != nil {
			return err
		}
		i = skipSpace(b, end)
		if i < len(b) && b[i] == ',' {
			i = skipSpace(b, i+1)
			continue
		}
		if i < len(b) && b[i] == ']' {
			return trailing(b, i+1)
		}
		return jsonErr(b, i, "expected ',' or ']'")
	}
}

// String decodes a raw JSON string value (with its quotes).
func String(raw []byte) (string, error) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", jsonErr(raw, 0, "expected a string")
	}
	s := raw[1 : len(raw)-1]
	plain := true
	for _, c := range s {
		if c == '\\' || c < 0x20 || c == '"' {
			plain = false
			break
		}
	}
	if plain && utf8.Valid(s) {
		return string(s), nil
	}
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c == '"' {
			return "", jsonErr(raw, i+1, "control character or quote in string")
		}
		if c != '\\' {
			out = append(out, c)
			continue
		}
		i++
		if i >= len(s) {
			return "", jsonErr(raw, i, "bad escape")
		}
		switch s[i] {
		case '"', '\\', '/':
			out = append(out, s[i])
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := hex4(s, i+1)
			if !ok {
				return "", jsonErr(raw, i, "bad \\u escape")
			}
			i += 4
			if utf16.IsSurrogate(r) {
				r2, ok := rune(0), false
				if i+2 < len(s) && s[i+1] == '\\' && s[i+2] == 'u' {
					r2, ok = hex4(s, i+3)
				}
				if dec := utf16.DecodeRune(r, r2); ok && dec != utf8.RuneError {
					r = dec
					i += 6
				} else {
					r = utf8.RuneError
				}
			}
			out = utf8.AppendRune(out, r)
		default:
			return "", jsonErr(raw, i, "bad escape")
		}
	}
	// encoding/json replaces invalid UTF-8 with U+FFFD; so do we.
	if !utf8.Valid(out) {
		out = []byte(string([]rune(string(out))))
	}
	return string(out), nil
}

func hex4(s []byte, i int) (rune, bool) {
	if i+4 > len(s) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(s[i:i+4]), 16, 32)
	return rune(v), err == nil
}

// Float decodes a raw JSON number.
func Float(raw []byte) (float64, error) {
	if !isNumber(raw) {
		return 0, jsonErr(raw, 0, "expected a number")
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrJSON, err)
	}
	return f, nil
}

// Int decodes a raw JSON number that is an integer.
func Int(raw []byte) (int64, error) {
	if !isNumber(raw) {
		return 0, jsonErr(raw, 0, "expected a number")
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrJSON, err)
	}
	return n, nil
}

func isNumber(raw []byte) bool {
	return len(raw) > 0 && (raw[0] == '-' || (raw[0] >= '0' && raw[0] <= '9'))
}

// IsNull reports whether a raw JSON value is null.
func IsNull(raw []byte) bool { return string(raw) == "null" }

// AppendString appends s as a JSON string, escaped as encoding/json does
// (without its HTML escaping).
func AppendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c < utf8.RuneSelf {
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// AppendFloat appends f as encoding/json would. NaN and infinities have
// no JSON form: it returns an error for them.
func AppendFloat(b []byte, f float64) ([]byte, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return b, fmt.Errorf("%w: unsupported value %v", ErrJSON, f)
	}
	abs := math.Abs(f)
	format := byte('f')
	if abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	start := len(b)
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// clean up e-09 to e-9, as encoding/json does
		n := len(b) - start
		if n >= 4 && b[len(b)-4] == 'e' && b[len(b)-3] == '-' && b[len(b)-2] == '0' {
			b[len(b)-2] = b[len(b)-1]
			b = b[:len(b)-1]
		}
	}
	return b, nil
}
