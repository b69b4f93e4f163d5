package abi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Envelope is one message as the host hands it to a handler.
type Envelope struct {
	// ID is unique per message (a UUID string).
	ID string `json:"id"`
	// Type is the message type, e.g. "OrderPlaced".
	Type string `json:"type"`
	// Stream is the event's stream ("order-o-1"); empty for a command.
	Stream string `json:"stream,omitempty"`
	// Position is the event's 0-based position in its stream.
	Position int64 `json:"position"`
	// GlobalPosition is the event's 1-based position in the store; 0 for a
	// command.
	GlobalPosition int64 `json:"global_position"`
	// Time is when the event was recorded or the command received (UTC).
	Time time.Time `json:"time"`
	// Data is the message payload, a JSON object.
	Data json.RawMessage `json:"data"`
	// Metadata carries correlation and causation identifiers and anything
	// the host or the sender attached.
	Metadata *Metadata `json:"metadata,omitempty"`
}

// Metadata travels with a message.
type Metadata struct {
	CorrelationID string `json:"correlation_id,omitempty"`
	CausationID   string `json:"causation_id,omitempty"`
	// Tenant is the tenant the message belongs to.
	Tenant string `json:"tenant,omitempty"`
	// Module is the module whose handler produced the event: its name,
	// version and the SHA-256 of its file, so an event can be traced to
	// the exact code that wrote it across reloads. The host sets it on
	// every event it appends. Added within ABI version 1: optional.
	Module *ModuleRef `json:"module,omitempty"`
	// CascadeDepth is how many handler steps separate the message from the
	// command that began its causation chain (0 for a command from
	// outside): the events and follow-up commands of a message at depth d
	// are at d+1. The host sets it and bounds it; a guest cannot.
	CascadeDepth int `json:"cascade_depth,omitempty"`
	// TraceParent and TraceState are the W3C trace context of the span
	// that created the message (https://www.w3.org/TR/trace-context/),
	// when the host traces (OpenTelemetry, [telemetry] tracing): the
	// consumers of an event link their spans to it, so a causation chain
	// is one trace across hosts. The host sets them; a guest reads them.
	// Added within ABI version 1: optional.
	TraceParent string `json:"traceparent,omitempty"`
	TraceState  string `json:"tracestate,omitempty"`
}

// ModuleRef identifies a module build.
type ModuleRef struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	SHA256  string `json:"sha256"`
}

// HandleRequest is the input of protean_handle: a batch of messages for one
// handler, to be handled in order.
type HandleRequest struct {
	Handler  string     `json:"handler"`
	Messages []Envelope `json:"messages"`
}

// HandleResponse is the output of protean_handle: one Result per message of
// the request, in the same order. The host commits the results before the
// first error, then retries the failed message alone; results after the
// first error are ignored. A module may stop at its first error and return
// fewer results than messages, but a short response must end with an error.
type HandleResponse struct {
	Results []Result `json:"results"`
}

// Result is the outcome of handling one message: either Effects to commit or
// an Error.
type Result struct {
	Effects *Effects `json:"effects,omitempty"`
	Error   *Error   `json:"error,omitempty"`
}

// Effects is everything a handler asks the host to change. The guest has no
// other way to touch the world; the host commits all effects of a message in
// one unit of work, or none.
type Effects struct {
	// Events to append, in order.
	Events []NewEvent `json:"events,omitempty"`
	// Writes to records (aggregates, projection documents, process state),
	// each guarded by its expected version.
	Writes []Write `json:"writes,omitempty"`
	// Commands to dispatch after the unit of work commits.
	Commands []NewCommand `json:"commands,omitempty"`
}

// Empty reports whether e changes nothing.
func (e *Effects) Empty() bool {
	return e == nil || (len(e.Events) == 0 && len(e.Writes) == 0 && len(e.Commands) == 0)
}

// AnyVersion as an event's expected version skips the stream-version check.
// NoStream expects the stream not to exist yet.
const (
	AnyVersion int64 = -2
	NoStream   int64 = -1
)

// NewEvent is an event a handler asks to append.
type NewEvent struct {
	// Stream is "{category}-{id}"; the category must be the one the event
	// type is declared on.
	Stream string `json:"stream"`
	Type   string `json:"type"`
	// Data is the payload, a JSON object.
	Data json.RawMessage `json:"data"`
	// ExpectedVersion is the stream version the append expects: the
	// position of its last event, NoStream (-1) for a new stream, or absent
	// (AnyVersion) for no check. Several events of one stream in one result
	// share the check: the first is checked, the rest follow it.
	ExpectedVersion *int64 `json:"expected_version,omitempty"`
	// ID optionally fixes the event's id (for idempotent appends); the host
	// assigns one otherwise.
	ID string `json:"id,omitempty"`
}

