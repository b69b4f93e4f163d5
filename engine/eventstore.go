package engine

import (
	"errors"

	esub "github.com/proteanhq/protean-host/subscription"
	"github.com/proteanhq/protean-host/unitofwork"
)

// EventStoreSubscriptions lists the event-store subscriptions that serve
// the running set when [Options.EventStore] is set: one per (handler,
// category) pair of every event handler, projector and process manager,
// as Start's consumers would run them, the group being the handler's
// name. A subscription of a partitioned category is Partitioned.
func (e *Engine) EventStoreSubscriptions() []esub.Subscription {
	set := e.Set()
	subs := subscriptions(set, false)
	out := make([]esub.Subscription, len(subs))
	for i, s := range subs {
		_, keyed := set.PartitionField(s.stream)
		out[i] = esub.Subscription{Group: s.handler, Category: s.stream, Partitioned: keyed}
	}
	return out
}

// Classify says whether err, returned by the partition handler
// ([Engine.Partitions]), is the message's own failure (a handler error, a
// scope error, a rejected partition key) and whether a retry may help.
// Any other error (the database, a stopping engine) is not the message's.
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
	return false, false
}
