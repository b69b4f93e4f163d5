package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/telemetry"
	"github.com/proteanhq/protean-host/internal/unitofwork"
	"github.com/proteanhq/protean-host/position"
)

// handleRun is the one guest call and group commit of every delivery
// path: it runs b's messages through b.Group's handler as one guest call,
// then commits the effects of every message before the first failure,
// each message atomically, all in one transaction (unitofwork.CommitRun:
// group commit; a message whose commit fails commits the ones before it,
// and is the failure). With b.Unit set (a partition worker or an
// event-store subscription) each message commits together with the
// unit's position advanced past it, fenced by b.Generation; a broker
// consumer group (b.Unit empty) has no position, its broker's ack settles
// the message. Messages of types the handler does not handle are passed
// without a call. A call that fails as a whole on several messages
// returns its error marked delivery.MarkWhole: the delivery core then
// runs them one at a time, so that only a guilty message is charged. It
// returns how many messages committed and the failure of the next one.
func (e *Engine) handleRun(ctx context.Context, b delivery.Batch) (_ int, err error) {
	l, err := e.acquire()
	if err != nil {
		return 0, err
	}
	defer l.users.leave()
	fenced := b.Unit != ""
	if fenced && e.opts.EventStore && !subscribes(l.set, b.Group, b.Unit) {
		return 0, fmt.Errorf("event-store subscription %s/%s: %w", b.Group, b.Unit, ErrNotSubscribed)
	}
	ctx, cancel := e.owned(ctx)
	defer cancel()
	route, envs, idx := e.runEnvelopes(l, b)
	ctx, span := e.startProcess(ctx, b, envs)
	defer func() { telemetry.End(span, err) }()
	fail, failErr := len(b.Messages), error(nil)
	var docs documentView
	if fenced && b.Generation > 0 && l.cached[route.Handler.Name] {
		docs = documentView{docs: l.docs, owner: unitOwner{group: b.Group, unit: b.Unit, generation: b.Generation}, typ: route.Handler.Name}
	}
	var results []result
	if len(envs) > 0 {
		var err error
		results, err = e.call(ctx, l, route, envs, docs)
		if err != nil {
			if len(envs) > 1 && Classify(err) != delivery.Infrastructure {
				// The call failed as a whole (a trap, a timeout, out of
				// memory): which message caused it is unknown.
				return 0, delivery.MarkWhole(err)
			}
			fail, failErr, results = idx[0], err, nil
		}
	}
	var changes []unitofwork.Change
	var causes []abi.Envelope
	for j, r := range results {
		if err := r.err; err != nil {
			fail, failErr = idx[j], err
			break
		}
		md := causedBy(envs[j], route.Module)
		telemetry.Inject(ctx, &md) // the run's process span created them
		changes = append(changes, unitofwork.Change{Effects: r.Effects, Metadata: md})
		causes = append(causes, envs[j])
	}
	if fail == 0 {
		return 0, failErr
	}
	// Group commit: one step per handled message, each atomic, all in
	// one transaction when they all commit. A step's fence advances past
	// its message and the unhandled ones after it (up to the next handled
	// message, or the failure), so a failing step commits exactly the
	// messages before it.
	var committed []unitofwork.Committed
	steps, ends := runSteps(b, fenced, fail, idx[:len(changes)], changes)
	if len(steps) > 0 {
		cctx, commit := e.tracer.Start(ctx, "commit")
		committed, err = e.opts.UnitOfWork.CommitRun(cctx, steps)
		telemetry.End(commit, err)
	}
	if len(changes) > 0 {
		e.opts.Metrics.commit(route, err)
		docs.committed(changes, causes, err != nil)
	}
	if err != nil {
		n := len(committed)
		var ke *unitofwork.KeyError
		if errors.As(err, &ke) && n < len(changes) {
			// An event with a rejected key can never commit: a poison
			// message, not a transient failure.
			err = &HandlerError{File: route.Module.File, Handler: route.Handler.Name, Type: causes[n].Type, Kind: abi.ErrorPermanent, Err: err}
		}
		if n == 0 {
			return 0, err
		}
		fail, failErr = ends[n-1], err
		changes = changes[:n]
	}
	e.afterRun(ctx, b, fail, changes, causes)
	return fail, failErr
}

