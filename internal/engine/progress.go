package engine

import (
	"context"
	"fmt"
	"slices"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/readyourwrites"
)

// Read-your-writes: the wait is package readyourwrites'. The engine marks
// what its handlers commit (handledEvent) and says, per category a
// projection reads, which source delivers it: Options.BrokerProgress for
// the broker groups, Options.Progress for the partition workers or the
// event-store subscriptions.

// handledEvent records that group handled the event at gp of category,
// and folds the group's marks when enough have gathered (only then is the
// category's source looked up: not once per message). key is the event's
// partition key when its deliverer applies each key's events in order,
// else "" (readyourwrites.Waiter.Mark).
func (e *Engine) handledEvent(ctx context.Context, group, category string, gp int64, key string) {
	r := readyourwrites.Route{Group: group, Category: category}
	if !e.rw.Mark(r, gp, key) {
		return
	}
	var local readyourwrites.Source
	if _, keyed := e.Set().PartitionField(category); e.byBroker(keyed) {
		local = e.opts.BrokerProgress
	}
	e.rw.Fold(ctx, r, gp, local)
}

// byBroker reports whether the broker groups deliver a category
// (partitioned: it has a partition key): not when the event-store
// subscriptions deliver everything, nor a partitioned category when the
// partition workers do.
func (e *Engine) byBroker(partitioned bool) bool {
	return !e.opts.EventStore && !(partitioned && e.opts.Partitioned)
}

// unmarked is the broker groups' source when Options.BrokerProgress is
// nil: nothing counts as handled but what this engine marks.
type unmarked struct{}

func (u *unmarked) Check(string, int64) readyourwrites.Check { return u }
func (u *unmarked) Remote() bool                             { return false }

func (u *unmarked) Handled(context.Context, readyourwrites.Route, eventstore.Event) (bool, error) {
	return false, nil
}

func (u *unmarked) KeyPosition(context.Context, readyourwrites.Route, string) (int64, bool, error) {
	return 0, false, nil
}

// WaitHandled waits until the projector or process manager named name has
// handled every event of its categories at or below global position n, or
// ctx ends: then it returns a *readyourwrites.CaughtUpError (errors.Is
// readyourwrites.ErrNotCaughtUp and ctx's error). An unknown name is
// ErrUnknownProjection; an event at or below n that its event-store
// subscription recorded as failed or held is a *subscription.FailedError
// (readyourwrites.ErrFailed).
func (e *Engine) WaitHandled(ctx context.Context, name string, n int64) error {
	return e.waitHandled(ctx, name, n, "", "")
}

// WaitDocument is WaitHandled for a read of document id of the projector
// name. When the projector declares documents_by_key (abi.Handler), the
// document is written only by the events whose partition field holds id,
// so it waits for those events alone: other keys' events, slow or held
// by a halted partition, do not hold the read back. Otherwise it waits as
// WaitHandled does.
func (e *Engine) WaitDocument(ctx context.Context, name, id string, n int64) error {
	if r, ok := e.Set().ProjectionRoute(name); ok && r.Handler.DocumentsByKey {
		return e.waitHandled(ctx, name, n, r.Handler.SequentialBy.Field, id)
	}
	return e.WaitHandled(ctx, name, n)
}

// ReadYourWrites says what a min_position read of the projector name
// waits for: "key" (the document's partition alone: documents_by_key) or
// "all" (every event of its categories).
func ReadYourWrites(h abi.Handler) string {
	if h.DocumentsByKey {
		return "key"
	}
	return "all"
}

func (e *Engine) waitHandled(ctx context.Context, name string, n int64, field, key string) error {
	return e.rw.Wait(ctx, name, n, field, key, func() ([]readyourwrites.Target, error) {
		return e.progressTargets(name)
	})
}

// progressTargets lists the categories of the events the projector or
// process manager named name handles, each with the source that delivers
// it.
func (e *Engine) progressTargets(name string) ([]readyourwrites.Target, error) {
	set := e.Set()
	r, ok := set.ProjectionRoute(name)
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrUnknownProjection, name)
	}
	correlated := r.Handler.Kind == abi.KindProcessManager && r.Handler.SequentialBy.Correlation
	var out []readyourwrites.Target
	var cats []string
	for _, t := range r.Handler.Handles {
		msg, _ := set.Message(t)
		if msg.Category == "" || slices.Contains(cats, msg.Category) {
			continue
		}
		cats = append(cats, msg.Category)
		field, keyed := set.PartitionField(msg.Category)
		src := e.opts.Progress
		if e.byBroker(keyed) {
			src = e.opts.BrokerProgress
		}
		out = append(out, readyourwrites.Target{Source: src,
			Route: readyourwrites.Route{Group: name, Category: msg.Category, Field: field, Correlated: correlated}})
	}
	return out, nil
}

// HandledElsewhere records that group's unit of key in another process
// has committed every event of key in category at or below gp (an advance
// that process announced): a read of one's own write waiting for them here
// is done without reading the unit's position
// (readyourwrites.Waiter.HandledElsewhere).
func (e *Engine) HandledElsewhere(group, category, key string, gp int64) {
	e.rw.HandledElsewhere(readyourwrites.Route{Group: group, Category: category}, gp, key)
}

// HearingElsewhere says whether HandledElsewhere is being told of other
// processes' commits as they happen (the listener is connected): a
// keyed wait on another process's unit then relies on them and reads the
// unit's position at the safety poll only
// (readyourwrites.Waiter.Hearing).
func (e *Engine) HearingElsewhere(on bool) { e.rw.Hearing(on) }

// HearsEveryAdvance says that HandledElsewhere is told of every commit of
// a key's unit, none of them a priority lane's: such a wait's safety poll
// then comes every 250 ms, not every 50
// (readyourwrites.Waiter.HearsEveryAdvance).
func (e *Engine) HearsEveryAdvance(on bool) { e.rw.HearsEveryAdvance(on) }
