package engine

import (
	"errors"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/host"
	"github.com/proteanhq/protean-host/record"
	esub "github.com/proteanhq/protean-host/subscription"
	"github.com/proteanhq/protean-host/unitofwork"
)

// EventStoreSubscriptions lists the event-store subscriptions that serve
// the running set when [Options.EventStore] is set: one per (handler,
// category) pair of every event handler, projector and process manager,
// as Start's consumers would run them, the group being the handler's
// name. A subscription of a partitioned category is Partitioned, keyed by
// its sequential_by field (KeyField).
func (e *Engine) EventStoreSubscriptions() []esub.Subscription {
	set := e.Set()
	subs := subscriptions(set, false)
	out := make([]esub.Subscription, len(subs))
	for i, s := range subs {
		field, keyed := set.PartitionField(s.stream)
		out[i] = esub.Subscription{Group: s.handler, Category: s.stream, Partitioned: keyed, KeyField: field}
	}
	return out
}

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

// Classify says whether err, returned by the partition handler
// ([Engine.Partitions]), is the message's own failure (a handler error, a
// scope error, a rejected partition key, effects the stores refuse before
// the database: an invalid event or record, a duplicate event id) and
// whether a retry may help. Any other error (the database, a stopping
// engine) is not the message's.
//
// Effects the stores refuse are the message's: the same handler on the
// same message asks for them again, so retrying them "without end" as an
// infrastructure error would stall the subscription for good, with no
// failure record for an operator to skip.
func Classify(err error) (message, retryable bool) {
	var he *HandlerError
	if errors.As(err, &he) {
		return true, he.Retryable()
	}
	var se *ScopeError
	if errors.As(err, &se) {
		return true, false
	}
	var ke *unitofwork.KeyError
	if errors.As(err, &ke) {
		return true, false
	}
	if unitofwork.Conflict(err) {
		return true, true
	}
	if errors.Is(err, eventstore.ErrInvalid) || errors.Is(err, record.ErrInvalid) {
		return true, false
	}
	if errors.Is(err, eventstore.ErrDuplicateID) {
		// A guest that names its events from the message repeats the id
		// on every attempt; one that draws ids at random will not.
		return true, true
	}
	return false, false
}
