package unitofwork

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/idempotency"
)

// KeyWriter writes a command's idempotency key in its unit of work:
// idempotency.Postgres.
type KeyWriter interface {
	QueueInsert(b *pgx.Batch, r idempotency.Request, a idempotency.Answer)
}

type keyCtx struct{}

type keyWrite struct {
	w     KeyWriter
	r     idempotency.Request
	taken atomic.Bool
}

// WithIdempotency returns a context under which Commit (not CommitFenced or
// CommitRun) of a command's changes also writes r's key with the command's
// answer, in the same transaction on PostgreSQL, so the effects and the key
// commit together. The answer is status 200 with the body of
// engine.CommandResult without its follow-ups ({"id", "events"}); the API
// replaces it with the full answer once the command returns. The memory
// backend ignores it (the API's Save is the only write there, and memory
// dies with the process anyway).
func WithIdempotency(ctx context.Context, w KeyWriter, r idempotency.Request) context.Context {
	return context.WithValue(ctx, keyCtx{}, &keyWrite{w: w, r: r})
}

// keyFrom returns the context's key write for the first unit of work that
// asks: the command's own. Its follow-up commands run under the same
// context and must not write the key.
func keyFrom(ctx context.Context) *keyWrite {
	k, _ := ctx.Value(keyCtx{}).(*keyWrite)
	if k == nil || !k.taken.CompareAndSwap(false, true) {
		return nil
	}
	return k
}

// committedAnswer is the answer a command's unit of work stores with its
// key: the shape of engine.CommandResult, without follow-ups.
func committedAnswer(id string, events []eventstore.Event) (idempotency.Answer, error) {
	type appended struct {
		ID             string `json:"id"`
		Type           string `json:"type"`
		Stream         string `json:"stream"`
		Position       int64  `json:"position"`
		GlobalPosition int64  `json:"global_position"`
	}
	body := struct {
		ID     string     `json:"id"`
		Events []appended `json:"events"`
	}{ID: id, Events: make([]appended, len(events))}
	for i, ev := range events {
		body.Events[i] = appended{ev.ID, ev.Type, ev.Stream, ev.Position, ev.GlobalPosition}
	}
	b, err := json.Marshal(body)
	if err != nil {
		return idempotency.Answer{}, fmt.Errorf("unitofwork: idempotency answer: %w", err)
	}
	return idempotency.Answer{Status: http.StatusOK, Body: b}, nil
}

// queueKey queues s's key write, if it has one, on b.
func queueKey(b *pgx.Batch, s *stage, events []eventstore.Event) (bool, error) {
	if s.key == nil {
		return false, nil
	}
	a, err := committedAnswer(s.causation, events)
	if err != nil {
		return false, err
	}
	s.key.w.QueueInsert(b, s.key.r, a)
	return true, nil
}