// RecordKind says which store a record lives in.
type RecordKind string

// Record kinds.
const (
	// RecordAggregate is an aggregate's state; Type is its category.
	RecordAggregate RecordKind = "aggregate"
	// RecordProjection is a read-model document; Type is the projection
	// (projector) name.
	RecordProjection RecordKind = "projection"
	// RecordProcess is a process manager's state; Type is the process
	// manager's name and ID the correlation value.
	RecordProcess RecordKind = "process"
)

func (k RecordKind) valid() bool {
	return k == RecordAggregate || k == RecordProjection || k == RecordProcess
}

// Write replaces one record, guarded by optimistic concurrency.
type Write struct {
	Kind RecordKind `json:"kind"`
	Type string     `json:"type"`
	ID   string     `json:"id"`
	// ExpectedVersion is the version the record has now, as a load
	// returned it: 0 for a record that never existed. The write gives it
	// ExpectedVersion+1. A mismatch
	// fails the whole result with a conflict.
	ExpectedVersion int64 `json:"expected_version"`
	// Data is the record's new state, a JSON object; null deletes it.
	Data json.RawMessage `json:"data"`
}

// NewCommand is a command a handler (typically a process manager) asks the
// host to dispatch after its unit of work commits.
type NewCommand struct {
	Type string          `json:"type"`
	Data json.RawMessage `json:"data"`
}

// ErrorKind says what the host should do with a failed message.
type ErrorKind string

// Error kinds.
const (
	// ErrorTransient: a retry may succeed (a dependency was unavailable, a
	// version conflict). The host retries with backoff.
	ErrorTransient ErrorKind = "transient"
	// ErrorRejected: the message is invalid for the current state (a
	// business rule said no). A retry will not help; a command answers 422.
	ErrorRejected ErrorKind = "rejected"
	// ErrorPermanent: the handler cannot handle the message (a bug, bad
	// data). A retry will not help; a command answers 500, an event halts
	// its partition or goes to the dead-letter queue.
	ErrorPermanent ErrorKind = "permanent"
)

// Retryable reports whether a retry of the message can help.
func (k ErrorKind) Retryable() bool { return k == ErrorTransient }

func (k ErrorKind) valid() bool {
	return k == ErrorTransient || k == ErrorRejected || k == ErrorPermanent
}

// Error is a handler's failure to handle one message.
type Error struct {
	Kind    ErrorKind `json:"kind"`
	Message string    `json:"message"`
}

// Error implements error.
func (e *Error) Error() string { return string(e.Kind) + ": " + e.Message }

// LoadRequest is the input of the protean_load host function.
type LoadRequest struct {
	Kind RecordKind `json:"kind"`
	Type string     `json:"type"`
	ID   string     `json:"id"`
}

// LoadResponse is the output of protean_load. A record that does not exist
// has Found false and Version 0, or, if it was deleted, the version of the
// deletion (a write must expect that version). Error is set when the load
// failed, and ErrorKind says why.
type LoadResponse struct {
	Found   bool            `json:"found"`
	Version int64           `json:"version"`
	Data    json.RawMessage `json:"data,omitempty"`
	Error   string          `json:"error,omitempty"`
	// ErrorKind classifies Error. Added within ABI version 1: it is
	// optional, a module that does not know it ignores it, and a response
	// without it (an older host) is to be read as HostTransient.
	ErrorKind HostErrorKind `json:"error_kind,omitempty"`
}

// HostErrorKind says why a host function refused or failed a request, so a
// module can tell a failure a retry may cure from one it never will.
type HostErrorKind string

// Host-function error kinds.
const (
	// HostScope: the request is outside what the module may touch (a
	// record of another module's handler, a stream of a category the
	// module declares nothing on). A retry will never succeed.
	HostScope HostErrorKind = "scope"
	// HostInvalid: the request is malformed, over a limit, or made outside
	// a protean_handle call. A retry will never succeed.
	HostInvalid HostErrorKind = "invalid"
	// HostNotFound: what the request names does not exist where the host
	// expects it to (a missing record is not this: Load answers it with
	// Found false). A retry of the same request will not succeed.
	HostNotFound HostErrorKind = "not_found"
	// HostConflict: the store refused the read for a concurrent change. A
	// retry may succeed.
	HostConflict HostErrorKind = "conflict"
	// HostTransient: the store failed or the call was canceled. A retry
	// may succeed.
	HostTransient HostErrorKind = "transient"
)

