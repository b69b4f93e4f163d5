package abi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Kind is the kind of a handler.
type Kind string

// Handler kinds.
const (
	// KindCommandHandler handles commands synchronously, one at a time, and
	// returns the effects of each (typically aggregate writes and events).
	KindCommandHandler Kind = "command_handler"
	// KindEventHandler reacts to events of one stream category.
	KindEventHandler Kind = "event_handler"
	// KindProjector maintains read-model documents from events of one
	// stream category.
	KindProjector Kind = "projector"
	// KindProcessManager coordinates a long-running process across
	// categories; its state is keyed by a correlation value.
	KindProcessManager Kind = "process_manager"
)

// Valid reports whether k is a known handler kind.
func (k Kind) Valid() bool {
	switch k {
	case KindCommandHandler, KindEventHandler, KindProjector, KindProcessManager:
		return true
	}
	return false
}

// MessageKind says whether a declared message type is a command or an event.
type MessageKind string

// Message kinds.
const (
	MessageCommand MessageKind = "command"
	MessageEvent   MessageKind = "event"
)

// FieldType is the declared type of a message field. The host checks a
// command's payload against it before any guest runs (see
// Message.CheckPayload); it never coerces a value.
type FieldType string

// Field types.
const (
	FieldString FieldType = "string"
	FieldInt    FieldType = "int"
	FieldFloat  FieldType = "float"
	FieldBool   FieldType = "bool"
	FieldObject FieldType = "object"
	FieldArray  FieldType = "array"
	FieldAny    FieldType = "any"
)

func (t FieldType) valid() bool {
	switch t {
	case FieldString, FieldInt, FieldFloat, FieldBool, FieldObject, FieldArray, FieldAny:
		return true
	}
	return false
}

// Manifest is what a module declares about itself, returned by the
// protean_manifest export.
type Manifest struct {
	// ABIVersion must equal Version.
	ABIVersion int `json:"abi_version"`
	// Module names the module and its version.
	Module ModuleInfo `json:"module"`
	// Messages declares every message type the module handles or emits,
	// with its fields.
	Messages []Message `json:"messages"`
	// Handlers declares the module's handlers.
	Handlers []Handler `json:"handlers"`
}

// ModuleInfo names a module.
type ModuleInfo struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

// Message declares a message type.
type Message struct {
	// Type is the message type name, unique across the deployment
	// (e.g. "OrderPlaced").
	Type string `json:"type"`
	// Kind is "command" or "event".
	Kind MessageKind `json:"kind"`
	// Category is the stream category: for an event, the category of the
	// streams it is appended to; for a command, the category of the
	// aggregate it targets.
	Category string `json:"category"`
	// Fields lists the payload's top-level fields.
	Fields []Field `json:"fields"`
}

// HasField reports whether m declares a field named name.
func (m Message) HasField(name string) bool {
	for _, f := range m.Fields {
		if f.Name == name {
			return true
		}
	}
	return false
}

// Field declares one top-level payload field.
type Field struct {
	Name string    `json:"name"`
	Type FieldType `json:"type,omitempty"`
	// Required says a payload must carry the field, and not as null.
	// Added within ABI version 1: optional, absent means false.
	Required bool `json:"required,omitempty"`
}

// Handler declares one handler of a module.
type Handler struct {
	// Name is unique within the module. Projectors and process managers
	// also name their projection documents and state by it.
	Name string `json:"name"`
	Kind Kind   `json:"kind"`
	// Category is the stream category the handler subscribes to (event
	// handler, projector) or whose aggregates it changes (command handler).
	// A process manager leaves it empty: its categories are those of the
	// events it handles.
	Category string `json:"category,omitempty"`
	// Handles lists the message types the handler accepts, each declared in
	// Messages.
	Handles []string `json:"handles"`
	// SequentialBy is the partition key: a field name for an event handler,
	// projector or command handler; true for a process manager, which then
	// partitions each category by its correlate field.
	SequentialBy SequentialBy `json:"sequential_by,omitzero"`
	// Correlate maps each handled event type of a process manager to the
	// event field holding the correlation value.
	Correlate map[string]string `json:"correlate,omitempty"`
	// Idempotent declares that handling a message twice has the effect of
	// handling it once.
	Idempotent bool `json:"idempotent,omitempty"`
	// DocumentsByKey declares, for a projector with a sequential_by field,
	// that each of its documents is keyed by that field's value: an event
	// of key K writes only the document K. The host enforces it (a write
	// of another document fails the message, permanently) and relies on
	// it: a read of document K "as of" a position waits for key K's
	// partition alone. Added within ABI version 1: optional, absent means
	// false.
	DocumentsByKey bool `json:"documents_by_key,omitempty"`
}

