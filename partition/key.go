package partition

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxKeyLength is the longest partition key accepted, in characters. It is
// the width of the outbox's partition_key column (VARCHAR(255), which also
// counts characters, not bytes).
const MaxKeyLength = 255

// DLQToken is the lane name reserved for a partition's dead-letter stream
// ({category}:{key}:dlq); no key may equal it.
const DLQToken = "dlq"

// DefaultBackfillSuffix is the default [server.priority_lanes]
// backfill_suffix: the lane that low-priority messages of a key go to.
const DefaultBackfillSuffix = "backfill"

// ErrInvalidKey is the condition behind every [*KeyError]; test for it with
// errors.Is.
var ErrInvalidKey = errors.New("invalid partition key")

// KeyError reports a partition key value that failed a rule. Reason is the
// exact reason string of the first failing rule (see the package overview).
type KeyError struct {
	Key    string // the key as coerced to a string; "" for a null value
	Reason string
}

func (e *KeyError) Error() string { return "invalid partition key: " + e.Reason }

// Unwrap returns [ErrInvalidKey].
func (e *KeyError) Unwrap() error { return ErrInvalidKey }

// KeyReason returns "" if key is a valid partition key, and otherwise the
// reason string of the first rule it fails (Protean's rules in its order,
// then the control-character rule, which is ours). backfillSuffix is the configured
// [server.priority_lanes] backfill_suffix; it is reserved whether or not lanes
// are enabled, so that enabling them later cannot make an existing key's
// stream collide with another key's lane.
//
// Lengths are counted in characters (runes), as Protean counts them with
// Python's len() and as PostgreSQL counts VARCHAR(255); an invalid UTF-8 byte
// counts as one character.
func KeyReason(key string, backfillSuffix string) string {
	if key == "" {
		return "partition key is null or empty"
	}
	n := utf8.RuneCountInString(key)
	if n > MaxKeyLength {
		return fmt.Sprintf("partition key exceeds %d characters (got %d)", MaxKeyLength, n)
	}
	if strings.Contains(key, ":") {
		return "partition key contains a colon"
	}
	if key == DLQToken || key == backfillSuffix {
		return fmt.Sprintf("partition key '%s' is a reserved lane/DLQ token", key)
	}
	if n >= 4 && strings.HasPrefix(key, "__") && strings.HasSuffix(key, "__") {
		return fmt.Sprintf("partition key '%s' uses the reserved '__name__' sentinel form", key)
	}
	if strings.IndexFunc(key, unicode.IsControl) >= 0 {
		return "partition key contains a control character"
	}
	return ""
}

// KeyString coerces a message field value, as decoded from JSON into an
// `any`, to the string that names its partition. ok is false for a null
// (nil) value, which is not a key at all.
//
// Protean coerces with Python's str(), but JSON has no int/float split, so
// Python's answers (7 vs 7.0, True) are not recoverable from the wire. What
// an operator expects in a stream name is the value as it was written, so
// KeyString uses the JSON literal text:
//
//   - string: as is (an empty string is ok and then fails validation);
//   - json.Number: its literal text unchanged ("7", "7.0", "1e3"); decode
//     with json.Decoder.UseNumber to keep it;
//   - float64 (json.Unmarshal without UseNumber): its shortest JSON form,
//     so 7.0 gives "7" and 1.5 gives "1.5";
//   - bool: "true" or "false";
//   - Go integer types: decimal;
//   - objects and arrays: compact JSON with no HTML escaping. Such keys
//     usually contain a colon and are then rejected, which is intended.
func KeyString(v any) (key string, ok bool) {
	switch x := v.(type) {
	case nil:
		return "", false
	case string:
		return x, true
	case json.Number:
		return string(x), true
	case bool:
		return strconv.FormatBool(x), true
	case float64:
		return formatFloat(x, 64), true
	case float32:
		return formatFloat(float64(x), 32), true
	case int:
		return strconv.Itoa(x), true
	case int8:
		return strconv.FormatInt(int64(x), 10), true
	case int16:
		return strconv.FormatInt(int64(x), 10), true
	case int32:
		return strconv.FormatInt(int64(x), 10), true
	case int64:
		return strconv.FormatInt(x, 10), true
	case uint:
		return strconv.FormatUint(uint64(x), 10), true
	case uint8:
		return strconv.FormatUint(uint64(x), 10), true
	case uint16:
		return strconv.FormatUint(uint64(x), 10), true
	case uint32:
		return strconv.FormatUint(uint64(x), 10), true
	case uint64:
		return strconv.FormatUint(x, 10), true
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // "<" in a key should read as "<" in the stream name
	if err := enc.Encode(v); err != nil {
		// Not a JSON value (a channel, a func); no decoder produces one.
		return fmt.Sprint(v), true
	}
	return strings.TrimSuffix(buf.String(), "\n"), true
}

// formatFloat writes f as encoding/json would, so a value re-encoded for the
// stream name matches the message body. NaN and infinities, which JSON cannot
// hold, get strconv's text.
func formatFloat(f float64, bits int) string {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return strconv.FormatFloat(f, 'g', -1, bits)
	}
	var b []byte // json.Marshal cannot fail for a finite float
	if bits == 32 {
		b, _ = json.Marshal(float32(f))
	} else {
		b, _ = json.Marshal(f)
	}
	return string(b)
}

// Validate coerces raw with [KeyString] and checks it with [KeyReason]. It
// returns the key, or a [*KeyError] (which wraps [ErrInvalidKey]).
func Validate(raw any, backfillSuffix string) (string, error) {
	key, ok := KeyString(raw)
	if !ok {
		return "", &KeyError{Reason: KeyReason("", backfillSuffix)}
	}
	if reason := KeyReason(key, backfillSuffix); reason != "" {
		return "", &KeyError{Key: key, Reason: reason}
	}
	return key, nil
}

// StreamName is the partition stream of key in category: "{category}:{key}".
func StreamName(category, key string) string {
	return category + ":" + key
}

// LaneStreamName is the lane stream of key in category:
// "{category}:{key}:{suffix}". With the backfill suffix it is the
// low-priority lane; with [DLQToken] it is the partition's DLQ.
func LaneStreamName(category, key, suffix string) string {
	return category + ":" + key + ":" + suffix
}

// FieldValue decodes the JSON object data and returns the value its field
// holds (nil when it has none), numbers as json.Number: the form
// [KeyString] and [Validate] take. It is the one place an event's
// partition key is read out of its payload.
func FieldValue(data json.RawMessage, field string) (any, error) {
	var fields map[string]any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&fields); err != nil {
		return nil, err
	}
	return fields[field], nil
}

// FieldKey is the partition key data's field holds, if it holds one, by
// [KeyString]'s rules (no validation: the key of a stored event passed it
// when the event was committed).
func FieldKey(data json.RawMessage, field string) (string, bool) {
	v, err := FieldValue(data, field)
	if err != nil {
		return "", false
	}
	return KeyString(v)
}