// Retryable reports whether the same request may succeed later. An empty
// or unknown kind (an older or newer host) counts as transient, which is
// what every host-function error meant before kinds existed.
func (k HostErrorKind) Retryable() bool {
	switch k {
	case HostScope, HostInvalid, HostNotFound:
		return false
	}
	return true
}

// HandlerKind is the ErrorKind a handler's result takes when it fails
// because of a host-function error of kind k: permanent for a request a
// retry can never satisfy (a scope violation is a bug in the module, not
// the domain saying no, so it is permanent rather than rejected),
// transient otherwise.
func (k HostErrorKind) HandlerKind() ErrorKind {
	if k.Retryable() {
		return ErrorTransient
	}
	return ErrorPermanent
}

// ReadStreamRequest is the input of the protean_read_stream host function:
// events of Stream from position From (inclusive), at most Limit of them
// (the host caps Limit, and bounds a page by bytes too: a page shorter
// than Limit is not the end of the stream; an empty one is).
type ReadStreamRequest struct {
	Stream string `json:"stream"`
	From   int64  `json:"from"`
	Limit  int    `json:"limit"`
}

// ReadStreamResponse is the output of protean_read_stream.
type ReadStreamResponse struct {
	Messages []Envelope `json:"messages"`
	Error    string     `json:"error,omitempty"`
	// ErrorKind classifies Error, as in LoadResponse.
	ErrorKind HostErrorKind `json:"error_kind,omitempty"`
}

// ErrResponse marks a HandleResponse or host-function request that cannot
// be used. The decoders wrap it.
var ErrResponse = errors.New("invalid module output")

func decodeStrict(b []byte, limit int, v any) error {
	if len(b) > limit {
		return fmt.Errorf("%w: %d bytes exceeds the %d-byte limit", ErrResponse, len(b), limit)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %v", ErrResponse, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: trailing data after the JSON object", ErrResponse)
	}
	return nil
}

// DecodeHandleResponse parses and checks the output of protean_handle for a
// request of n messages, with limit bounding its size.
func DecodeHandleResponse(b []byte, n, limit int) (*HandleResponse, error) {
	var r HandleResponse
	if err := decodeStrict(b, limit, &r); err != nil {
		return nil, err
	}
	if err := checkResults(&r, n); err != nil {
		return nil, err
	}
	return &r, nil
}

// checkResults checks a decoded HandleResponse (v1 or v2) for a request of
// n messages.
func checkResults(r *HandleResponse, n int) error {
	if len(r.Results) == 0 && n > 0 {
		return fmt.Errorf("%w: no results for %d messages", ErrResponse, n)
	}
	if len(r.Results) > n {
		return fmt.Errorf("%w: %d results for %d messages", ErrResponse, len(r.Results), n)
	}
	for i, res := range r.Results {
		if err := res.check(); err != nil {
			return fmt.Errorf("%w: results[%d]: %w", ErrResponse, i, err)
		}
	}
	if len(r.Results) < n && r.Results[len(r.Results)-1].Error == nil {
		return fmt.Errorf("%w: %d results for %d messages and the last is not an error", ErrResponse, len(r.Results), n)
	}
	return nil
}

func (r *Result) check() error {
	if r.Effects != nil && r.Error != nil {
		return errors.New("both effects and error are set")
	}
	if r.Error != nil {
		if !r.Error.Kind.valid() {
			return fmt.Errorf("error kind %q must be transient, rejected or permanent", r.Error.Kind)
		}
		return nil
	}
	if r.Effects == nil {
		return nil // nothing to do
	}
	for i, ev := range r.Effects.Events {
		if err := checkName(fmt.Sprintf("events[%d].type", i), ev.Type); err != nil {
			return err
		}
		if _, _, err := SplitStream(ev.Stream); err != nil {
			return fmt.Errorf("events[%d]: %w", i, err)
		}
		if !isObject(ev.Data) {
			return fmt.Errorf("events[%d].data must be a JSON object", i)
		}
		if ev.ExpectedVersion != nil && *ev.ExpectedVersion < NoStream {
			return fmt.Errorf("events[%d].expected_version %d must be >= -1", i, *ev.ExpectedVersion)
		}
	}
	for i, w := range r.Effects.Writes {
		if !w.Kind.valid() {
			return fmt.Errorf("writes[%d].kind %q must be aggregate, projection or process", i, w.Kind)
		}
		if err := checkName(fmt.Sprintf("writes[%d].type", i), w.Type); err != nil {
			return err
		}
		if err := checkID(w.ID); err != nil {
			return fmt.Errorf("writes[%d].id: %w", i, err)
		}
		if w.ExpectedVersion < 0 {
			return fmt.Errorf("writes[%d].expected_version %d must be >= 0", i, w.ExpectedVersion)
		}
		if !isObject(w.Data) && !isNull(w.Data) {
			return fmt.Errorf("writes[%d].data must be a JSON object or null", i)
		}
	}
	for i, c := range r.Effects.Commands {
		if err := checkName(fmt.Sprintf("commands[%d].type", i), c.Type); err != nil {
			return err
		}
		if !isObject(c.Data) {
			return fmt.Errorf("commands[%d].data must be a JSON object", i)
		}
	}
	return nil
}

