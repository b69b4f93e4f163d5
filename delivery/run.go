package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/proteanhq/protean-host/clock"
	"github.com/proteanhq/protean-host/position"
)

// Unit is one delivery path's side of a run in hand: n messages of one
// unit, in order, that [Core.Deliver] settles. Indexes are into the run.
// The path reads the run (a broker delivery and what the broker has ready
// behind it, a partition stream's entries, an event-store page) and says
// what each step means there; the core decides which step comes next.
type Unit interface {
	// Handle hands run[from:to] to the handler in one guest call and
	// commits, with group commit, each message's effects together with
	// the unit's position, fenced by the owner's generation. It returns
	// how many committed and, when that is not all of them, the next
	// one's failure. A call that failed as a whole on several messages
	// (a trap, a timeout) returns its error marked with [MarkWhole].
	Handle(ctx context.Context, from, to int) (done int, err error)
	// Handled settles run[from:to], which committed (or which the
	// position already covers): ack them.
	Handled(ctx context.Context, from, to int) error
	// Resync is called when the handler found run[i] at or below the
	// unit's recorded position (position.ErrApplied: an operator moved
	// it): it reads the position again and returns how many messages
	// from i on it covers.
	Resync(ctx context.Context, i int) (int, error)
	// Charge counts a failure of run[i]'s own and returns how many it has
	// had (where the path keeps them: the stream entry's counter in
	// Redis, the broker's delivery attempt, the worker's memory).
	Charge(ctx context.Context, i int) (failures int, err error)
	// GiveUp settles run[i], which is past its retries: it halts the
	// unit, records the message for an operator, or dead-letters it. It
	// reports whether the run goes on after it.
	GiveUp(ctx context.Context, i, failures int, cause error) (goOn bool, err error)
	// Attrs are log attributes naming run[i].
	Attrs(i int) []any
}

// Redeliverer is a Unit whose source waits out a message's retry pause
// itself and delivers it again (a broker consumer group: the nack
// schedules the redelivery by the same Policy). The core hands it the
// failed message instead of waiting, and the run ends there.
type Redeliverer interface {
	Redeliver(ctx context.Context, i int, cause error) error
}

// ErrInterrupted: the run was stopped before every message was settled
// (the soft context ended during a pause, or the work context ended); the
// messages from the settled count on are still the unit's, untried or to
// be tried again by the next owner.
var ErrInterrupted = errors.New("delivery: stopped before the run was settled")

// ErrLost: the unit has a newer owner (a fence refused a commit). Deliver
// returns it wrapping the handler's error; nothing more is committed.
var ErrLost = errors.New("delivery: the unit has a newer owner")

// wholeError marks a failure of a guest call as a whole.
type wholeError struct{ err error }

func (e *wholeError) Error() string { return e.err.Error() }
func (e *wholeError) Unwrap() error { return e.err }

// MarkWhole marks err as the failure of a guest call as a whole (a trap, a
// timeout, running out of memory) rather than of one of its messages. On
// a run of several messages the core then runs them one at a time, so
// that only the guilty message is charged. nil stays nil.
func MarkWhole(err error) error {
	if err == nil {
		return nil
	}
	return &wholeError{err: err}
}

// IsWhole reports whether err was marked by [MarkWhole].
func IsWhole(err error) bool {
	var we *wholeError
	return errors.As(err, &we)
}

// Core is the one delivery algorithm of every path: a run of one unit's
// messages goes to the handler in one guest call, what committed is
// settled, and a failure is classified once and settled by the one
// Policy. See [Core.Deliver]. A Core is safe for concurrent use.
type Core struct {
	Policy Policy
	// Classify says whose failure a handler error is (nil: [Classify]).
	Classify func(error) Class
	// Outage reports the handler's infrastructure failures (nil: none).
	Outage *Outage
	// Clock is what every pause waits on (nil: clock.System).
	Clock clock.Clock
	// What names the path in its log lines ("partition", "subscription",
	// "delivery").
	What string
	Log  *slog.Logger
}

