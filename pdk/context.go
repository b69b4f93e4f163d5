package pdk

import (
	"encoding/json"
	"fmt"
	"reflect"

	"github.com/proteanhq/protean-host/abi"
)

// Record kinds, for Load and Save.
const (
	Aggregate  = abi.RecordAggregate
	Projection = abi.RecordProjection
	Process    = abi.RecordProcess
)

// host is what the kit needs from the host during a handle: the two host
// functions and logging, whatever the wire (jsonHost for ABI v1, the v2
// host functions in the WASM build). An error is a response the kit could
// not read. Tests use fakes.
type host interface {
	load(req *abi.LoadRequest) (*abi.LoadResponse, error)
	readStream(req *abi.ReadStreamRequest) (*abi.ReadStreamResponse, error)
	log(level, msg string)
}

// Context is what a handler gets besides its message: the message's
// envelope, reads through the host, and the effects it is building.
// Nothing a handler does reaches the world except through these effects,
// which the host commits after the handler returns nil.
type Context struct {
	env     abi.Envelope
	handler *Handler
	host    host
	batch   *overlay
	effects abi.Effects
	// staged holds this message's own writes, merged into the batch
	// overlay only if the handler succeeds: a slice, not a map, since a
	// handler writes one or two records and a map per message is most
	// of a projector's garbage in WASM.
	staged []stagedEntry
}

type stagedEntry struct {
	key recordKey
	rec stagedRecord
}

// stagedRecord returns this message's own write of k.
func (c *Context) stagedRecord(k recordKey) (stagedRecord, bool) {
	for i := range c.staged {
		if c.staged[i].key == k {
			return c.staged[i].rec, true
		}
	}
	return stagedRecord{}, false
}

type recordKey struct {
	kind abi.RecordKind
	typ  string
	id   string
}

type stagedRecord struct {
	version int64
	data    json.RawMessage
	// value is what Save was given: a later Load into a value of the same
	// type gets a copy of it instead of decoding data again (decode once
	// per batch). Reference fields (slices, maps) are shared with it.
	value any
}

// overlay carries the writes of the batch's earlier, successful messages,
// so a load sees them (read-your-writes within the unit of work).
type overlay map[recordKey]stagedRecord

// Message is the envelope of the message being handled.
func (c *Context) Message() abi.Envelope { return c.env }

// HandlerName is the name of the handler being run.
func (c *Context) HandlerName() string { return c.handler.decl.Name }

// Load reads a record into v and returns its version: 0 when it never
// existed, its version at deletion when it was deleted (v is then left
// untouched). It sees this batch's earlier
// writes and this message's own.
func (c *Context) Load(kind abi.RecordKind, typ, id string, v any) (version int64, err error) {
	k := recordKey{kind, typ, id}
	if r, ok := c.stagedRecord(k); ok {
		return r.version, r.loadInto(v)
	}
	if r, ok := (*c.batch)[k]; ok {
		return r.version, r.loadInto(v)
	}
	resp, err := c.host.load(&abi.LoadRequest{Kind: kind, Type: typ, ID: id})
	if err != nil {
		return 0, Transient(fmt.Errorf("load %s %s/%s: bad host response: %w", kind, typ, id, err))
	}
	if resp.Error != "" {
		return 0, hostError(abi.HostLoad, fmt.Sprintf("load %s %s/%s", kind, typ, id), resp.Error, resp.ErrorKind)
	}
	if !resp.Found {
		// A deleted record keeps its version, so a write must expect it.
		return resp.Version, nil
	}
	return resp.Version, unmarshalRecord(resp.Data, v)
}

func unmarshalRecord(data json.RawMessage, v any) error {
	if len(data) == 0 || string(data) == "null" {
		return nil
	}
	if err := decodeJSON(data, v); err != nil {
		return Permanent(fmt.Errorf("decode record: %w", err))
	}
	return nil
}

