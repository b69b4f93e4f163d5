package groups

import (
	"context"
	"errors"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/delivery"
)

// extend takes, after first, the messages the broker already has ready for
// the group (no waiting for more), up to the run size, when the source is
// a broker.Batcher. A redelivery (Attempt > 1) runs alone, so a message
// that failed is retried by itself; a redelivery that comes after first is
// released untried. Any error leaves the run at first.
func (c *Consumer) extend(ctx context.Context, g Group, first broker.Delivery) []broker.Delivery {
	run := []broker.Delivery{first}
	bt, ok := c.opts.Source.(broker.Batcher)
	n := c.opts.Batch
	if !ok || n < 2 || first.Attempt > 1 {
		return run
	}
	more, err := bt.NextBatch(ctx, g.Stream, g.Handler, n-1)
	if err != nil {
		return run
	}
	for i, d := range more {
		if d.Attempt > 1 {
			c.release(ctx, bt, g, more[i:])
			break
		}
		run = append(run, d)
	}
	return run
}

// deliver hands a run of one group's deliveries to the delivery core
// (delivery.Core.Deliver), the algorithm every source shares: one guest
// call, the messages before the first failure committed with group
// commit and acked, an infrastructure failure retried in place without
// end and uncharged, a message's own failure nacked, so the broker
// redelivers it alone after the policy's pause and dead-letters it after
// its retries. What the run did not settle (the messages after a failure,
// or all of them when the groups stop) is released untried, so it follows
// in order. Messages of types the handler does not handle are acked
// without a call (the handler skips them).
func (c *Consumer) deliver(soft, work context.Context, g Group, run []broker.Delivery) {
	n, err := c.core.Deliver(soft, work, &brokerRun{c: c, g: g, run: run}, len(run))
	if err != nil && !errors.Is(err, delivery.ErrInterrupted) {
		c.log.Error("delivery: settle failed", "handler", g.Handler, "stream", g.Stream, "error", err)
	}
	if n < len(run) {
		c.giveBack(work, g, run[n:])
	}
}

// brokerRun is a group's run as the delivery core's unit.
type brokerRun struct {
	c   *Consumer
	g   Group
	run []broker.Delivery
}

func (r *brokerRun) Handle(ctx context.Context, from, to int) (int, error) {
	msgs := make([]delivery.Message, to-from)
	for i, d := range r.run[from:to] {
		msgs[i] = d.Message
	}
	return r.c.opts.Handler.Handle(ctx, delivery.Batch{Group: r.g.Handler, Source: r.g.Stream, Messages: msgs})
}

// Handled acks what committed; a message the handler does not handle
// counts as skipped.
func (r *brokerRun) Handled(ctx context.Context, from, to int) error {
	for _, d := range r.run[from:to] {
		outcome := "ack"
		if h := r.c.opts.Handles; h != nil && !h(r.g.Handler, d.Type) {
			outcome = "skip"
		}
		r.c.settle(ctx, r.g, d, outcome, nil)
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
	rj, ok := r.c.opts.Source.(broker.Rejecter)
	if !ok || r.c.opts.Classify(cause) != delivery.Permanent {
		return false, r.Redeliver(ctx, i, cause)
	}
	d := r.run[i]
	r.c.log.Warn("delivery failed permanently; dead-lettered", "handler", r.g.Handler, "stream", r.g.Stream, "type", d.Type,
		"message_id", d.ID, "attempt", d.Attempt, "error", cause)
	err := rj.Reject(context.WithoutCancel(ctx), r.g.Stream, r.g.Handler, d.ID)
	if err != nil {
		r.c.log.Error("delivery: reject failed", "handler", r.g.Handler, "message_id", d.ID, "error", err)
	}
	r.c.opts.Metrics.delivery(r.g.Handler, "reject")
	return false, nil
}

// Redeliver nacks: the broker redelivers the message alone after the
// policy's pause.
func (r *brokerRun) Redeliver(ctx context.Context, i int, cause error) error {
	d := r.run[i]
	r.c.log.Warn("delivery failed", "handler", r.g.Handler, "stream", r.g.Stream, "type", d.Type,
		"message_id", d.ID, "attempt", d.Attempt, "run", len(r.run), "error", cause)
	r.c.settle(ctx, r.g, d, "nack", cause)
	return nil
}

func (r *brokerRun) Attrs(i int) []any {
	return []any{"handler", r.g.Handler, "stream", r.g.Stream, "message_id", r.run[i].ID}
}

// settle acks d (cause nil) or nacks it, whatever ctx, and counts the
// outcome; a failure is logged (the broker redelivers the message: at
// least once is what a consumer group promises).
func (c *Consumer) settle(ctx context.Context, g Group, d broker.Delivery, outcome string, cause error) {
	var err error
	// Settle even if ctx was canceled mid-message: the broker's state must
	// follow what happened.
	sctx := context.WithoutCancel(ctx)
	if cause == nil {
		err = c.opts.Source.Ack(sctx, g.Stream, g.Handler, d.ID)
	} else {
		err = c.opts.Source.Nack(sctx, g.Stream, g.Handler, d.ID)
	}
	if err != nil {
		c.log.Error("delivery: settle failed", "handler", g.Handler, "outcome", outcome, "message_id", d.ID, "error", err)
	}
	c.opts.Metrics.delivery(g.Handler, outcome)
}

// giveBack returns deliveries the run did not settle to the broker
// untried (released, with their attempt kept), or nacks them when the
// broker cannot release.
func (c *Consumer) giveBack(ctx context.Context, g Group, ds []broker.Delivery) {
	if bt, ok := c.opts.Source.(broker.Batcher); ok {
		c.release(ctx, bt, g, ds)
		return
	}
	for _, d := range ds {
		c.settle(ctx, g, d, "nack", errors.New("not tried"))
	}
}

// release gives the messages back to the broker untried.
func (c *Consumer) release(ctx context.Context, bt broker.Batcher, g Group, ds []broker.Delivery) {
	sctx := context.WithoutCancel(ctx) // the broker's state must follow what happened
	for _, d := range ds {
		if err := bt.Release(sctx, g.Stream, g.Handler, d.ID); err != nil {
			c.log.Error("delivery: release failed", "handler", g.Handler, "message_id", d.ID, "error", err)
		}
		c.opts.Metrics.delivery(g.Handler, "release")
	}
}
