package subscription

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/proteanhq/protean-host/position"
)

// All is the unit of a subscription to every category: the whole store in
// global position order.
const All = "$all"

// Subscription is one consumer group reading one category (or All).
type Subscription struct {
	// Group is the consumer group: the handler's name.
	Group string
	// Category is the stream category read, or All.
	Category string
	// Partitioned says the category has a sequential_by key: a message that
	// fails past its retries halts its key (later messages of the key are
	// held behind it) instead of being skipped alone.
	Partitioned bool
	// KeyField is the sequential_by field that keys a partitioned
	// subscription (the first argument of Options.Key). Per-key workers
	// record it with their slot positions, so that a batch an owner left
	// unfinished is finished with that owner's key mapping even if the
	// partitioning changed since.
	KeyField string
}

// Unit is the subscription's unit in the consumer positions table and its
// source stream there: the category, or All.
func (s Subscription) Unit() string { return s.Category }

// Status of a failure record.
type Status string

// The statuses of a failure record.
const (
	// StatusFailed: the message failed past its retries; the subscription
	// went on past it (its key, if any, is halted behind it).
	StatusFailed Status = "failed"
	// StatusHeld: a later message of a halted key, parked in order.
	StatusHeld Status = "held"
	// StatusRetry: an operator asked the owner to run it again.
	StatusRetry Status = "retry"
	// StatusSkipped: an operator gave it up.
	StatusSkipped Status = "skipped"
	// StatusResolved: a rerun committed its effects.
	StatusResolved Status = "resolved"
)

// Open reports whether a record still needs handling or an operator.
func (s Status) Open() bool { return s == StatusFailed || s == StatusHeld || s == StatusRetry }

// Failure is a message a subscription did not apply in its turn.
type Failure struct {
	Group, Unit    string
	GlobalPosition int64
	MessageID      string
	Stream, Type   string
	// Key is the message's partition key ("" when unpartitioned).
	Key      string
	Status   Status
	Attempts int
	Error    string
	FailedAt time.Time
	Updated  time.Time
}

var (
	// ErrNotFound: no failure record at that position.
	ErrNotFound = errors.New("no such failure record")
	// ErrStatus: the record's status does not allow the operator's action.
	ErrStatus = errors.New("failure record has the wrong status for this action")
	// ErrInvalid: an argument is empty or out of range.
	ErrInvalid = errors.New("invalid argument")
)

// StatusError is an ErrStatus naming the record.
type StatusError struct {
	Group, Unit    string
	GlobalPosition int64
	Have           Status
	Action         string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("subscription %s/%s: failure at %d is %s: cannot %s: %v", e.Group, e.Unit, e.GlobalPosition, e.Have, e.Action, ErrStatus)
}

// Unwrap returns ErrStatus.
func (e *StatusError) Unwrap() error { return ErrStatus }

// Leases hand out one owner per (group, unit) across hosts. A lease lapses
// ttl after its last acquire or renew unless renewed.
type Leases interface {
	// Acquire takes the lease if it is free, lapsed or already owner's,
	// and reports whether owner holds it now.
	Acquire(ctx context.Context, group, unit, owner string, ttl time.Duration) (bool, error)
	// Renew extends owner's lease; false means owner no longer holds it.
	Renew(ctx context.Context, group, unit, owner string, ttl time.Duration) (bool, error)
	// Release gives owner's lease up at once (a clean stop).
	Release(ctx context.Context, group, unit, owner string) error
	// Holder returns the lease's owner and expiry, and false if none.
	Holder(ctx context.Context, group, unit string) (owner string, expires time.Time, ok bool, err error)
}

// Failures is where failure records live.
type Failures interface {
	// Record writes f (insert, or replace the record at its position).
	Record(ctx context.Context, f Failure) error
	// Park writes f and moves the unit's position past it (fence, checked
	// and applied as in an effect transaction) in one transaction: both
	// commit or neither. A fence that does not hold (position.ErrFenced,
	// position.ErrApplied) writes no record, so a stale owner leaves no
	// trace and a crash cannot separate the record from the move.
	Park(ctx context.Context, f Failure, fence position.Fence) error
	// List returns the records of group ("" for every group) and unit (""
	// for every unit), ordered by group, unit and position; with open, only
	// the open ones.
	List(ctx context.Context, group, unit string, open bool) ([]Failure, error)
	// Mark moves one record to status for the operator action named
	// action: retry needs failed, skip needs failed or held.
	Mark(ctx context.Context, group, unit string, pos int64, action string) error
	// Resolve sets the owner's outcome of a rerun: resolved, or failed
	// again with attempts and the error.
	Resolve(ctx context.Context, group, unit string, pos int64, status Status, attempts int, msg string) error
	// Settle resolves the record at pos after its rerun committed
	// (attempts) and, in the same transaction, drops the rerun's source
	// (RetrySource(pos)) from the unit's positions row if the row still
	// holds generation. Once the record is resolved no owner reruns the
	// message, so the source has served; kept, every rerun would leave a
	// source in the row for good, and the row is rewritten by every
	// effect transaction (86,400 of them made a commit ~290x slower). A
	// newer owner's row keeps it: that owner may have listed the record
	// as open before it resolved, and needs the source to see its rerun
	// applied already.
	Settle(ctx context.Context, group, unit string, pos int64, attempts int, generation int64) error
}

// Operator actions on a failure record.
const (
	ActionRetry = "retry"
	ActionSkip  = "skip"
)

// nextStatus is what an operator action makes of a record in have.
func nextStatus(group, unit string, pos int64, have Status, action string) (Status, error) {
	switch {
	case action == ActionRetry && have == StatusFailed:
		return StatusRetry, nil
	case action == ActionSkip && (have == StatusFailed || have == StatusHeld || have == StatusRetry):
		return StatusSkipped, nil
	case action != ActionRetry && action != ActionSkip:
		return "", fmt.Errorf("subscription %s/%s: action %q: want retry or skip: %w", group, unit, action, ErrInvalid)
	}
	return "", &StatusError{Group: group, Unit: unit, GlobalPosition: pos, Have: have, Action: action}
}
