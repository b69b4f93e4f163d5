package engine

import (
	"context"
	"encoding/json"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/host"
	"github.com/proteanhq/protean-host/record"
)

// maxReadLimit caps one protean_read_stream call.
const maxReadLimit = 1000

// session answers one module's host-function calls within its scope.
type session struct {
	e     *Engine
	scope *scope
}

func (s *session) Load(ctx context.Context, req *abi.LoadRequest) abi.LoadResponse {
	if err := s.scope.record(req.Kind, req.Type); err != nil {
		return abi.LoadResponse{Error: err.Error()}
	}
	r, err := s.e.opts.Records.Load(ctx, record.Key{Kind: string(req.Kind), Type: req.Type, ID: req.ID})
	if err != nil {
		return abi.LoadResponse{Error: err.Error()}
	}
	return abi.LoadResponse{Found: r.Exists(), Version: r.Version, Data: r.Data}
}

func (s *session) ReadStream(ctx context.Context, req *abi.ReadStreamRequest) abi.ReadStreamResponse {
	if err := s.scope.stream(req.Stream); err != nil {
		return abi.ReadStreamResponse{Error: err.Error()}
	}
	limit := req.Limit
	if limit <= 0 || limit > maxReadLimit {
		limit = maxReadLimit
	}
	evs, err := s.e.opts.Events.ReadStream(ctx, req.Stream, req.From, limit)
	if err != nil {
		return abi.ReadStreamResponse{Error: err.Error()}
	}
	out := abi.ReadStreamResponse{Messages: make([]abi.Envelope, len(evs))}
	for i, ev := range evs {
		out.Messages[i] = envelope(ev)
	}
	return out
}

// envelope is the ABI form of a stored event.
func envelope(ev eventstore.Event) abi.Envelope {
	env := abi.Envelope{ID: ev.ID, Type: ev.Type, Stream: ev.Stream, Position: ev.Position,
		GlobalPosition: ev.GlobalPosition, Time: ev.Time, Data: ev.Data}
	env.Metadata = parseMetadata(ev.Metadata)
	return env
}

// parseMetadata reads the ABI metadata out of stored metadata; nil if none.
func parseMetadata(b json.RawMessage) *abi.Metadata {
	var md abi.Metadata
	if len(b) == 0 || json.Unmarshal(b, &md) != nil || md == (abi.Metadata{}) {
		return nil
	}
	return &md
}

var _ host.Session = (*session)(nil)
