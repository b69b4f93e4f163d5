package pdk

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"

	"github.com/proteanhq/protean-host/abi"
)

// The module a WASM binary declares. A binary is one module, so the kit
// keeps one registry, filled by the author's init functions and read by the
// exports.
var mod = &registry{}

type registry struct {
	info     abi.ModuleInfo
	messages []abi.Message
	handlers []*Handler
	problems []string
}

// Module names the module and its version. Call it once, from init.
func Module(name, version string) {
	mod.info = abi.ModuleInfo{Name: name, Version: version}
}

// Command declares a command type whose payload is T, targeting aggregates
// of category. Its fields are T's JSON fields.
func Command[T any](typ, category string) { declare[T](abi.MessageCommand, typ, category) }

// Event declares an event type whose payload is T, appended to streams of
// category. Its fields are T's JSON fields.
func Event[T any](typ, category string) { declare[T](abi.MessageEvent, typ, category) }

// Message declares a message type with explicit fields, for payloads that
// are not Go structs.
func Message(kind abi.MessageKind, typ, category string, fields ...abi.Field) {
	for _, m := range mod.messages {
		if m.Type == typ {
			mod.problems = append(mod.problems, fmt.Sprintf("message type %s declared twice", typ))
			return
		}
	}
	mod.messages = append(mod.messages, abi.Message{Type: typ, Kind: kind, Category: category, Fields: fields})
}

func declare[T any](kind abi.MessageKind, typ, category string) {
	Message(kind, typ, category, FieldsOf(reflect.TypeFor[T]())...)
}

// FieldsOf lists the top-level JSON fields of a struct type as
// encoding/json would name them: the json tag's name, else the Go name;
// embedded structs are flattened; "-" and unexported fields are skipped.
// A field is required unless it is a pointer or an interface, is tagged
// omitempty or omitzero, or comes from an embedded pointer: a payload
// without it would leave a zero value the handler cannot tell from a
// client's omission.
func FieldsOf(t reflect.Type) []abi.Field {
	return fieldsOf(t, true)
}

func fieldsOf(t reflect.Type, required bool) []abi.Field {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	var out []abi.Field
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		optional := f.Type.Kind() == reflect.Pointer || f.Type.Kind() == reflect.Interface ||
			hasOption(opts, "omitempty") || hasOption(opts, "omitzero")
		if f.Anonymous && name == "" {
			out = append(out, fieldsOf(f.Type, required && f.Type.Kind() != reflect.Pointer)...)
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, abi.Field{Name: name, Type: fieldType(f.Type), Required: required && !optional})
	}
	return out
}

func hasOption(opts, want string) bool {
	for opts != "" {
		var o string
		o, opts, _ = strings.Cut(opts, ",")
		if o == want {
			return true
		}
	}
	return false
}

func fieldType(t reflect.Type) abi.FieldType {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return abi.FieldString
	case reflect.Bool:
		return abi.FieldBool
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return abi.FieldInt
	case reflect.Float32, reflect.Float64:
		return abi.FieldFloat
	case reflect.Struct, reflect.Map:
		return abi.FieldObject
	case reflect.Slice, reflect.Array:
		return abi.FieldArray
	}
	return abi.FieldAny
}

// Handler is a handler being declared. Its methods return it, so options
// chain: pdk.Projector("client_orders", "order").SequentialBy("client_id").
type Handler struct {
	decl   abi.Handler
	routes map[string]func(*Context, json.RawMessage) error
}

func newHandler(name string, kind abi.Kind, category string) *Handler {
	h := &Handler{
		decl:   abi.Handler{Name: name, Kind: kind, Category: category},
		routes: map[string]func(*Context, json.RawMessage) error{},
	}
	mod.handlers = append(mod.handlers, h)
	return h
}

// CommandHandler declares a command handler for aggregates of category.
func CommandHandler(name, category string) *Handler {
	return newHandler(name, abi.KindCommandHandler, category)
}

// EventHandler declares an event handler subscribed to category.
func EventHandler(name, category string) *Handler {
	return newHandler(name, abi.KindEventHandler, category)
}

