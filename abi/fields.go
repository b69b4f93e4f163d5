package abi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// This file checks a payload against the fields its message type declares.
// The host runs it on every command before any guest sees it, so a
// client's mistake (a string for a number, a missing field, a typo in a
// field name) is answered as the client's mistake, naming the field,
// instead of surfacing as a guest's decode failure. It is kept apart from
// the envelope and manifest decoders so that any wire format (a later ABI
// version too) can reuse it.

// ErrInput marks a payload that does not match its message type's declared
// fields. *InputError wraps it.
var ErrInput = errors.New("invalid input")

// ClipLength is how many bytes of a client-supplied value an error message
// quotes; the rest is cut and marked with "…".
const ClipLength = 64

// MaxInputProblems bounds how many problems one InputError lists, so the
// answer to a payload with a thousand unknown fields stays short.
const MaxInputProblems = 4

// Clip returns s cut to at most n bytes (on a rune boundary) followed by
// "…" when it was longer: for quoting untrusted values in errors and logs.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// FieldProblem is one field of a payload that does not match its
// declaration.
type FieldProblem struct {
	// Field is the top-level field's name (clipped when it is not a
	// declared one).
	Field string `json:"field"`
	// Reason says what is wrong, quoting at most ClipLength bytes of the
	// value.
	Reason string `json:"reason"`
}

// InputError is a payload that does not match the fields its message type
// declares. Problems lists at most MaxInputProblems of them, declared
// fields first in declaration order, then unknown fields in name order;
// More counts the ones left out.
type InputError struct {
	Type     string
	Problems []FieldProblem
	More     int
}

func (e *InputError) Error() string {
	var b strings.Builder
	b.WriteString(e.Type)
	for i, p := range e.Problems {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString("; ")
		}
		b.WriteString(p.Field + ": " + p.Reason)
	}
	if e.More > 0 {
		fmt.Fprintf(&b, "; and %d more", e.More)
	}
	return b.String()
}

// Unwrap returns ErrInput.
func (e *InputError) Unwrap() error { return ErrInput }

// Fields names the fields with a problem, in the order of Problems.
func (e *InputError) Fields() []string {
	out := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		out[i] = p.Field
	}
	return out
}

// CheckPayload checks data, a message of type m, against m's declared
// fields: data must be a JSON object with each key at most once; every key
// a declared field; every required field present and not null; every
// value of its declared type and in its range:
//
//	string   a JSON string
//	int      a JSON number written as an integer (no fraction, no
//	         exponent) within int64
//	float    a JSON number within float64 (1e400 is out of range)
//	bool     true or false
//	object   a JSON object
//	array    a JSON array
//	any, ""  any JSON value
//
// null is accepted for a field that is not required. Values inside objects
// and arrays are not checked. A mismatch is an *InputError.
func (m Message) CheckPayload(data []byte) error {
	e := &InputError{Type: m.Type}
	var probs []FieldProblem
	add := func(field, reason string) { probs = append(probs, FieldProblem{Field: field, Reason: reason}) }
	values, dups, err := topLevel(data)
	if err != nil {
		add("", err.Error())
		e.Problems = probs
		return e
	}
	for _, f := range m.Fields {
		v, ok := values[f.Name]
		switch {
		case !ok:
			if f.Required {
				add(f.Name, "missing (required)")
			}
		case isNullValue(v):
			if f.Required {
				add(f.Name, "must not be null (required)")
			}
		default:
			if reason := f.Type.check(v); reason != "" {
				add(f.Name, reason)
			}
		}
		if slices.Contains(dups, f.Name) {
			add(f.Name, "appears more than once")
		}
	}
	var unknown []string
	for name := range values {
		if !m.HasField(name) {
			unknown = append(unknown, name)
		}
	}
	slices.Sort(unknown)
	for _, name := range unknown {
		add(Clip(name, ClipLength), "unknown field")
	}
	if len(probs) == 0 {
		return nil
	}
	if len(probs) > MaxInputProblems {
		e.More = len(probs) - MaxInputProblems
		probs = probs[:MaxInputProblems]
	}
	e.Problems = probs
	return e
}

// topLevel splits a JSON object into its members, listing keys that
// appear more than once.
func topLevel(data []byte) (map[string]json.RawMessage, []string, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return nil, nil, errors.New("the payload must be a JSON object")
	}
	values := map[string]json.RawMessage{}
	var dups []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, errors.New("the payload is not valid JSON")
		}
		key, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, nil, fmt.Errorf("the value of %s is not valid JSON", Clip(key, ClipLength))
		}
		if _, seen := values[key]; seen && !slices.Contains(dups, key) {
			dups = append(dups, key)
		}
		values[key] = v
	}
	if _, err := dec.Token(); err != nil {
		return nil, nil, errors.New("the payload is not valid JSON")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, nil, errors.New("trailing data after the JSON object")
	}
	return values, dups, nil
}

func isNullValue(v json.RawMessage) bool { return bytes.Equal(v, []byte("null")) }

// check returns why v (valid JSON, not null) is not of type t, or "".
func (t FieldType) check(v json.RawMessage) string {
	got := kindOf(v)
	switch t {
	case FieldString:
		if got != "string" {
			return want("a string", got, v)
		}
	case FieldBool:
		if got != "boolean" {
			return want("true or false", got, v)
		}
	case FieldObject:
		if got != "object" {
			return want("an object", got, v)
		}
	case FieldArray:
		if got != "array" {
			return want("an array", got, v)
		}
	case FieldInt:
		if got != "number" {
			return want("an integer", got, v)
		}
		lit := string(v)
		if strings.ContainsAny(lit, ".eE") {
			return want("an integer", "number", v)
		}
		if _, err := strconv.ParseInt(lit, 10, 64); err != nil {
			return "integer " + Clip(lit, ClipLength) + " is out of range (int64)"
		}
	case FieldFloat:
		if got != "number" {
			return want("a number", got, v)
		}
		f, err := strconv.ParseFloat(string(v), 64)
		if err != nil || math.IsInf(f, 0) {
			return "number " + Clip(string(v), ClipLength) + " is out of range (float64)"
		}
	}
	return ""
}

func want(what, got string, v json.RawMessage) string {
	return "want " + what + ", got " + got + " " + Clip(string(v), ClipLength)
}

// kindOf names the JSON type of a valid JSON value.
func kindOf(v json.RawMessage) string {
	switch v[0] {
	case '"':
		return "string"
	case '{':
		return "object"
	case '[':
		return "array"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}