// runEnvelopes are the envelopes of the messages of b that b.Group's
// handler handles, the route of that handler, and each envelope's index in
// b.Messages.
func (e *Engine) runEnvelopes(l *loaded, b delivery.Batch) (route host.Route, envs []abi.Envelope, idx []int) {
	for i, m := range b.Messages {
		r, ok := routeIn(l.set, b.Group, m.Type)
		if !ok {
			continue
		}
		route = r
		envs = append(envs, e.messageEnvelope(m))
		idx = append(idx, i)
	}
	return route, envs, idx
}

// afterRun follows a run's commit: the messages before fail count as
// handled (read-your-writes), and the commands the committed changes ask
// for are dispatched, each caused by its message.
func (e *Engine) afterRun(ctx context.Context, b delivery.Batch, fail int, changes []unitofwork.Change, causes []abi.Envelope) {
	for _, m := range b.Messages[:fail] {
		cat := m.Category
		if cat == "" {
			cat = eventstore.Category(m.EventStream)
		}
		// A fenced run (a partition unit's, an event-store
		// subscription's) applies each key's events in order; a broker
		// group's run, in order per stream only, names no key.
		var key string
		if b.Generation > 0 {
			key = m.PartitionKey
		}
		e.handledEvent(ctx, b.Group, cat, m.GlobalPosition, key)
	}
	for j, c := range changes {
		if c.Effects != nil && len(c.Effects.Commands) > 0 {
			e.followUp(ctx, c.Effects.Commands, causes[j])
		}
	}
}

// runSteps makes the steps of a run's commit: one per change (handled[j]
// is its message's index in b.Messages), the fence of each advancing to
// the last global position up to the next handled message (the last: up
// to fail); with no change, one fence-only step over b.Messages[:fail].
// Without fenced, the steps carry no fence (and no change is no step).
// ends[j] is the count of messages step j commits through.
func runSteps(b delivery.Batch, fenced bool, fail int, handled []int, changes []unitofwork.Change) ([]unitofwork.Step, []int) {
	fence := func(from, to int) *position.Fence {
		if !fenced {
			return nil
		}
		f := &position.Fence{Group: b.Group, Unit: b.Unit, Generation: b.Generation}
		if gp := delivery.LastGlobalPosition(b.Messages[from:to]); gp > 0 {
			f.Advance = map[string]int64{b.Source: gp}
		}
		return f
	}
	if len(changes) == 0 {
		if !fenced {
			return nil, nil
		}
		return []unitofwork.Step{{Fence: fence(0, fail)}}, []int{fail}
	}
	steps := make([]unitofwork.Step, len(changes))
	ends := make([]int, len(changes))
	from := 0
	for j, c := range changes {
		end := fail
		if j+1 < len(changes) {
			end = handled[j+1]
		}
		steps[j] = unitofwork.Step{Fence: fence(from, end), Changes: []unitofwork.Change{c}}
		ends[j], from = end, end
	}
	return steps, ends
}

// routeIn finds the handler named handler among typ's subscribers in set.
func routeIn(set *host.Set, handler, typ string) (host.Route, bool) {
	for _, r := range set.Subscribers(typ) {
		if r.Handler.Name == handler {
			return r, true
		}
	}
	return host.Route{}, false
}

// messageEnvelope is the ABI envelope of a delivered message.
func (e *Engine) messageEnvelope(m delivery.Message) abi.Envelope {
	return abi.Envelope{ID: m.ID, Type: m.Type, Stream: m.EventStream, Position: m.Position,
		GlobalPosition: m.GlobalPosition, Time: m.Time, Data: m.Data, Metadata: e.metadata(m.ID, m.Metadata)}
}

func correlation(env abi.Envelope) string {
	if env.Metadata != nil && env.Metadata.CorrelationID != "" {
		return env.Metadata.CorrelationID
	}
	return env.ID
}
