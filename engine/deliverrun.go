package engine

import (
	"context"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/host"
	"github.com/proteanhq/protean-host/unitofwork"
)

// DefaultDeliveryBatch is the most messages a broker consumer hands its
// handler in one guest call when Options.DeliveryBatch is 0.
const DefaultDeliveryBatch = 64

// deliveryBatch is the run size of the broker consumers: 1 delivers one
// message per call.
func (e *Engine) deliveryBatch() int {
	if e.opts.DeliveryBatch > 0 {
		return e.opts.DeliveryBatch
	}
	return DefaultDeliveryBatch
}

// extend takes, after first, the messages the broker already has ready for
// the subscription (no waiting for more), up to the run size, when the
// source is a broker.Batcher. A redelivery (Attempt > 1) runs alone, so a
// message that failed is retried by itself; a redelivery that comes after
// first is released untried. Any error leaves the run at first.
func (e *Engine) extend(ctx context.Context, src Source, s subscription, first broker.Delivery) []broker.Delivery {
	run := []broker.Delivery{first}
	bt, ok := src.(broker.Batcher)
	n := e.deliveryBatch()
	if !ok || n < 2 || first.Attempt > 1 {
		return run
	}
	more, err := bt.NextBatch(ctx, s.stream, s.handler, n-1)
	if err != nil {
		return run
	}
	for i, d := range more {
		if d.Attempt > 1 {
			e.release(ctx, bt, s, more[i:])
			break
		}
		run = append(run, d)
	}
	return run
}

// deliverRun handles a run of messages of one subscription in one guest
// call and settles each as deliver would one by one: the results of the
// messages before the first failure commit with group commit
// (unitofwork.CommitRun, each message atomically, in order) and are
// acked; the failing message is nacked (the broker retries it alone, with
// its backoff, and dead-letters it after its retries); the messages after
// it are released untried, so they follow it in order. Messages of types
// the handler does not handle are acked without a call.
func (e *Engine) deliverRun(ctx context.Context, src Source, s subscription, run []broker.Delivery) {
	bt := src.(broker.Batcher) // extend made a run only from a Batcher
	l, err := e.acquire()
	if err != nil {
		e.settle(ctx, src, s, run[0], "nack", err)
		e.release(ctx, bt, s, run[1:])
		return
	}
	whole := e.handleRun(ctx, l, src, bt, s, run)
	l.users.leave()
	if whole {
		// The call failed as a whole (a trap, a timeout): which message
		// caused it is unknown, so deliver the run one by one, stopping
		// at the first failure, so only it is charged a retry.
		for i, d := range run {
			if !e.deliver(ctx, src, s, d) {
				e.release(ctx, bt, s, run[i+1:])
				return
			}
		}
	}
}

// handleRun is deliverRun with the set acquired. It reports a call of
// several messages that failed as a whole without settling anything.
func (e *Engine) handleRun(ctx context.Context, l *loaded, src Source, bt broker.Batcher, s subscription, run []broker.Delivery) (whole bool) {
	var route host.Route
	var envs []abi.Envelope
	var idx []int // index in run of each envelope
	handled := make([]bool, len(run))
	for i, d := range run {
		r, ok := l.route(s.handler, d.Type)
		if !ok {
			continue
		}
		route, handled[i] = r, true
		envs = append(envs, e.messageEnvelope(d.Message))
		idx = append(idx, i)
	}
	fail, failErr := len(run), error(nil)
	var results []result
	if len(envs) > 0 {
		var err error
		results, err = e.call(ctx, l, route, envs)
		if err != nil && len(envs) > 1 && ctx.Err() == nil {
			return true
		}
		if err != nil {
			fail, failErr = idx[0], err
		}
	}
	steps := make([]unitofwork.Step, 0, len(results))
	for j, r := range results {
		if r.err != nil {
			fail, failErr = idx[j], r.err
			break
		}
		steps = append(steps, unitofwork.Step{Changes: []unitofwork.Change{{Effects: r.Effects,
			Metadata: causedBy(envs[j], route.Module)}}})
	}
	if len(steps) > 0 {
		committed, err := e.opts.UnitOfWork.CommitRun(ctx, steps)
		for range committed {
			e.opts.Metrics.commit(route, nil)
		}
		if err != nil {
			e.opts.Metrics.commit(route, err)
			fail, failErr = idx[min(len(committed), len(steps)-1)], err
		}
		for j, c := range committed {
			e.followUp(ctx, c.Commands, envs[j])
		}
	}
	for i, d := range run {
		switch {
		case i < fail:
			e.handledEvent(ctx, s.handler, s.stream, d.GlobalPosition)
			outcome := "ack"
			if !handled[i] {
				outcome = "skip"
			}
			e.settle(ctx, src, s, d, outcome, nil)
		case i == fail && Classify(failErr) == delivery.Infrastructure:
			// Not the message's: deliver retries it without end and
			// uncharged; the rest follow it.
			e.deliver(ctx, src, s, d)
			e.release(ctx, bt, s, run[i+1:])
			return false
		case i == fail:
			e.log.Warn("delivery failed", "handler", s.handler, "stream", s.stream, "type", d.Type,
				"message_id", d.ID, "attempt", d.Attempt, "run", len(run), "error", failErr)
			e.settle(ctx, src, s, d, "nack", failErr)
		default:
			e.release(ctx, bt, s, run[i:])
			return false
		}
	}
	return false
}

// release gives the messages back to the broker untried.
func (e *Engine) release(ctx context.Context, bt broker.Batcher, s subscription, ds []broker.Delivery) {
	sctx := context.WithoutCancel(ctx) // the broker's state must follow what happened
	for _, d := range ds {
		if err := bt.Release(sctx, s.stream, s.handler, d.ID); err != nil {
			e.log.Error("delivery: release failed", "handler", s.handler, "message_id", d.ID, "error", err)
		}
		e.opts.Metrics.delivery(s.handler, "release")
	}
}
