package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/jsonnul"
)

// This file holds the rules a request's text must meet before anything
// of it is kept: header values, the path, and a command body's bytes,
// strings and numbers. Each is refused naming what is wrong and never
// changed on the way (encoding/json would turn invalid UTF-8 and lone
// surrogate escapes into U+FFFD, so two distinct ids could become one).

// CorrelationHeader names the header whose value becomes a command's
// correlation id (abi.Metadata.CorrelationID).
const CorrelationHeader = "X-Correlation-ID"

// MaxHeaderValueBytes bounds each header value the host keeps
// (X-Correlation-ID, Idempotency-Key): it travels with every event the
// command causes.
const MaxHeaderValueBytes = 255

// MaxNumberDigits bounds the digits of a number literal in a command body:
// converting a longer one costs time for no meaning (a float64 holds 17
// significant digits, an int64 19).
const MaxNumberDigits = 64

// checkHeaders says what is wrong with the header values a command keeps,
// or "": each at most MaxHeaderValueBytes of printable ASCII.
func checkHeaders(get func(string) string) string {
	for _, name := range []string{CorrelationHeader, IdempotencyHeader} {
		v := get(name)
		if len(v) > MaxHeaderValueBytes {
			return fmt.Sprintf("%s is longer than %d bytes (got %d)", name, MaxHeaderValueBytes, len(v))
		}
		for i := range len(v) {
			if c := v[i]; c < 0x20 || c > 0x7e {
				return fmt.Sprintf("%s must be printable ASCII: byte %d is 0x%02x", name, i, c)
			}
		}
	}
	return ""
}

// checkPath says what is wrong with a request's (unescaped) path, or "".
func checkPath(p string) string {
	if at := invalidUTF8([]byte(p)); at >= 0 {
		return fmt.Sprintf("path is not valid UTF-8 at byte %d", at)
	}
	if i := strings.IndexByte(p, 0); i >= 0 {
		return fmt.Sprintf("path holds U+0000 at byte %d", i)
	}
	return ""
}

// invalidUTF8 returns the offset of the first byte of s that is not
// UTF-8, or -1.
func invalidUTF8(s []byte) int {
	if utf8.Valid(s) {
		return -1
	}
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return -1
}

// notObject says why body (valid UTF-8) is not a JSON object, or "": it
// scans the body once without building anything; only a refused body
// pays for the reason.
func notObject(body []byte) string {
	first := bytes.TrimLeft(body, " \t\r\n")
	if json.Valid(body) {
		switch {
		case first[0] == '{':
			return ""
		case first[0] == '[':
			return "got an array"
		case first[0] == '"':
			return "got a string"
		case first[0] == 'n':
			return "got null"
		case first[0] == 't' || first[0] == 'f':
			return "got a boolean"
		}
		return "got a number"
	}
	if len(first) == 0 {
		return "the body is empty"
	}
	var se *json.SyntaxError
	if err := json.Unmarshal(body, new(json.RawMessage)); errors.As(err, &se) {
		return fmt.Sprintf("not valid JSON: %s, after %d bytes", se.Error(), se.Offset)
	}
	return "not valid JSON"
}

// checkValues finds, in body (valid JSON, valid UTF-8), the strings the
// stores cannot keep as sent (U+0000, a lone surrogate escape) and the
// number literals over MaxNumberDigits, naming each field by its path
// (order.lines[2].sku); nil if none. At most abi.MaxInputProblems are
// listed, the rest counted.
func checkValues(typ string, body []byte) *abi.InputError {
	s := &valueScan{b: body}
	s.value()
	if len(s.probs) == 0 {
		return nil
	}
	e := &abi.InputError{Type: typ, Problems: s.probs}
	if len(s.probs) > abi.MaxInputProblems {
		e.Problems, e.More = s.probs[:abi.MaxInputProblems], len(s.probs)-abi.MaxInputProblems
	}
	return e
}

// valueScan walks a valid JSON text once, keeping the path to the value
// it is in.
type valueScan struct {
	b     []byte
	i     int
	path  []pathPart
	probs []abi.FieldProblem
}

type pathPart struct {
	key   string
	index int // -1 for an object member
}

func (s *valueScan) add(reason string) {
	var b strings.Builder
	for _, p := range s.path {
		switch {
		case p.index >= 0:
			b.WriteString("[" + strconv.Itoa(p.index) + "]")
		case b.Len() > 0:
			b.WriteString("." + p.key)
		default:
			b.WriteString(p.key)
		}
	}
	s.probs = append(s.probs, abi.FieldProblem{Field: abi.Clip(b.String(), abi.ClipLength), Reason: reason})
}

func (s *valueScan) ws() {
	for s.i < len(s.b) && (s.b[s.i] == ' ' || s.b[s.i] == '\t' || s.b[s.i] == '\n' || s.b[s.i] == '\r') {
		s.i++
	}
}

// value reads one value; the text is valid JSON, so each byte it expects
// is there.
func (s *valueScan) value() {
	s.ws()
	switch c := s.b[s.i]; {
	case c == '{':
		s.i++
		for s.ws(); s.b[s.i] != '}'; s.ws() {
			name, why := key(s.str())
			s.path = append(s.path, pathPart{key: name, index: -1})
			if why != "" {
				s.add("its name " + why)
			}
			s.ws()
			s.i++ // ':'
			s.value()
			s.path = s.path[:len(s.path)-1]
			if s.ws(); s.b[s.i] == ',' {
				s.i++
			}
		}
		s.i++
	case c == '[':
		s.i++
		for n := 0; ; n++ {
			if s.ws(); s.b[s.i] == ']' {
				break
			}
			s.path = append(s.path, pathPart{index: n})
			s.value()
			s.path = s.path[:len(s.path)-1]
			if s.ws(); s.b[s.i] == ',' {
				s.i++
			}
		}
		s.i++
	case c == '"':
		if why := jsonnul.Refused(s.str()); why != "" {
			s.add(strings.TrimPrefix(why, "a JSON string "))
		}
	case c == '-' || '0' <= c && c <= '9':
		digits := 0
		for ; s.i < len(s.b) && strings.IndexByte("+-.eE0123456789", s.b[s.i]) >= 0; s.i++ {
			if '0' <= s.b[s.i] && s.b[s.i] <= '9' {
				digits++
			}
		}
		if digits > MaxNumberDigits {
			s.add(fmt.Sprintf("a number of %d digits: at most %d", digits, MaxNumberDigits))
		}
	default: // true, false, null
		for s.i < len(s.b) && 'a' <= s.b[s.i] && s.b[s.i] <= 'z' {
			s.i++
		}
	}
}

// str reads a string at s.i and returns it, quotes included.
func (s *valueScan) str() []byte {
	start := s.i
	for s.i++; s.b[s.i] != '"'; s.i++ {
		if s.b[s.i] == '\\' {
			s.i++
		}
	}
	s.i++
	return s.b[start:s.i]
}

// key returns a member name and why the stores refuse it, or "".
func key(raw []byte) (string, string) {
	why := jsonnul.Refused(raw)
	name := string(raw[1 : len(raw)-1]) // as written
	if why == "" && bytes.IndexByte(raw, '\\') >= 0 {
		_ = json.Unmarshal(raw, &name)
	}
	return name, strings.TrimPrefix(why, "a JSON string ")
}