// SequentialBy is a handler's partition-key declaration. In JSON it is
// absent or null (not partitioned), a string (a field name), or true (a
// process manager partitions by its correlate fields). false means not
// partitioned.
type SequentialBy struct {
	Field       string
	Correlation bool
}

// IsZero reports whether the handler is not partitioned.
func (s SequentialBy) IsZero() bool { return s.Field == "" && !s.Correlation }

// String renders the declaration as an author wrote it.
func (s SequentialBy) String() string {
	switch {
	case s.Correlation:
		return "true"
	case s.Field != "":
		return s.Field
	}
	return ""
}

// MarshalJSON implements json.Marshaler.
func (s SequentialBy) MarshalJSON() ([]byte, error) {
	switch {
	case s.Correlation && s.Field != "":
		return nil, errors.New("sequential_by: both a field and true")
	case s.Correlation:
		return []byte("true"), nil
	case s.Field != "":
		return json.Marshal(s.Field)
	}
	return []byte("null"), nil
}

// UnmarshalJSON implements json.Unmarshaler.
func (s *SequentialBy) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case bytes.Equal(b, []byte("null")), bytes.Equal(b, []byte("false")):
		*s = SequentialBy{}
		return nil
	case bytes.Equal(b, []byte("true")):
		*s = SequentialBy{Correlation: true}
		return nil
	}
	var f string
	if err := json.Unmarshal(b, &f); err != nil {
		return errors.New("sequential_by must be a field name, true, or null")
	}
	if f == "" {
		return errors.New("sequential_by must not be an empty string")
	}
	*s = SequentialBy{Field: f}
	return nil
}

// ErrManifest marks a manifest that cannot be used. DecodeManifest wraps it.
var ErrManifest = errors.New("invalid manifest")

var namePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.]*$`)

// categoryPattern excludes '-' (MessageDB's stream separator) and ':' (the
// partition-stream separator).
var categoryPattern = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// DecodeManifest parses and checks a manifest a module returned. It checks
// the manifest on its own: shapes, names, references within the module. The
// ABI version is not checked here (the host reports a mismatch with both
// versions); rules that span modules are the host's.
func DecodeManifest(b []byte) (*Manifest, error) {
	if len(b) > MaxManifestBytes {
		return nil, fmt.Errorf("%w: %d bytes exceeds the %d-byte limit", ErrManifest, len(b), MaxManifestBytes)
	}
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrManifest, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: trailing data after the JSON object", ErrManifest)
	}
	if err := m.check(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrManifest, err)
	}
	return &m, nil
}

// Message returns the module's declaration of a message type.
func (m *Manifest) Message(typ string) (Message, bool) {
	for _, msg := range m.Messages {
		if msg.Type == typ {
			return msg, true
		}
	}
	return Message{}, false
}

func checkName(what, s string) error {
	if s == "" {
		return fmt.Errorf("%s is empty", what)
	}
	if len(s) > MaxNameLength {
		return fmt.Errorf("%s %.32q... is longer than %d characters", what, s, MaxNameLength)
	}
	if !namePattern.MatchString(s) {
		return fmt.Errorf("%s %q must match %s", what, s, namePattern)
	}
	return nil
}

func checkCategory(what, s string) error {
	if len(s) > MaxNameLength {
		return fmt.Errorf("%s %.32q... is longer than %d characters", what, s, MaxNameLength)
	}
	if !categoryPattern.MatchString(s) {
		return fmt.Errorf("%s %q must match %s (no '-' or ':')", what, s, categoryPattern)
	}
	return nil
}

func (m *Manifest) check() error {
	if m.ABIVersion <= 0 {
		return errors.New("abi_version is missing")
	}
	if err := checkName("module.name", m.Module.Name); err != nil {
		return err
	}
	if m.Module.Version == "" || len(m.Module.Version) > MaxNameLength || strings.ContainsAny(m.Module.Version, " \t\r\n") {
		return fmt.Errorf("module.version %q must be 1-%d characters without spaces", m.Module.Version, MaxNameLength)
	}
	msgs := make(map[string]Message, len(m.Messages))
	for i, msg := range m.Messages {
		if err := checkName(fmt.Sprintf("messages[%d].type", i), msg.Type); err != nil {
			return err
		}
		if _, dup := msgs[msg.Type]; dup {
			return fmt.Errorf("message type %s is declared twice", msg.Type)
		}
		msgs[msg.Type] = msg
		if msg.Kind != MessageCommand && msg.Kind != MessageEvent {
			return fmt.Errorf("message %s: kind %q must be \"command\" or \"event\"", msg.Type, msg.Kind)
		}
		if err := checkCategory("message "+msg.Type+": category", msg.Category); err != nil {
			return err
		}
		seen := make(map[string]bool, len(msg.Fields))
		for _, f := range msg.Fields {
			if err := checkName("message "+msg.Type+": field name", f.Name); err != nil {
				return err
			}
			if seen[f.Name] {
				return fmt.Errorf("message %s: field %s is declared twice", msg.Type, f.Name)
			}
			seen[f.Name] = true
			if f.Type != "" && !f.Type.valid() {
				return fmt.Errorf("message %s: field %s: unknown type %q", msg.Type, f.Name, f.Type)
			}
		}
	}
	if len(m.Handlers) == 0 {
		return errors.New("the module declares no handlers")
	}
	names := make(map[string]bool, len(m.Handlers))
	for i, h := range m.Handlers {
		if err := checkName(fmt.Sprintf("handlers[%d].name", i), h.Name); err != nil {
			return err
		}
		if names[h.Name] {
			return fmt.Errorf("handler %s is declared twice", h.Name)
		}
		names[h.Name] = true
		if err := h.check(msgs); err != nil {
			return fmt.Errorf("handler %s: %v", h.Name, err)
		}
	}
	return nil
}

func (h *Handler) check(msgs map[string]Message) error {
	if !h.Kind.Valid() {
		return fmt.Errorf("unknown kind %q", h.Kind)
	}
	if len(h.Handles) == 0 {
		return errors.New("handles no message types")
	}
	want := MessageEvent
	if h.Kind == KindCommandHandler {
		want = MessageCommand
	}
	if h.Kind == KindProcessManager {
		if h.Category != "" {
			return errors.New("a process manager takes its categories from its events; category must be empty")
		}
		if h.SequentialBy.Field != "" {
			return fmt.Errorf("a process manager's sequential_by must be true or absent, not %q", h.SequentialBy.Field)
		}
	} else {
		if err := checkCategory("category", h.Category); err != nil {
			return err
		}
		if h.SequentialBy.Correlation {
			return errors.New("sequential_by = true is for process managers; name a field instead")
		}
		if len(h.Correlate) > 0 {
			return errors.New("correlate is for process managers")
		}
	}
	if h.SequentialBy.Field != "" {
		if err := checkName("sequential_by", h.SequentialBy.Field); err != nil {
			return err
		}
	}
	if h.DocumentsByKey && (h.Kind != KindProjector || h.SequentialBy.Field == "") {
		return errors.New("documents_by_key is for a projector with a sequential_by field")
	}
	seen := make(map[string]bool, len(h.Handles))
	for _, typ := range h.Handles {
		if seen[typ] {
			return fmt.Errorf("handles %s twice", typ)
		}
		seen[typ] = true
		msg, ok := msgs[typ]
		if !ok {
			return fmt.Errorf("handles %s, which the module does not declare in messages", typ)
		}
		if msg.Kind != want {
			return fmt.Errorf("a %s handles %ss, but %s is a %s", h.Kind, want, typ, msg.Kind)
		}
		if h.Kind != KindProcessManager && msg.Category != h.Category {
			return fmt.Errorf("handles %s of category %q, but the handler's category is %q", typ, msg.Category, h.Category)
		}
		if h.Kind == KindProcessManager {
			f, ok := h.Correlate[typ]
			if !ok || f == "" {
				return fmt.Errorf("has no correlate field for %s", typ)
			}
			if err := checkName("correlate field for "+typ, f); err != nil {
				return err
			}
		}
	}
	for typ := range h.Correlate {
		if !seen[typ] {
			return fmt.Errorf("correlate names %s, which the handler does not handle", typ)
		}
	}
	return nil
}