// Deliver settles a run of n messages of one unit in order and returns
// how many, from its start, it settled. Each pass hands the handler the
// rest of the run (after a failure, the failing message alone):
//
//   - what committed is settled (Handled);
//   - a message the position already covers (position.ErrApplied) is
//     settled without a call (Resync);
//   - a fence refused (position.ErrFenced): ErrLost, nothing more;
//   - a call that failed as a whole on several messages: the rest of
//     the run goes one message at a time, uncharged until one fails
//     alone;
//   - an infrastructure failure: the message is tried again after the
//     infrastructure pause, without end, never charged;
//   - the message's own failure: charged (Charge); past the policy's
//     retries it is given up (GiveUp: halt, park or dead letter);
//     otherwise it is tried again alone after the policy's pause, or
//     handed back to a source that redelivers it (Redeliverer).
//
// Handler calls and settles run on work; pauses end early when soft ends
// (ErrInterrupted). A failure to settle is returned as it is: the path's
// own infrastructure, which it retries from its source.
func (c *Core) Deliver(soft, work context.Context, u Unit, n int) (int, error) {
	classify := c.Classify
	if classify == nil {
		classify = Classify
	}
	i, infra := 0, 0
	// alone: a message failed and is tried again by itself until it
	// settles; split: a call failed as a whole, so the rest of the run
	// goes one message per call.
	alone, split := false, false
	for i < n {
		to := n
		if alone || split {
			to = i + 1
		}
		done, err := u.Handle(work, i, to)
		if done > 0 {
			if serr := u.Handled(work, i, i+done); serr != nil {
				return i, serr
			}
			i += done
			if infra > 0 && c.Outage != nil {
				c.Outage.OK()
			}
			infra = 0
			alone = false
		}
		if err == nil {
			continue
		}
		switch {
		case position.Fenced(err):
			return i, errors.Join(ErrLost, err)
		case work.Err() != nil:
			return i, ErrInterrupted
		case position.Applied(err):
			k, rerr := u.Resync(work, i)
			if rerr != nil {
				return i, rerr
			}
			if k <= 0 {
				return i, fmt.Errorf("%s: the handler found a message applied that the position does not cover: %w", c.What, err)
			}
			if serr := u.Handled(work, i, i+k); serr != nil {
				return i, serr
			}
			i += k
			continue
		case IsWhole(err) && to-i > 1:
			split = true // which one is guilty is unknown: one at a time
			continue
		}
		alone = true
		class := classify(err)
		if class == Infrastructure {
			infra++
			if c.Outage != nil {
				c.Outage.Fail(err, u.Attrs(i)...)
			}
			if !c.sleep(soft, work, c.Policy.InfraPause(infra)) {
				return i, ErrInterrupted
			}
			continue
		}
		settled, goOn, ferr := c.failed(soft, work, u, i, class, err)
		i += settled
		if ferr != nil || !goOn {
			return i, ferr
		}
		alone = settled == 0 // retried alone, or the run goes on past a given-up one
	}
	return i, nil
}

// failed handles the message at i's own failure (err, of class): it is
// charged; past the policy's retries it is given up (GiveUp), or handed
// back to a source that redelivers it (Redeliverer), or else tried again
// alone after the policy's pause. It returns how many messages it settled
// (1 or 0), whether Deliver goes on with the run, and an error that ends
// it.
func (c *Core) failed(soft, work context.Context, u Unit, i int, class Class, err error) (settled int, goOn bool, _ error) {
	failures, cerr := u.Charge(work, i)
	if cerr != nil {
		return 0, false, cerr
	}
	if c.Policy.GiveUp(class, failures) {
		goOn, gerr := u.GiveUp(work, i, failures, err)
		if gerr != nil {
			return 0, false, gerr
		}
		return 1, goOn, nil
	}
	if rd, ok := u.(Redeliverer); ok {
		if rerr := rd.Redeliver(work, i, err); rerr != nil {
			return 0, false, rerr
		}
		return 1, false, nil
	}
	c.log().Warn(c.What+": message failed; retrying", append(u.Attrs(i),
		"attempt", failures, "max_retries", c.Policy.MaxRetries, "error", err)...)
	if !c.sleep(soft, work, c.Policy.Pause(failures)) {
		return 0, false, ErrInterrupted
	}
	return 0, true, nil
}

func (c *Core) log() *slog.Logger {
	if c.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Log
}

// sleep waits d unless soft or work ends first; it reports whether to go
// on.
func (c *Core) sleep(soft, work context.Context, d time.Duration) bool {
	select {
	case <-soft.Done():
		return false
	case <-work.Done():
		return false
	case <-clock.Or(c.Clock).After(d):
		return true
	}
}