// Projector declares a projector subscribed to category. Its documents are
// records of kind projection whose type is the projector's name.
func Projector(name, category string) *Handler {
	return newHandler(name, abi.KindProjector, category)
}

// ProcessManager declares a process manager. It subscribes to the
// categories of the events it handles, and its state is a record of kind
// process keyed by the correlation value.
func ProcessManager(name string) *Handler {
	return newHandler(name, abi.KindProcessManager, "")
}

// SequentialBy partitions the handler's category by field: two events with
// the same value of field never run at once and commit in publish order.
func (h *Handler) SequentialBy(field string) *Handler {
	h.decl.SequentialBy = abi.SequentialBy{Field: field}
	return h
}

// DocumentsByKey declares that a projector's documents are keyed by its
// SequentialBy field: an event whose field holds K writes only document K
// of the projector. The host enforces it, and a read of document K as of
// a position then waits for K's partition only (see abi.Handler).
func (h *Handler) DocumentsByKey() *Handler {
	h.decl.DocumentsByKey = true
	return h
}

// SequentialByCorrelation partitions a process manager by its correlation
// value: each category it handles is partitioned by that category's
// correlate field.
func (h *Handler) SequentialByCorrelation() *Handler {
	h.decl.SequentialBy = abi.SequentialBy{Correlation: true}
	return h
}

// Correlate names, for a process manager, the field of event type typ that
// holds the correlation value.
func (h *Handler) Correlate(typ, field string) *Handler {
	if h.decl.Correlate == nil {
		h.decl.Correlate = map[string]string{}
	}
	h.decl.Correlate[typ] = field
	return h
}

// Idempotent declares that handling a message twice has the effect of
// handling it once.
func (h *Handler) Idempotent() *Handler {
	h.decl.Idempotent = true
	return h
}

// Name is the handler's name.
func (h *Handler) Name() string { return h.decl.Name }

// On routes messages of type typ to fn, decoding the payload into T. Declare
// typ with Command, Event or Message as well.
func On[T any](h *Handler, typ string, fn func(ctx *Context, msg T) error) *Handler {
	if _, dup := h.routes[typ]; dup {
		mod.problems = append(mod.problems, fmt.Sprintf("handler %s: %s routed twice", h.decl.Name, typ))
		return h
	}
	h.decl.Handles = append(h.decl.Handles, typ)
	command := h.decl.Kind == abi.KindCommandHandler
	h.routes[typ] = func(ctx *Context, data json.RawMessage) error {
		var msg T
		if err := decodeJSON(data, &msg); err != nil {
			return decodeError(typ, command, err)
		}
		return fn(ctx, msg)
	}
	return h
}

// Manifest returns the manifest the module's declarations describe, as the
// protean_manifest export writes it.
func Manifest() (*abi.Manifest, error) {
	if len(mod.problems) > 0 {
		return nil, fmt.Errorf("pdk: %s", strings.Join(mod.problems, "; "))
	}
	m := &abi.Manifest{ABIVersion: ABIVersion(), Module: mod.info, Messages: mod.messages}
	for _, h := range mod.handlers {
		m.Handlers = append(m.Handlers, h.decl)
	}
	return m, nil
}

func manifestJSON() ([]byte, error) {
	m, err := Manifest()
	if err != nil {
		return nil, err
	}
	return json.Marshal(m)
}

func (r *registry) handler(name string) *Handler {
	for _, h := range r.handlers {
		if h.decl.Name == name {
			return h
		}
	}
	return nil
}

// abiFlag selects the ABI the module speaks. Empty (the default) is the
// newest, abi.Version (v2, the fast path); "1" builds a module that speaks
// ABI v1 (JSON through Extism memory), for hosts that predate v2:
//
//	go build -ldflags "-X github.com/proteanhq/protean-host/pdk.abiFlag=1" …
var abiFlag = ""

// ABIVersion is the ABI version the module declares and speaks.
func ABIVersion() int {
	if abiFlag == "1" {
		return 1
	}
	return abi.Version
}
