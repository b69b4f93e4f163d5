package unitofwork

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/idempotency"
)

// KeyWriter writes a command's idempotency key in its unit of work:
// idempotency.Postgres.
type KeyWriter interface {
	QueueInsert(b *pgx.Batch, r idempotency.Request, a idempotency.Answer, final bool)
}

type keyCtx struct{}

type keyWrite struct {
	w      KeyWriter
	r      idempotency.Request
	answer Answer
	taken  atomic.Bool
}

// Answer builds the answer a command's unit of work stores with its key,
// from the command's id and the events it appended: the API's answer,
// which the API builds (httpapi). final tells the builder that the
// command dispatches no follow-up commands: the answer is the API's
// whole answer, and is stored as done (KeyWriter), so the API need not
// save it again.
type Answer func(id string, events []eventstore.Event, final bool) (idempotency.Answer, error)

// WithIdempotency returns a context under which Commit (not CommitFenced or
// CommitRun) of a command's changes also writes r's key with the command's
// answer, in the same transaction on PostgreSQL, so the effects and the key
// commit together. answer builds it from the events committed (the API's
// answer without its follow-ups, which run after the commit); the API
// replaces it with the full answer once the command returns, unless it
// was final (no follow-ups: see Answer). The memory
// backend ignores it (the API's Save is the only write there, and memory
// dies with the process anyway).
func WithIdempotency(ctx context.Context, w KeyWriter, r idempotency.Request, answer Answer) context.Context {
	return context.WithValue(ctx, keyCtx{}, &keyWrite{w: w, r: r, answer: answer})
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

// queueKey queues s's key write, if it has one, on b.
func queueKey(b *pgx.Batch, s *stage, events []eventstore.Event) (bool, error) {
	if s.key == nil {
		return false, nil
	}
	final := len(s.commands) == 0
	a, err := s.key.answer(s.causation, events, final)
	if err != nil {
		return false, fmt.Errorf("unitofwork: idempotency answer: %w", err)
	}
	s.key.w.QueueInsert(b, s.key.r, a, final)
	return true, nil
}
