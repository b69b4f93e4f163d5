package readyourwrites

import (
	"context"
	"errors"
	"fmt"

	"github.com/proteanhq/protean-host/eventstore"
)

// Route is what a check asks a source about: has Group handled the events
// of Category? It carries what the source needs of the running module set
// to find an event's unit.
type Route struct {
	Group, Category string
	// Field is the category's partition field ("" if it is not
	// partitioned).
	Field string
	// Correlated says Group is a process manager that owns its
	// correlation values across categories (one unit per value).
	Correlated bool
}

// Source answers, from one delivery source's durable record, whether a
// consumer group has committed the effects of an event, in this process
// or another. A Source is compared by identity within a wait: implement it
// on a pointer.
type Source interface {
	// Check begins one check of a wait for projection up to global
	// position n: what it reads it may keep for the check's life (one pass
	// over the projection's categories).
	Check(projection string, n int64) Check
	// Remote reports whether other processes' handling shows in the
	// source's record, so a wait polls it rather than wake only on this
	// process's marks.
	Remote() bool
}

// Check is one check's questions to a source.
type Check interface {
	// Handled reports whether r.Group has committed the effects of ev, an
	// event of r.Category. An event the source recorded as failed, for an
	// operator to act on, is an error that errors.Is ErrFailed.
	Handled(ctx context.Context, r Route, ev eventstore.Event) (bool, error)
	// KeyPosition is, for a key of r.Category's partition field, the
	// position up to which its unit has committed r.Group's effects: the
	// key's events are applied in publish order, so every one of them at
	// or below it is handled. ok is false when the source cannot say by
	// key.
	KeyPosition(ctx context.Context, r Route, key string) (at int64, ok bool, _ error)
}

// LocalCheck is a Check that can also answer KeyPosition from this
// process's own unit of the key, without a read.
type LocalCheck interface {
	// LocalKeyPosition is, when this process runs the unit of key now
	// (owned), how far that unit has committed r.Group's effects: a lower
	// bound of KeyPosition's answer, never past it. A unit of this process
	// marks what it handles (Waiter.Mark), so a wait answered this way
	// sleeps on the marks and polls the source only as a safety net (the
	// unit may have been lost to another process meanwhile), and that poll
	// asks KeyPosition.
	LocalKeyPosition(r Route, key string) (at int64, owned bool)
}

// ErrFailed: an event at or below the position waited for failed in the
// projection's handler and is recorded for an operator.
var ErrFailed = errors.New("projection's handler failed an event")

// ErrNotCaughtUp: a wait for a projection to reach a position ended first.
var ErrNotCaughtUp = errors.New("projection has not caught up")

// CaughtUpError is ErrNotCaughtUp with what was waited for.
type CaughtUpError struct {
	Projection string
	Position   int64
	Err        error // the context's error that ended the wait
}

func (e *CaughtUpError) Error() string {
	return fmt.Sprintf("projection %s has not handled global position %d yet: %v", e.Projection, e.Position, e.Err)
}

// Unwrap returns ErrNotCaughtUp and the context's error.
func (e *CaughtUpError) Unwrap() []error { return []error{ErrNotCaughtUp, e.Err} }