// MaxIDLength bounds record ids and stream ids.
const MaxIDLength = 255

// IDLengthError is an id (of a record or stream) longer than MaxIDLength.
// It keeps the id, so a host can tell which input it came from; its
// message quotes at most ClipLength bytes of it.
type IDLengthError struct {
	ID string
}

func (e *IDLengthError) Error() string {
	return fmt.Sprintf("%q (%d bytes) is longer than %d bytes", Clip(e.ID, ClipLength), len(e.ID), MaxIDLength)
}

func checkID(id string) error {
	if id == "" {
		return errors.New("empty")
	}
	if len(id) > MaxIDLength {
		return &IDLengthError{ID: id}
	}
	return nil
}

// SplitStream splits a stream name "{category}-{id}" at its first '-'.
func SplitStream(stream string) (category, id string, err error) {
	for i := 0; i < len(stream); i++ {
		if stream[i] == '-' {
			category, id = stream[:i], stream[i+1:]
			if err := checkCategory("stream category", category); err != nil {
				return "", "", fmt.Errorf("stream %q: %v", Clip(stream, ClipLength), err)
			}
			if err := checkID(id); err != nil {
				return "", "", fmt.Errorf("stream %q: %w", Clip(stream, ClipLength), err)
			}
			return category, id, nil
		}
	}
	return "", "", fmt.Errorf("stream %q must be {category}-{id}", Clip(stream, ClipLength))
}

func isObject(b json.RawMessage) bool {
	b = bytes.TrimSpace(b)
	return len(b) > 0 && b[0] == '{'
}

func isNull(b json.RawMessage) bool {
	b = bytes.TrimSpace(b)
	return len(b) == 0 || bytes.Equal(b, []byte("null"))
}

// DecodeLoadRequest parses and checks a guest's protean_load input.
func DecodeLoadRequest(b []byte) (*LoadRequest, error) {
	var r LoadRequest
	if err := decodeStrict(b, MaxHostRequestBytes, &r); err != nil {
		return nil, err
	}
	if err := r.check(); err != nil {
		return nil, err
	}
	return &r, nil
}

func (r *LoadRequest) check() error {
	if !r.Kind.valid() {
		return fmt.Errorf("%w: kind %q must be aggregate, projection or process", ErrResponse, r.Kind)
	}
	if err := checkName("type", r.Type); err != nil {
		return fmt.Errorf("%w: %v", ErrResponse, err)
	}
	if err := checkID(r.ID); err != nil {
		return fmt.Errorf("%w: id %w", ErrResponse, err)
	}
	return nil
}

// DecodeReadStreamRequest parses and checks a guest's protean_read_stream
// input.
func DecodeReadStreamRequest(b []byte) (*ReadStreamRequest, error) {
	var r ReadStreamRequest
	if err := decodeStrict(b, MaxHostRequestBytes, &r); err != nil {
		return nil, err
	}
	if err := r.check(); err != nil {
		return nil, err
	}
	return &r, nil
}

func (r *ReadStreamRequest) check() error {
	if _, _, err := SplitStream(r.Stream); err != nil {
		return fmt.Errorf("%w: %w", ErrResponse, err)
	}
	if r.From < 0 {
		return fmt.Errorf("%w: from %d must be >= 0", ErrResponse, r.From)
	}
	if r.Limit < 0 {
		return fmt.Errorf("%w: limit %d must be >= 0", ErrResponse, r.Limit)
	}
	return nil
}
