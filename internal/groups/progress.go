package groups

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/readyourwrites"
)

// Progress is the groups' read-your-writes source (the inline broker, a
// Redis stream's groups for an unpartitioned category). The groups record
// nothing durable: an event appended before this process started its
// groups was delivered by an earlier process, or never will be (the inline
// broker keeps nothing across a restart), so it counts as handled, or a
// restarted host would wait on it for ever. What this process handles
// after, the engine marks. Before Start, nothing counts as handled.
//
// The composition root makes one and gives it to both the engine
// (engine.Options.BrokerProgress) and the Consumer (Options.Progress).
type Progress struct {
	startedAt atomic.Int64 // unix ns; 0 before Start
	// DeadLetters, if set (the inline broker), is asked about an event
	// not handled yet: one its group dead-lettered will never be, and the
	// wait ends at once with a *DeadLetteredError naming it, instead of
	// at its bound (a ?min_position read answered 504 for ever). A
	// dead letter replayed is waited for again.
	DeadLetters broker.DeadLetterFinder
}

// start records when the groups started; a nil Progress keeps nothing.
func (p *Progress) start(t time.Time) {
	if p != nil {
		p.startedAt.Store(t.UnixNano())
	}
}

// Check begins a check of a wait for projection up to global position n.
func (p *Progress) Check(projection string, n int64) readyourwrites.Check {
	return &progressCheck{p: p, projection: projection, n: n}
}

// progressCheck is one check: what a dead letter's error names.
type progressCheck struct {
	p          *Progress
	projection string
	n          int64
}

// Remote is false: other processes' handling does not show here. With
// DeadLetters it is true all the same, so that a wait polls: a message the
// broker dead-letters marks nothing that would wake it.
func (p *Progress) Remote() bool { return p.DeadLetters != nil }

// Handled reports whether ev was appended before the groups started; an
// event after that which r.Group dead-lettered is a *DeadLetteredError.
// (What this process handled after is the engine's marks.)
func (c *progressCheck) Handled(ctx context.Context, r readyourwrites.Route, ev eventstore.Event) (bool, error) {
	since := c.p.startedAt.Load()
	if since != 0 && ev.Time.UnixNano() < since {
		return true, nil
	}
	if c.p.DeadLetters == nil {
		return false, nil
	}
	dl, ok, err := c.p.DeadLetters.DeadLetter(ctx, r.Category, r.Group, ev.ID)
	if err != nil || !ok {
		return false, nil // (a broker that cannot answer: the wait goes on)
	}
	return false, &DeadLetteredError{Projection: c.projection, Position: c.n, Event: ev, DeadLetter: dl}
}

// KeyPosition is never known: the groups do not deliver by key.
func (c *progressCheck) KeyPosition(context.Context, readyourwrites.Route, string) (int64, bool, error) {
	return 0, false, nil
}

// DeadLetteredError: a wait for Projection up to global position Position
// met an event at or below it that the projection's group dead-lettered.
type DeadLetteredError struct {
	Projection string
	Position   int64
	Event      eventstore.Event
	DeadLetter broker.DeadLetter
}

func (e *DeadLetteredError) Error() string {
	return fmt.Sprintf("projection %s cannot reach global position %d: its handler failed the %s event at global position %d (stream %s, message %s) and it was dead-lettered (%s, after %d attempt(s)): an operator must replay it (protean-host dead-letters replay %s %s %s)",
		e.Projection, e.Position, e.Event.Type, e.Event.GlobalPosition, e.Event.Stream, e.Event.ID, e.DeadLetter.Reason, e.DeadLetter.Attempts,
		e.DeadLetter.Message.Stream, e.DeadLetter.Group, e.Event.ID)
}

// Unwrap returns readyourwrites.ErrFailed.
func (e *DeadLetteredError) Unwrap() error { return readyourwrites.ErrFailed }
