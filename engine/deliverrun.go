package engine

import (
	"context"
	"errors"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/delivery"
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

// deliverRun hands a run of one subscription's deliveries to the
// delivery core (delivery.Core.Deliver), the algorithm every path shares:
// one guest call (handleRun), the messages before the first failure
// committed with group commit and acked, an infrastructure failure
// retried in place without end and uncharged, a message's own failure
// nacked, so the broker redelivers it alone after the policy's pause and
// dead-letters it after its retries. What the run did not settle (the
// messages after a failure, or all of them when the engine stops) is
// released untried, so it follows in order. Messages of types the
// handler does not handle are acked without a call.
func (e *Engine) deliverRun(soft, work context.Context, src Source, s subscription, run []broker.Delivery) {
	n, err := e.core.Deliver(soft, work, &brokerRun{e: e, src: src, s: s, run: run}, len(run))
	if err != nil && !errors.Is(err, delivery.ErrInterrupted) {
		e.log.Error("delivery: settle failed", "handler", s.handler, "stream", s.stream, "error", err)
	}
	if n < len(run) {
		e.giveBack(work, src, s, run[n:])
	}
}

// brokerRun is a broker consumer group's run as the delivery core's unit.
type brokerRun struct {
	e   *Engine
	src Source
	s   subscription
	run []broker.Delivery
}

func (r *brokerRun) Handle(ctx context.Context, from, to int) (int, error) {
	msgs := make([]delivery.Message, to-from)
	for i, d := range r.run[from:to] {
		msgs[i] = d.Message
	}
	return r.e.handleRun(ctx, delivery.Batch{Group: r.s.handler, Source: r.s.stream, Messages: msgs})
}

// Handled acks what committed; a message the handler does not handle
// counts as skipped.
func (r *brokerRun) Handled(ctx context.Context, from, to int) error {
	set := r.e.Set()
	for _, d := range r.run[from:to] {
		outcome := "ack"
		if _, ok := routeIn(set, r.s.handler, d.Type); !ok {
			outcome = "skip"
		}
		r.e.settle(ctx, r.src, r.s, d, outcome, nil)
	}
	return nil
}

func (r *brokerRun) Resync(context.Context, int) (int, error) {
	return 0, errors.New("a broker consumer group has no position to resync")
}

// Charge is the broker's count: the delivery's attempt.
func (r *brokerRun) Charge(_ context.Context, i int) (int, error) { return r.run[i].Attempt, nil }

// GiveUp rejects a message whose failure is permanent (the broker
// dead-letters it at once, broker.Rejecter); otherwise it nacks, and past
// its retries the broker dead-letters it.
func (r *brokerRun) GiveUp(ctx context.Context, i, _ int, cause error) (bool, error) {
	rj, ok := r.src.(broker.Rejecter)
	if !ok || Classify(cause) != delivery.Permanent {
		return false, r.Redeliver(ctx, i, cause)
	}
	d := r.run[i]
	r.e.log.Warn("delivery failed permanently; dead-lettered", "handler", r.s.handler, "stream", r.s.stream, "type", d.Type,
		"message_id", d.ID, "attempt", d.Attempt, "error", cause)
	err := rj.Reject(context.WithoutCancel(ctx), r.s.stream, r.s.handler, d.ID)
	if err != nil {
		r.e.log.Error("delivery: reject failed", "handler", r.s.handler, "message_id", d.ID, "error", err)
	}
	r.e.opts.Metrics.delivery(r.s.handler, "reject")
	return false, nil
}

// Redeliver nacks: the broker redelivers the message alone after the
// policy's pause.
func (r *brokerRun) Redeliver(ctx context.Context, i int, cause error) error {
	d := r.run[i]
	r.e.log.Warn("delivery failed", "handler", r.s.handler, "stream", r.s.stream, "type", d.Type,
		"message_id", d.ID, "attempt", d.Attempt, "run", len(r.run), "error", cause)
	r.e.settle(ctx, r.src, r.s, d, "nack", cause)
	return nil
}

func (r *brokerRun) Attrs(i int) []any {
	return []any{"handler", r.s.handler, "stream", r.s.stream, "message_id", r.run[i].ID}
}

// giveBack returns deliveries the run did not settle to the broker
// untried (released, with their attempt kept), or nacks them when the
// broker cannot release.
func (e *Engine) giveBack(ctx context.Context, src Source, s subscription, ds []broker.Delivery) {
	if bt, ok := src.(broker.Batcher); ok {
		e.release(ctx, bt, s, ds)
		return
	}
	for _, d := range ds {
		e.settle(ctx, src, s, d, "nack", errors.New("not tried"))
	}
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
