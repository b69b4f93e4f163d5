package engine

import (
	"errors"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/host"
	esub "github.com/proteanhq/protean-host/internal/subscription"
	"github.com/proteanhq/protean-host/internal/unitofwork"
	"github.com/proteanhq/protean-host/record"
)

// ErrNotSubscribed: an event-store subscription's batch reached the
// engine after a reload took the subscription away (its handler, or the
// handler's last type of the category). Nothing is committed: the worker
// retries until its supervisor stops it, and a handler added back resumes
// after its position, not past the events it never saw.
var ErrNotSubscribed = errors.New("the handler no longer subscribes to the category")

// subscribes reports whether set still has the event-store subscription
// (group, unit): handler group handles a type of category unit (any type,
// for esub.All).
func subscribes(set *host.Set, group, unit string) bool {
	for _, m := range set.Modules() {
		for _, h := range m.Manifest.Handlers {
			if h.Name != group || h.Kind == abi.KindCommandHandler {
				continue
			}
			for _, t := range h.Handles {
				if msg, _ := set.Message(t); unit == esub.All || msg.Category == unit {
					return true
				}
			}
		}
	}
	return false
}

// Classify says whose failure err, returned by the partition handler
// ([Engine.Handler]) or a broker consumer's handling, is
// (package delivery): the message's own (a handler error, a scope error,
// a rejected partition key, effects the stores refuse before the
// database: an invalid event or record, a duplicate event id), and
// whether a retry may help; or infrastructure (the database, a stopping
// engine, a host function's store call that failed while the guest ran,
// even when the guest then reported a failure of its own).
//
// Effects the stores refuse are the message's: the same handler on the
// same message asks for them again, so retrying them "without end" as an
// infrastructure error would stall the subscription for good, with no
// failure record for an operator to skip.
func Classify(err error) delivery.Class {
	if delivery.IsInfrastructure(err) {
		return delivery.Infrastructure
	}
	var he *HandlerError
	if errors.As(err, &he) {
		if he.Retryable() {
			return delivery.Retry
		}
		return delivery.Permanent
	}
	var se *ScopeError
	if errors.As(err, &se) {
		return delivery.Permanent
	}
	var ke *unitofwork.KeyError
	if errors.As(err, &ke) {
		return delivery.Permanent
	}
	if unitofwork.Conflict(err) {
		return delivery.Retry
	}
	if errors.Is(err, eventstore.ErrInvalid) || errors.Is(err, record.ErrInvalid) {
		return delivery.Permanent
	}
	if errors.Is(err, eventstore.ErrDuplicateID) {
		// A guest that names its events from the message repeats the id
		// on every attempt; one that draws ids at random will not.
		return delivery.Retry
	}
	return delivery.Infrastructure
}
