package pdktest

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/pdk"
	"github.com/proteanhq/protean-host/pdk/internal/seam"
)

// ErrConflict: a record or stream was not at the version a handler's
// effect expected. The host would retry the message on fresh state.
var ErrConflict = errors.New("expected-version conflict")

// Host is an in-memory host for the module this test binary registers.
type Host struct {
	tb       testing.TB
	manifest *abi.Manifest
	records  map[key]*stored
	streams  map[string][]abi.Envelope
	global   int64
	ids      int
	logs     []string
	// Now gives the time envelopes carry; time.Now if nil.
	Now func() time.Time
}

type key struct {
	kind abi.RecordKind
	typ  string
	id   string
}

type stored struct {
	version int64
	data    json.RawMessage // nil when deleted
}

// New returns an empty host for the module the test binary registers. It
// fails the test if the module's declarations are inconsistent (what
// protean_manifest would fail on).
func New(tb testing.TB) *Host {
	tb.Helper()
	m, err := pdk.Manifest()
	if err != nil {
		tb.Fatalf("pdktest: %v", err)
	}
	return &Host{tb: tb, manifest: m, records: map[key]*stored{}, streams: map[string][]abi.Envelope{}}
}

// Manifest is the module's manifest, as the host would read it.
func (h *Host) Manifest() *abi.Manifest { return h.manifest }

// Result is what one handler did with one message.
type Result struct {
	// Handler is the handler's name.
	Handler string
	// Effects is what the handler asked for; nil when it failed.
	Effects *abi.Effects
	// Events are the events it appended, as stored (with positions).
	Events []abi.Envelope
	// Err is nil, or a *pdk.Error whose Kind says what the host would do:
	// rejected (a command answers 422), transient (retried), permanent.
	Err error
}

// Kind is the kind of Err: "" when the handler succeeded.
func (r Result) Kind() abi.ErrorKind {
	var e *pdk.Error
	if errors.As(r.Err, &e) {
		return e.Kind
	}
	if r.Err != nil {
		return abi.ErrorPermanent
	}
	return ""
}

// Writes are the record writes the handler made.
func (r Result) Writes() []abi.Write {
	if r.Effects == nil {
		return nil
	}
	return r.Effects.Writes
}

// Commands are the commands the handler asked the host to dispatch.
func (r Result) Commands() []abi.NewCommand {
	if r.Effects == nil {
		return nil
	}
	return r.Effects.Commands
}

// Command runs the module's command handler for typ on a command whose
// payload is data (a struct or a json.RawMessage), and applies its effects
// if it succeeds. A payload that does not match the fields the module
// declares for typ (a wrong type, a missing required or an unknown field)
// fails as the host fails it, before the handler runs: rejected, with an
// *abi.InputError naming the field (errors.Is abi.ErrInput). The test
// fails if no handler of the module handles typ.
func (h *Host) Command(typ string, data any) Result {
	h.tb.Helper()
	for _, hd := range h.manifest.Handlers {
		if hd.Kind == abi.KindCommandHandler && slices.Contains(hd.Handles, typ) {
			env := abi.Envelope{ID: h.newID(), Type: typ, Time: h.now(), Data: h.marshal(data)}
			env.Metadata = &abi.Metadata{CorrelationID: env.ID}
			// The host checks a command's fields against the declaration
			// before any guest runs, and answers a mismatch 422.
			if msg, ok := h.manifest.Message(typ); ok {
				if err := msg.CheckPayload(env.Data); err != nil {
					return Result{Handler: hd.Name, Err: &pdk.Error{Kind: abi.ErrorRejected, Err: err}}
				}
			}
			return h.run(hd.Name, env)
		}
	}
	h.tb.Fatalf("pdktest: module %s has no command handler for %s", h.manifest.Module.Name, typ)
	return Result{}
}

// Event appends an event of type typ with payload data to stream
// ("{category}-{id}") and hands it to each event handler, projector and
// process manager of the module that handles typ, in the manifest's
// order, applying each one's effects if it succeeds. It returns one Result
// per handler; none if no handler handles typ.
func (h *Host) Event(stream, typ string, data any) []Result {
	h.tb.Helper()
	env := h.Append(stream, typ, data)
	var out []Result
	for _, hd := range h.manifest.Handlers {
		if hd.Kind != abi.KindCommandHandler && slices.Contains(hd.Handles, typ) {
			out = append(out, h.run(hd.Name, env))
		}
	}
	return out
}

// Append stores an event without handling it: history a handler will read
// or load. It returns the stored envelope.
func (h *Host) Append(stream, typ string, data any) abi.Envelope {
	h.tb.Helper()
	if _, _, err := abi.SplitStream(stream); err != nil {
		h.tb.Fatalf("pdktest: %v", err)
	}
	env := h.append(abi.NewEvent{Stream: stream, Type: typ, Data: h.marshal(data)}, abi.Metadata{})
	return env
}

// Put stores a record (an aggregate, a projection document, process
// state) as if committed: its version becomes one more than before.
func (h *Host) Put(kind abi.RecordKind, typ, id string, v any) {
	h.tb.Helper()
	k := key{kind, typ, id}
	r := h.records[k]
	if r == nil {
		r = &stored{}
		h.records[k] = r
	}
	r.version++
	r.data = h.marshal(v)
}

// Load reads a record into v (when it exists) and returns its version: 0
// when it was never written.
func (h *Host) Load(kind abi.RecordKind, typ, id string, v any) int64 {
	h.tb.Helper()
	r := h.records[key{kind, typ, id}]
	if r == nil {
		return 0
	}
	if r.data != nil && v != nil {
		if err := json.Unmarshal(r.data, v); err != nil {
			h.tb.Fatalf("pdktest: decode %s %s/%s: %v", kind, typ, id, err)
		}
	}
	return r.version
}

