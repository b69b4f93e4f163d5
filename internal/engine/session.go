package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/unitofwork"
	"github.com/proteanhq/protean-host/record"
)

// maxReadLimit caps one protean_read_stream call.
const maxReadLimit = 1000

// session answers one module's host-function calls within its scope, for
// one protean_handle call. It remembers the last scope violation it
// answered, so that a message the module then fails keeps the host's
// *ScopeError as its cause instead of only the guest's copy of its text.
type session struct {
	e     *Engine
	scope *scope
	// refused is the last *ScopeError answered. Host functions run on the
	// goroutine of the guest call, so no lock is needed.
	refused error
	// tooLong is the last request the host refused for an id over
	// abi.MaxIDLength (see host.InvalidObserver): a command that failed
	// after it may owe it to its own input (see inputCause).
	tooLong error
	// storeFailed is the last store failure of a host function that was
	// not the request's own (an unreachable or restarting database): a
	// message the module then fails failed on infrastructure, whatever
	// the guest made of it.
	storeFailed error
	// storeWait is the time the guest spent waiting on the stores in host
	// functions, in calls of stall or longer: a call that runs out of
	// time mostly waiting on a stalled database ran out of the database's
	// time, not its own. Quicker store calls do not count, however many:
	// a guest that spends its deadline on thousands of quick loads, or on
	// pages of a long stream, spent its own time, and is charged for it
	// (otherwise it would be retried as an outage without end).
	storeWait time.Duration
	stall     time.Duration
	// docs answers loads of the projector's own documents from the
	// cache, when its unit's owner committed them (see documents).
	docs documentView
}

// stallShare is the share of a call's deadline one store call must take
// to count as a stall of the store (session.stall).
const stallShare = 8

// Invalid implements host.InvalidObserver.
func (s *session) Invalid(err error) {
	var ide *abi.IDLengthError
	if errors.As(err, &ide) {
		s.tooLong = err
	}
}

func (s *session) Load(ctx context.Context, req *abi.LoadRequest) abi.LoadResponse {
	if err := s.scope.load(req.Kind, req.Type); err != nil {
		s.refused = err
		return abi.LoadResponse{Error: err.Error(), ErrorKind: abi.HostScope}
	}
	if r, ok := s.docs.load(req); ok {
		return r
	}
	start := time.Now()
	r, err := s.e.opts.Records.Load(ctx, record.Key{Kind: string(req.Kind), Type: req.Type, ID: req.ID})
	took := s.waited(start)
	if err != nil {
		return abi.LoadResponse{Error: err.Error(), ErrorKind: s.storeErrorKind(ctx, err, took)}
	}
	return abi.LoadResponse{Found: r.Exists(), Version: r.Version, Data: r.Data}
}

func (s *session) ReadStream(ctx context.Context, req *abi.ReadStreamRequest, maxBytes int) abi.ReadStreamResponse {
	if err := s.scope.stream(req.Stream); err != nil {
		s.refused = err
		return abi.ReadStreamResponse{Error: err.Error(), ErrorKind: abi.HostScope}
	}
	limit := req.Limit
	if limit <= 0 || limit > maxReadLimit {
		limit = maxReadLimit
	}
	start := time.Now()
	evs, err := s.e.opts.Events.ReadStreamBytes(ctx, req.Stream, req.From, limit, maxBytes)
	took := s.waited(start)
	if err != nil {
		return abi.ReadStreamResponse{Error: err.Error(), ErrorKind: s.storeErrorKind(ctx, err, took)}
	}
	out := abi.ReadStreamResponse{Messages: make([]abi.Envelope, len(evs))}
	for i, ev := range evs {
		out.Messages[i] = s.e.envelope(ev)
	}
	return out
}

// waited adds a store call that began at start to the session's store
// wait, if it was slow enough to be a stall (see stall), and returns how
// long it took.
func (s *session) waited(start time.Time) time.Duration {
	d := time.Since(start)
	if d >= s.stall {
		s.storeWait += d
	}
	return d
}

// storeErrorKind classifies a store's failure for the guest: a version
// conflict may clear on a retry, and so may anything else a store reports
// on a read (an unreachable server, a canceled call). A failure that is
// not the request's own is remembered as the session's infrastructure
// failure. A store call the call's own deadline cut, after it took took,
// is one only if it stalled (took at least stall): a guest that spends its
// deadline on quick reads is not the database's doing, a database that
// held a read until the deadline is.
func (s *session) storeErrorKind(ctx context.Context, err error, took time.Duration) abi.HostErrorKind {
	if unitofwork.Conflict(err) {
		return abi.HostConflict
	}
	if (ctx.Err() == nil || took >= s.stall) && Classify(err) == delivery.Infrastructure {
		s.storeFailed = err
	}
	return abi.HostTransient
}

// envelope is the ABI form of a stored event.
func (e *Engine) envelope(ev eventstore.Event) abi.Envelope {
	return abi.Envelope{ID: ev.ID, Type: ev.Type, Stream: ev.Stream, Position: ev.Position,
		GlobalPosition: ev.GlobalPosition, Time: ev.Time, Data: ev.Data,
		Metadata: e.metadata(ev.ID, ev.Metadata)}
}

// metadata reads the ABI metadata of message id out of its stored
// metadata; nil if there is none. Metadata that does not decode is logged
// and dropped rather than failing the message: the message itself is
// intact, and refusing it would halt its handler for good.
func (e *Engine) metadata(id string, b json.RawMessage) *abi.Metadata {
	md, err := decodeMetadata(b)
	if err != nil {
		e.log.Warn("message metadata dropped", "message_id", id, "error", err)
	}
	return md
}

// ErrMetadata marks stored message metadata that is not a JSON object of
// the ABI's metadata fields.
var ErrMetadata = errors.New("bad message metadata")

// decodeMetadata reads the ABI metadata out of stored metadata: nil for
// none (absent, null, or no ABI field set).
func decodeMetadata(b json.RawMessage) (*abi.Metadata, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var md abi.Metadata
	if err := json.Unmarshal(b, &md); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMetadata, err)
	}
	if md == (abi.Metadata{}) {
		return nil, nil
	}
	return &md, nil
}

var _ host.Session = (*session)(nil)