// loadInto sets *v to the staged value when v points to its type, and
// decodes the staged bytes otherwise.
func (r stagedRecord) loadInto(v any) error {
	if r.value != nil && (len(r.data) > 0 && string(r.data) != "null") {
		dst := reflect.ValueOf(v)
		src := reflect.ValueOf(r.value)
		if src.Kind() == reflect.Pointer && !src.IsNil() {
			src = src.Elem()
		}
		if dst.Kind() == reflect.Pointer && !dst.IsNil() && dst.Elem().Type() == src.Type() {
			dst.Elem().Set(src)
			return nil
		}
	}
	return unmarshalRecord(r.data, v)
}

// Save writes a record whose current version is expected (0 for a new one).
// The host commits it only if the record still has that version; otherwise
// the message fails with a conflict and nothing of it is committed.
func (c *Context) Save(kind abi.RecordKind, typ, id string, expected int64, v any) error {
	k := recordKey{kind, typ, id}
	size := 128 // the record's last encoding, if the batch has one, is a better guess
	if r, ok := c.stagedRecord(k); ok {
		size = len(r.data) + 64
	} else if r, ok := (*c.batch)[k]; ok {
		size = len(r.data) + 64
	}
	data, err := encodeJSONSized(v, size)
	if err != nil {
		return Permanent(fmt.Errorf("encode %s %s/%s: %w", kind, typ, id, err))
	}
	c.effects.Writes = append(c.effects.Writes, abi.Write{Kind: kind, Type: typ, ID: id, ExpectedVersion: expected, Data: data})
	rec := stagedRecord{version: expected + 1, data: data, value: v}
	for i := range c.staged {
		if c.staged[i].key == k {
			c.staged[i].rec = rec
			return nil
		}
	}
	c.staged = append(c.staged, stagedEntry{k, rec})
	return nil
}

// Emit appends an event to stream with no expected-version check.
func (c *Context) Emit(stream, typ string, data any) error {
	return c.emit(stream, typ, data, nil)
}

// EmitExpecting appends an event to stream if the stream's version is
// expected (abi.NoStream for a new stream).
func (c *Context) EmitExpecting(stream, typ string, data any, expected int64) error {
	return c.emit(stream, typ, data, &expected)
}

func (c *Context) emit(stream, typ string, data any, expected *int64) error {
	b, err := encodeJSON(data)
	if err != nil {
		return Permanent(fmt.Errorf("encode event %s: %w", typ, err))
	}
	c.effects.Events = append(c.effects.Events, abi.NewEvent{Stream: stream, Type: typ, Data: b, ExpectedVersion: expected})
	return nil
}

// Dispatch asks the host to dispatch a command once this message's effects
// have committed.
func (c *Context) Dispatch(typ string, data any) error {
	b, err := encodeJSON(data)
	if err != nil {
		return Permanent(fmt.Errorf("encode command %s: %w", typ, err))
	}
	c.effects.Commands = append(c.effects.Commands, abi.NewCommand{Type: typ, Data: b})
	return nil
}

// ReadStream reads up to limit events of stream from position from: one
// page, which the host also bounds by bytes, so a page shorter than limit
// is not the end of the stream; read on from the last position plus one
// until a page is empty.
func (c *Context) ReadStream(stream string, from int64, limit int) ([]abi.Envelope, error) {
	resp, err := c.host.readStream(&abi.ReadStreamRequest{Stream: stream, From: from, Limit: limit})
	if err != nil {
		return nil, Transient(fmt.Errorf("read stream %s: bad host response: %w", stream, err))
	}
	if resp.Error != "" {
		return nil, hostError(abi.HostReadStream, "read stream "+stream, resp.Error, resp.ErrorKind)
	}
	return resp.Messages, nil
}

// Log writes a line to the host's log, tagged with the module and handler.
// level is one of "debug", "info", "warn", "error".
func (c *Context) Log(level, msg string) { c.host.log(level, msg) }
