package redisstream

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/proteanhq/protean-host/delivery"
)

// Entry field names. A field that is empty or zero is left out, and a
// missing field decodes to its zero value.
const (
	FieldID             = "id"
	FieldType           = "type"
	FieldData           = "data"
	FieldMetadata       = "metadata"
	FieldEventStream    = "event_stream"
	FieldCategory       = "category"
	FieldPosition       = "position"
	FieldGlobalPosition = "global_position"
	FieldTime           = "time" // RFC 3339 with nanoseconds, UTC
	FieldPartitionKey   = "partition_key"
	FieldPrev           = "prev" // delivery.Message.Prev
)

// ErrMalformed: a stream entry cannot be decoded into a message. The entry
// is a poison message: it will never decode, so retrying it is pointless.
var ErrMalformed = errors.New("malformed stream entry")

// DecodeError says which entry and field failed to decode. It unwraps to
// ErrMalformed and to the underlying cause, if any.
type DecodeError struct {
	Entry string // the Redis entry id
	Field string
	Err   error
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("redisstream: entry %s: field %s: %v", e.Entry, e.Field, e.Err)
}

// Unwrap returns ErrMalformed and the cause.
func (e *DecodeError) Unwrap() []error { return []error{ErrMalformed, e.Err} }

// Encode returns msg's stream fields as a flat list (name, value, ...), in
// the order XADD takes them. Stream is not encoded: it is the key the entry
// lives under.
func Encode(msg delivery.Message) []any {
	f := make([]any, 0, 20)
	f = append(f, FieldID, msg.ID)
	add := func(name, v string) {
		if v != "" {
			f = append(f, name, v)
		}
	}
	add(FieldType, msg.Type)
	if msg.Data != nil {
		f = append(f, FieldData, string(msg.Data))
	}
	if msg.Metadata != nil {
		f = append(f, FieldMetadata, string(msg.Metadata))
	}
	add(FieldEventStream, msg.EventStream)
	add(FieldCategory, msg.Category)
	if msg.Position != 0 {
		f = append(f, FieldPosition, strconv.FormatInt(msg.Position, 10))
	}
	if msg.GlobalPosition != 0 {
		f = append(f, FieldGlobalPosition, strconv.FormatInt(msg.GlobalPosition, 10))
	}
	if !msg.Time.IsZero() {
		f = append(f, FieldTime, msg.Time.UTC().Format(time.RFC3339Nano))
	}
	add(FieldPartitionKey, msg.PartitionKey)
	if msg.Prev != 0 {
		f = append(f, FieldPrev, strconv.FormatInt(msg.Prev, 10))
	}
	return f
}

// Decode turns the fields of stream entry id back into a message; fields it
// does not know (such as a dead letter's) are ignored. The caller sets
// Stream. A missing id, a non-string value, JSON that does not parse, a
// position that is not an integer or a time that is not RFC 3339 is a
// *DecodeError.
func Decode(id string, values map[string]any) (delivery.Message, error) {
	var m delivery.Message
	str := func(name string) (string, bool, error) {
		v, ok := values[name]
		if !ok {
			return "", false, nil
		}
		switch v := v.(type) {
		case string:
			return v, true, nil
		case []byte:
			return string(v), true, nil
		default:
			return "", true, &DecodeError{Entry: id, Field: name, Err: fmt.Errorf("value of type %T, want a string", v)}
		}
	}
	var err error
	var ok bool
	if m.ID, ok, err = str(FieldID); err != nil {
		return delivery.Message{}, err
	} else if !ok || m.ID == "" {
		return delivery.Message{}, &DecodeError{Entry: id, Field: FieldID, Err: errors.New("missing")}
	}
	for _, p := range []struct {
		name string
		dst  *string
	}{{FieldType, &m.Type}, {FieldEventStream, &m.EventStream}, {FieldCategory, &m.Category}, {FieldPartitionKey, &m.PartitionKey}} {
		if *p.dst, _, err = str(p.name); err != nil {
			return delivery.Message{}, err
		}
	}
	for _, p := range []struct {
		name string
		dst  *json.RawMessage
	}{{FieldData, &m.Data}, {FieldMetadata, &m.Metadata}} {
		s, ok, err := str(p.name)
		if err != nil {
			return delivery.Message{}, err
		}
		if !ok {
			continue
		}
		if !json.Valid([]byte(s)) {
			return delivery.Message{}, &DecodeError{Entry: id, Field: p.name, Err: errors.New("not valid JSON")}
		}
		*p.dst = json.RawMessage(s)
	}
	for _, p := range []struct {
		name string
		dst  *int64
	}{{FieldPosition, &m.Position}, {FieldGlobalPosition, &m.GlobalPosition}, {FieldPrev, &m.Prev}} {
		s, ok, err := str(p.name)
		if err != nil {
			return delivery.Message{}, err
		}
		if !ok {
			continue
		}
		if *p.dst, err = strconv.ParseInt(s, 10, 64); err != nil {
			return delivery.Message{}, &DecodeError{Entry: id, Field: p.name, Err: err}
		}
	}
	if s, ok, err := str(FieldTime); err != nil {
		return delivery.Message{}, err
	} else if ok {
		if m.Time, err = time.Parse(time.RFC3339Nano, s); err != nil {
			return delivery.Message{}, &DecodeError{Entry: id, Field: FieldTime, Err: err}
		}
	}
	return m, nil
}

// decodeFlat decodes a Lua reply's flat field list.
func decodeFlat(id string, flat []any) (delivery.Message, error) {
	return Decode(id, flatMap(flat))
}

func flatMap(flat []any) map[string]any {
	values := make(map[string]any, len(flat)/2)
	for i := 0; i+1 < len(flat); i += 2 {
		if k, ok := flat[i].(string); ok {
			values[k] = flat[i+1]
		}
	}
	return values
}

// timePair splits t into whole seconds and nanoseconds, the form the Lua
// scripts compare in: Lua numbers are doubles, which cannot hold a Unix time
// in nanoseconds exactly.
func timePair(t time.Time) (int64, int64) { return t.Unix(), int64(t.Nanosecond()) }

// parsePair parses the scripts' "seconds nanoseconds" form.
func parsePair(s string) (time.Time, error) {
	sec, nsec, ok := strings.Cut(s, " ")
	if !ok {
		return time.Time{}, fmt.Errorf("time %q: want \"seconds nanoseconds\"", s)
	}
	a, err1 := strconv.ParseInt(sec, 10, 64)
	b, err2 := strconv.ParseInt(nsec, 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return time.Time{}, fmt.Errorf("time %q: %w", s, err)
	}
	return time.Unix(a, b), nil
}