// Stream returns the events stored in stream, in order.
func (h *Host) Stream(stream string) []abi.Envelope {
	return slices.Clone(h.streams[stream])
}

// Logs returns what handlers logged, as "level: message".
func (h *Host) Logs() []string { return slices.Clone(h.logs) }

func (h *Host) now() time.Time {
	if h.Now != nil {
		return h.Now().UTC()
	}
	return time.Now().UTC()
}

func (h *Host) newID() string {
	h.ids++
	return fmt.Sprintf("pdktest-%d", h.ids)
}

func (h *Host) marshal(v any) json.RawMessage {
	h.tb.Helper()
	if raw, ok := v.(json.RawMessage); ok {
		return raw
	}
	b, err := json.Marshal(v)
	if err != nil {
		h.tb.Fatalf("pdktest: encode payload: %v", err)
	}
	return b
}

// run hands env to handler and applies its effects.
func (h *Host) run(handler string, env abi.Envelope) Result {
	h.tb.Helper()
	req, err := json.Marshal(abi.HandleRequest{Handler: handler, Messages: []abi.Envelope{env}})
	if err != nil {
		h.tb.Fatalf("pdktest: %v", err)
	}
	out, err := seam.Handle(req, memHost{h})
	if err != nil {
		// protean_handle itself failed: the host fails the message
		// permanently.
		return Result{Handler: handler, Err: pdk.Permanent(err)}
	}
	resp, err := abi.DecodeHandleResponse(out, 1, len(out)+1)
	if err != nil {
		return Result{Handler: handler, Err: pdk.Permanent(err)}
	}
	r := resp.Results[0]
	if r.Error != nil {
		return Result{Handler: handler, Err: &pdk.Error{Kind: r.Error.Kind, Err: errors.New(r.Error.Message)}}
	}
	res := Result{Handler: handler, Effects: r.Effects}
	if r.Effects == nil {
		res.Effects = &abi.Effects{}
	}
	events, err := h.commit(res.Effects, env)
	if err != nil {
		return Result{Handler: handler, Err: pdk.Transient(err)}
	}
	res.Events = events
	return res
}

// commit applies effects all or nothing: every expected version is checked
// before anything is written.
func (h *Host) commit(e *abi.Effects, cause abi.Envelope) ([]abi.Envelope, error) {
	for _, w := range e.Writes {
		var have int64
		if r := h.records[key{w.Kind, w.Type, w.ID}]; r != nil {
			have = r.version
		}
		if have != w.ExpectedVersion {
			return nil, fmt.Errorf("%w: %s %s/%s is at version %d, the write expected %d", ErrConflict, w.Kind, w.Type, w.ID, have, w.ExpectedVersion)
		}
	}
	checked := map[string]bool{}
	for _, ev := range e.Events {
		if ev.ExpectedVersion == nil || checked[ev.Stream] {
			continue
		}
		checked[ev.Stream] = true
		if have := int64(len(h.streams[ev.Stream])) - 1; have != *ev.ExpectedVersion {
			return nil, fmt.Errorf("%w: stream %s is at version %d, the append expected %d", ErrConflict, ev.Stream, have, *ev.ExpectedVersion)
		}
	}
	for _, w := range e.Writes {
		k := key{w.Kind, w.Type, w.ID}
		r := h.records[k]
		if r == nil {
			r = &stored{}
			h.records[k] = r
		}
		r.version++
		r.data = w.Data
		if string(w.Data) == "null" {
			r.data = nil
		}
	}
	md := abi.Metadata{CorrelationID: cause.ID, CausationID: cause.ID}
	if cause.Metadata != nil && cause.Metadata.CorrelationID != "" {
		md.CorrelationID = cause.Metadata.CorrelationID
	}
	var out []abi.Envelope
	for _, ev := range e.Events {
		out = append(out, h.append(ev, md))
	}
	return out, nil
}

func (h *Host) append(ev abi.NewEvent, md abi.Metadata) abi.Envelope {
	h.global++
	id := ev.ID
	if id == "" {
		id = h.newID()
	}
	env := abi.Envelope{ID: id, Type: ev.Type, Stream: ev.Stream, Position: int64(len(h.streams[ev.Stream])),
		GlobalPosition: h.global, Time: h.now(), Data: ev.Data, Metadata: &md}
	h.streams[ev.Stream] = append(h.streams[ev.Stream], env)
	return env
}

// memHost serves the host functions from the Host's memory.
type memHost struct{ h *Host }

func (m memHost) Load(req []byte) []byte {
	r, err := abi.DecodeLoadRequest(req)
	if err != nil {
		return mustJSON(abi.LoadResponse{Error: err.Error(), ErrorKind: abi.HostInvalid})
	}
	s := m.h.records[key{r.Kind, r.Type, r.ID}]
	if s == nil {
		return mustJSON(abi.LoadResponse{})
	}
	return mustJSON(abi.LoadResponse{Found: s.data != nil, Version: s.version, Data: s.data})
}

func (m memHost) ReadStream(req []byte) []byte {
	r, err := abi.DecodeReadStreamRequest(req)
	if err != nil {
		return mustJSON(abi.ReadStreamResponse{Error: err.Error(), ErrorKind: abi.HostInvalid})
	}
	evs := m.h.streams[r.Stream]
	from := min(max(r.From, 0), int64(len(evs)))
	evs = evs[from:]
	if r.Limit > 0 && len(evs) > r.Limit {
		evs = evs[:r.Limit]
	}
	return mustJSON(abi.ReadStreamResponse{Messages: evs})
}

func (m memHost) Log(level, msg string) { m.h.logs = append(m.h.logs, level+": "+msg) }

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // the ABI types always encode
	}
	return b
}
