package brokertest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/delivery"
)

func testCapabilities(t *testing.T, e *env) {
	b := e.open(nil)
	c := b.Capabilities()
	require.True(t, c.Has(broker.ReliableMessaging), "every broker redelivers nacked messages: %s", c)
	require.Equal(t, e.f.Ordered, c.Has(broker.OrderedMessaging), "OrderedMessaging vs Features.Ordered: %s", c)
	require.Equal(t, e.f.DeadLetters, c.Has(broker.DeadLetterQueue), "DeadLetterQueue vs Features.DeadLetters: %s", c)
	require.Equal(t, e.f.Blocking, c.Has(broker.BlockingRead), "BlockingRead vs Features.Blocking: %s", c)
	if e.f.Blocking {
		e.waiter()
	}
	if e.f.DeadLetters {
		e.dlq()
	}
}

func testPublishValidates(t *testing.T, e *env) {
	b := e.open(nil)
	ctx := context.Background()
	for name, bad := range map[string]delivery.Message{
		"empty id":     {Stream: "order"},
		"empty stream": {ID: "m2"},
	} {
		err := b.Publish(ctx, msg("order", "m1"), bad)
		require.ErrorIs(t, err, broker.ErrInvalid, name)
	}
	e.empty("order", "g") // all or nothing: m1 was not published

	for _, args := range [][2]string{{"", "g"}, {"order", ""}} {
		_, err := b.Next(ctx, args[0], args[1])
		require.ErrorIs(t, err, broker.ErrInvalid, "next %q %q", args[0], args[1])
	}
	require.ErrorIs(t, b.Ack(ctx, "order", "g", ""), broker.ErrInvalid)
	require.ErrorIs(t, b.Nack(ctx, "order", "g", ""), broker.ErrInvalid)
	require.NoError(t, b.Publish(ctx), "publishing nothing")
}

func testPublishHonoursContext(t *testing.T, e *env) {
	b := e.open(nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, b.Publish(ctx, msg("order", "m1")), context.Canceled)
	_, err := b.Next(ctx, "order", "g")
	require.ErrorIs(t, err, context.Canceled)
	e.empty("order", "g")
}

func testRoundTrip(t *testing.T, e *env) {
	b := e.open(nil)
	in := delivery.Message{
		ID:             "0b0e8c3a-5f0e-4d1c-9a53-3f2a1b7c9d10",
		Stream:         "order",
		Type:           "OrderPlaced",
		Data:           json.RawMessage(`{"order_id":"o-1","client_id":"c-1","total":12.5}`),
		Metadata:       json.RawMessage(`{"correlation_id":"k"}`),
		EventStream:    "order-o-1",
		Position:       3,
		GlobalPosition: 42,
		Time:           time.Date(2026, 2, 3, 4, 5, 6, 7000, time.UTC),
		PartitionKey:   "c-1",
	}
	require.NoError(t, b.Publish(context.Background(), in))
	d := e.next("order", "g", in.ID)
	require.Equal(t, "g", d.Group)
	require.Equal(t, 1, d.Attempt)
	require.JSONEq(t, string(in.Data), string(d.Data))
	require.JSONEq(t, string(in.Metadata), string(d.Metadata))
	got := d.Message
	got.Data, got.Metadata, in.Data, in.Metadata = nil, nil, nil, nil
	require.True(t, in.Time.Equal(got.Time), "time %s, want %s", got.Time, in.Time)
	got.Time = in.Time
	require.Equal(t, in, got)
	if e.f.Clock {
		require.True(t, Epoch.Equal(d.DeliveredAt), "delivered at %s", d.DeliveredAt)
	}
}

func testFIFOPerStream(t *testing.T, e *env) {
	e.need(e.f.Ordered)
	b := e.open(nil)
	// Interleave two streams, one batch across both.
	require.NoError(t, b.Publish(context.Background(),
		msg("order", "o1"), msg("payment", "p1"), msg("order", "o2")))
	e.publish("payment", "p2")
	e.publish("order", "o3")
	for _, id := range []string{"o1", "o2", "o3"} {
		e.ack("order", "g", e.next("order", "g", id).ID)
	}
	e.empty("order", "g")
	// Unacked messages do not hold later ones back.
	e.next("payment", "g", "p1")
	e.next("payment", "g", "p2")
	e.empty("payment", "g")
}

func testEmptyAndUnknown(t *testing.T, e *env) {
	e.open(nil)
	e.empty("order", "g")
	e.publish("order", "m1")
	e.empty("payment", "g")
	e.next("order", "g", "m1")
	e.empty("order", "g")
}

func testIndependentGroups(t *testing.T, e *env) {
	e.open(nil)
	e.publish("order", "m1", "m2")
	e.ack("order", "a", e.next("order", "a", "m1").ID)
	e.ack("order", "a", e.next("order", "a", "m2").ID)
	e.empty("order", "a")
	// Group b starts from the beginning, whatever a did.
	d := e.next("order", "b", "m1")
	require.Equal(t, 1, d.Attempt)
	require.ErrorIs(t, e.b.Ack(context.Background(), "order", "b", "m2"), broker.ErrNotDelivered)
	e.nack("order", "b", "m1")
	e.publish("order", "m3")
	e.next("order", "a", "m3")
}

func testGroupSharesMessages(t *testing.T, e *env) {
	e.need(e.f.Ordered)
	e.open(nil)
	e.publish("order", "m1", "m2")
	// Two consumers of one group: each message goes to one of them.
	e.next("order", "g", "m1")
	e.next("order", "g", "m2")
	e.empty("order", "g")
}

func testAckIdempotent(t *testing.T, e *env) {
	e.open(nil)
	e.publish("order", "m1", "m2")
	e.next("order", "g", "m1")
	e.ack("order", "g", "m1")
	e.ack("order", "g", "m1")
	e.next("order", "g", "m2")
	e.empty("order", "g") // an acked message is never redelivered
}

func testAckErrors(t *testing.T, e *env) {
	b := e.open(func(o *broker.Options) { o.Delay = 0 })
	ctx := context.Background()
	e.publish("order", "m1", "m2")
	require.ErrorIs(t, b.Ack(ctx, "order", "g", "m1"), broker.ErrNotDelivered, "before any delivery")
	e.next("order", "g", "m1")
	require.ErrorIs(t, b.Ack(ctx, "order", "g", "m2"), broker.ErrNotDelivered, "not delivered yet")
	require.ErrorIs(t, b.Ack(ctx, "order", "g", "nope"), broker.ErrNotDelivered, "unknown id")
	require.ErrorIs(t, b.Ack(ctx, "payment", "g", "m1"), broker.ErrNotDelivered, "other stream")
	require.ErrorIs(t, b.Ack(ctx, "order", "other", "m1"), broker.ErrNotDelivered, "other group")
	e.nack("order", "g", "m1")
	require.ErrorIs(t, b.Ack(ctx, "order", "g", "m1"), broker.ErrNotInFlight, "after nack")
	d := e.next("order", "g", "m1")
	require.Equal(t, 2, d.Attempt)
	e.ack("order", "g", "m1") // the redelivery can be acked
}

func testNackErrors(t *testing.T, e *env) {
	b := e.open(nil)
	ctx := context.Background()
	e.publish("order", "m1")
	require.ErrorIs(t, b.Nack(ctx, "order", "g", "m1"), broker.ErrNotDelivered)
	require.ErrorIs(t, b.Nack(ctx, "order", "g", "nope"), broker.ErrNotDelivered)
	e.next("order", "g", "m1")
	e.ack("order", "g", "m1")
	require.ErrorIs(t, b.Nack(ctx, "order", "g", "m1"), broker.ErrAcked)
	e.empty("order", "g")
}

func testNackIdempotent(t *testing.T, e *env) {
	e.open(func(o *broker.Options) { o.Delay, o.MaxRetries = 0, 1 })
	e.publish("order", "m1")
	e.next("order", "g", "m1")
	e.nack("order", "g", "m1")
	e.nack("order", "g", "m1") // counts once: one retry is left
	d := e.next("order", "g", "m1")
	require.Equal(t, 2, d.Attempt)
	e.ack("order", "g", "m1")
	e.empty("order", "g")
}

func testRequeueImmediate(t *testing.T, e *env) {
	e.open(func(o *broker.Options) { o.Delay = 0 })
	e.publish("order", "m1")
	for attempt := 1; attempt <= 3; attempt++ {
		d := e.next("order", "g", "m1")
		require.Equal(t, attempt, d.Attempt)
		e.nack("order", "g", "m1")
	}
	e.ack("order", "g", e.next("order", "g", "m1").ID)
	e.empty("order", "g")
}

func testRequeueBackoff(t *testing.T, e *env) {
	e.need(e.f.Clock)
	e.open(nil) // 3 retries after 1s, 2s, 4s
	e.publish("order", "m1")
	e.next("order", "g", "m1")
	for retry, delay := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} {
		e.nack("order", "g", "m1")
		e.clk.Advance(delay - time.Nanosecond)
		e.empty("order", "g")
		e.clk.Advance(time.Nanosecond)
		d := e.next("order", "g", "m1")
		require.Equal(t, retry+2, d.Attempt)
		require.True(t, e.clk.Now().Equal(d.DeliveredAt))
	}
	e.ack("order", "g", "m1")
}

// A consumer that knows a retry cannot help rejects the message: it is
// dead-lettered at once, whatever retries it had left.
func testRejectDeadLettersAtOnce(t *testing.T, e *env) {
	e.need(e.f.DeadLetters)
	e.open(nil) // 3 retries
	e.publish("order", "m1", "m2")
	rj, ok := e.b.(broker.Rejecter)
	require.True(t, ok, "Features.DeadLetters: broker must implement broker.Rejecter")
	ctx := context.Background()
	require.ErrorIs(t, rj.Reject(ctx, "order", "g", "m1"), broker.ErrNotDelivered)
	require.Equal(t, 1, e.next("order", "g", "m1").Attempt)
	require.NoError(t, rj.Reject(ctx, "order", "g", "m1"))
	require.NoError(t, rj.Reject(ctx, "order", "g", "m1"), "rejecting a dead letter again is a no-op")
	e.next("order", "g", "m2")
	e.ack("order", "g", "m2")
	require.ErrorIs(t, rj.Reject(ctx, "order", "g", "m2"), broker.ErrAcked)
	e.empty("order", "g")
	e.onlyDeadLetter("order", "g", "m1", broker.ReasonRejected, 1)
}

func testDeadLetterAfterMaxRetries(t *testing.T, e *env) {
	e.need(e.f.DeadLetters)
	e.open(func(o *broker.Options) { o.Delay = 0 })
	e.publish("order", "m1")
	for attempt := 1; attempt <= 4; attempt++ { // 1 delivery + 3 retries
		require.Equal(t, attempt, e.next("order", "g", "m1").Attempt)
		e.nack("order", "g", "m1")
	}
	e.empty("order", "g")
	dl := e.deadLetters("order", "g")
	require.Len(t, dl, 1)
	require.Equal(t, "m1", dl[0].ID)
	require.Equal(t, "order", dl[0].Stream)
	require.Equal(t, "g", dl[0].Group)
	require.Equal(t, broker.ReasonMaxRetries, dl[0].Reason)
	require.Equal(t, 4, dl[0].Attempts)
	require.JSONEq(t, `{"id":"m1"}`, string(dl[0].Data))
	if e.f.Clock {
		require.True(t, Epoch.Equal(dl[0].FailedAt))
	}
	require.Empty(t, e.deadLetters("order", "other"), "the DLQ is per group")
	e.nack("order", "g", "m1") // nacking a dead letter again is a no-op
	require.ErrorIs(t, e.b.Ack(context.Background(), "order", "g", "m1"), broker.ErrNotInFlight)
	require.Len(t, e.deadLetters("order", "g"), 1)
}

func testMaxRetriesZero(t *testing.T, e *env) {
	e.need(e.f.DeadLetters)
	e.open(func(o *broker.Options) { o.MaxRetries = 0 })
	e.publish("order", "m1")
	e.next("order", "g", "m1")
	e.nack("order", "g", "m1")
	e.empty("order", "g")
	dl := e.deadLetters("order", "g")
	require.Len(t, dl, 1)
	require.Equal(t, 1, dl[0].Attempts)
}

func testDiscardWithoutDLQ(t *testing.T, e *env) {
	b := e.open(func(o *broker.Options) { o.MaxRetries, o.EnableDLQ = 0, false })
	require.False(t, b.Capabilities().Has(broker.DeadLetterQueue), "no DLQ, no DeadLetterQueue capability")
	e.publish("order", "m1", "m2")
	e.next("order", "g", "m1")
	e.nack("order", "g", "m1")
	e.next("order", "g", "m2")
	e.empty("order", "g")
	e.nack("order", "g", "m1")
	require.ErrorIs(t, b.Ack(context.Background(), "order", "g", "m1"), broker.ErrNotInFlight)
	if d, ok := b.(broker.DeadLetterer); ok {
		dl, err := d.DLQ(context.Background(), "order", "g")
		require.NoError(t, err)
		require.Empty(t, dl)
	}
}

func testDeadLetterUnblocks(t *testing.T, e *env) {
	e.need(e.f.Ordered)
	e.open(func(o *broker.Options) { o.MaxRetries, o.Delay = 1, 0 })
	e.publish("order", "m1", "m2")
	e.next("order", "g", "m1")
	e.nack("order", "g", "m1")
	e.next("order", "g", "m1")
	e.nack("order", "g", "m1") // dead
	e.next("order", "g", "m2")
}

func testInFlightTimeout(t *testing.T, e *env) {
	e.need(e.f.MessageTimeout, e.f.DeadLetters, e.f.Clock)
	b := e.open(nil) // 300s
	ctx := context.Background()
	e.publish("order", "m1", "m2", "m3")
	e.next("order", "g", "m1")
	e.clk.Advance(100 * time.Second)
	e.next("order", "g", "m2")
	e.clk.Advance(200 * time.Second)
	e.ack("order", "g", "m1") // exactly the timeout: still in flight
	e.clk.Advance(time.Nanosecond)
	e.next("order", "g", "m3")
	require.Empty(t, e.deadLetters("order", "g"))
	e.clk.Advance(100 * time.Second) // m2 now 300s+1ns in flight
	e.empty("order", "g")
	dl := e.onlyDeadLetter("order", "g", "m2", broker.ReasonTimeout, 1)
	require.True(t, e.clk.Now().Equal(dl.FailedAt))
	require.ErrorIs(t, b.Ack(ctx, "order", "g", "m2"), broker.ErrNotInFlight, "ack after timeout")
	e.nack("order", "g", "m2") // a late nack is a no-op
	// The timeout is judged whenever the group is touched, not only by Next.
	e.clk.Advance(300 * time.Second)
	require.ErrorIs(t, b.Ack(ctx, "order", "g", "m3"), broker.ErrNotInFlight)
	require.Len(t, e.deadLetters("order", "g"), 2)
}

func testInFlightTimeoutWithoutDLQ(t *testing.T, e *env) {
	e.need(e.f.MessageTimeout, e.f.Clock)
	b := e.open(func(o *broker.Options) { o.EnableDLQ = false })
	e.publish("order", "m1", "m2")
	e.next("order", "g", "m1")
	e.clk.Advance(301 * time.Second)
	e.next("order", "g", "m2")
	require.ErrorIs(t, b.Ack(context.Background(), "order", "g", "m1"), broker.ErrNotInFlight)
	e.empty("order", "g")
}

func testReplay(t *testing.T, e *env) {
	e.need(e.f.DeadLetters, e.f.Ordered)
	e.open(func(o *broker.Options) { o.MaxRetries = 0 })
	ctx := context.Background()
	e.publish("order", "m1", "m2", "m3", "m4")
	e.next("order", "g", "m1")
	e.next("order", "g", "m2")
	e.nack("order", "g", "m2") // dead
	e.clk.Advance(time.Second)
	e.nack("order", "g", "m1") // dead
	e.next("order", "g", "m3")
	dl := e.deadLetters("order", "g")
	require.Len(t, dl, 2)
	if e.f.Clock {
		require.Equal(t, "m2", dl[0].ID, "oldest failure first")
		require.Equal(t, "m1", dl[1].ID)
	} else {
		require.ElementsMatch(t, []string{"m1", "m2"}, []string{dl[0].ID, dl[1].ID})
	}

	require.NoError(t, e.dlq().Replay(ctx, "order", "g", "m2"))
	require.NoError(t, e.dlq().Replay(ctx, "order", "g", "m1"))
	require.Empty(t, e.deadLetters("order", "g"))
	// Back at the head, ahead of m4, in publish order, attempts reset.
	d := e.next("order", "g", "m1")
	require.Equal(t, 1, d.Attempt)
	e.next("order", "g", "m2")
	e.next("order", "g", "m4")
	// Replay affects only its group.
	e.next("order", "other", "m1")
	// A replayed message has its retries again: nack dead-letters it anew.
	e.nack("order", "g", "m1")
	require.Len(t, e.deadLetters("order", "g"), 1)
}

func testReplayErrors(t *testing.T, e *env) {
	e.need(e.f.DeadLetters)
	e.open(func(o *broker.Options) { o.MaxRetries = 0 })
	ctx := context.Background()
	d := e.dlq()
	e.publish("order", "m1", "m2")
	require.ErrorIs(t, d.Replay(ctx, "order", "g", "m1"), broker.ErrNotDeadLettered, "never delivered")
	require.ErrorIs(t, d.Replay(ctx, "order", "g", "nope"), broker.ErrNotDeadLettered, "unknown")
	e.next("order", "g", "m1")
	require.ErrorIs(t, d.Replay(ctx, "order", "g", "m1"), broker.ErrNotDeadLettered, "in flight")
	e.nack("order", "g", "m1")
	require.NoError(t, d.Replay(ctx, "order", "g", "m1"))
	require.ErrorIs(t, d.Replay(ctx, "order", "g", "m1"), broker.ErrNotDeadLettered, "replayed twice")
	require.ErrorIs(t, d.Replay(ctx, "order", "other", "m1"), broker.ErrNotDeadLettered, "other group")
}

func testHoldTheLine(t *testing.T, e *env) {
	e.need(e.f.HoldTheLine, e.f.Clock)
	e.open(nil)
	e.publish("order", "m1", "m2", "m3")
	e.next("order", "g", "m1")
	e.nack("order", "g", "m1")
	// m1 waits 1s for its retry, and m2 waits behind it.
	e.empty("order", "g")
	e.clk.Advance(999 * time.Millisecond)
	e.empty("order", "g")
	e.clk.Advance(time.Millisecond)
	e.ack("order", "g", e.next("order", "g", "m1").ID)
	e.next("order", "g", "m2")
	e.next("order", "g", "m3")
}

func testHoldTheLineScope(t *testing.T, e *env) {
	e.need(e.f.HoldTheLine, e.f.Clock)
	e.open(nil)
	e.publish("order", "m1", "m2")
	e.publish("payment", "p1")
	e.next("order", "g", "m1")
	e.nack("order", "g", "m1")
	e.empty("order", "g")
	e.next("payment", "g", "p1")   // other stream, same group
	e.next("order", "other", "m1") // same stream, other group
	e.next("order", "other", "m2")
}

func testRequeuedInPublishOrder(t *testing.T, e *env) {
	e.need(e.f.HoldTheLine)
	e.open(func(o *broker.Options) { o.Delay = 0 })
	e.publish("order", "m1", "m2", "m3")
	e.next("order", "g", "m1")
	e.next("order", "g", "m2")
	e.nack("order", "g", "m2")
	e.nack("order", "g", "m1")
	e.next("order", "g", "m1")
	e.next("order", "g", "m2")
	e.next("order", "g", "m3")
}

func testStats(t *testing.T, e *env) {
	e.need(e.f.Stats, e.f.DeadLetters)
	e.open(func(o *broker.Options) { o.MaxRetries, o.Delay = 1, 0 })
	require.Equal(t, broker.Stats{}, e.stats("order", "g"))
	e.publish("order", "m1", "m2", "m3", "m4")
	require.Equal(t, broker.Stats{Depth: 4}, e.stats("order", "g"))
	e.next("order", "g", "m1")
	e.next("order", "g", "m2")
	e.next("order", "g", "m3")
	require.Equal(t, broker.Stats{Depth: 1, InFlight: 3}, e.stats("order", "g"))
	e.nack("order", "g", "m1")
	e.ack("order", "g", "m3")
	require.Equal(t, broker.Stats{Depth: 2, Requeued: 1, InFlight: 1}, e.stats("order", "g"))
	e.next("order", "g", "m1")
	e.nack("order", "g", "m1") // dead
	require.Equal(t, broker.Stats{Depth: 1, InFlight: 1, DeadLetters: 1}, e.stats("order", "g"))
	require.Equal(t, broker.Stats{Depth: 4}, e.stats("order", "other"))
}

func testWaitDelivers(t *testing.T, e *env) {
	e.need(e.f.Blocking)
	e.open(nil)
	ctx := context.Background()
	e.publish("order", "m1")
	r := within(t, e.waitAsync(ctx, "order", "g"), "wait with a message ready")
	require.NoError(t, r.err)
	require.Equal(t, "m1", r.d.ID)

	ch := e.waitAsync(ctx, "order", "g")
	other := e.waitAsync(ctx, "order", "other")
	e.publish("payment", "p1") // another stream does not wake it with a message
	pending(t, ch, "wait on an empty stream")
	e.publish("order", "m2")
	r = within(t, ch, "wait woken by publish")
	require.NoError(t, r.err)
	require.Equal(t, "m2", r.d.ID)
	r = within(t, other, "wait of a second group")
	require.NoError(t, r.err)
	require.Equal(t, "m1", r.d.ID)
}

func testWaitHonoursContext(t *testing.T, e *env) {
	e.need(e.f.Blocking)
	e.open(nil)
	ctx, cancel := context.WithCancel(context.Background())
	ch := e.waitAsync(ctx, "order", "g")
	cancel()
	r := within(t, ch, "wait after cancel")
	require.ErrorIs(t, r.err, context.Canceled)
	// The cancelled wait took nothing: the next message still arrives.
	e.publish("order", "m1")
	e.next("order", "g", "m1")

	dctx, dcancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer dcancel()
	r = within(t, e.waitAsync(dctx, "order", "g"), "wait past its deadline")
	require.ErrorIs(t, r.err, context.DeadlineExceeded)
}

func testWaitWakesForRetry(t *testing.T, e *env) {
	e.need(e.f.Blocking, e.f.Clock, e.f.HoldTheLine)
	e.open(nil)
	e.publish("order", "m1", "m2")
	e.next("order", "g", "m1")
	e.nack("order", "g", "m1")
	ch := e.waitAsync(context.Background(), "order", "g")
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	require.NoError(t, e.clk.WaitTimers(ctx, 1), "wait should arm a timer for the retry")
	pending(t, ch, "wait held by a requeued message")
	e.clk.Advance(time.Second)
	r := within(t, ch, "wait woken by the retry delay")
	require.NoError(t, r.err)
	require.Equal(t, "m1", r.d.ID)
	require.Equal(t, 2, r.d.Attempt)
}

func testWaitWakesForNack(t *testing.T, e *env) {
	e.need(e.f.Blocking)
	e.open(func(o *broker.Options) { o.Delay = 0 })
	e.publish("order", "m1")
	e.next("order", "g", "m1")
	ch := e.waitAsync(context.Background(), "order", "g")
	pending(t, ch, "wait with the only message in flight")
	e.nack("order", "g", "m1")
	r := within(t, ch, "wait woken by a nack")
	require.NoError(t, r.err)
	require.Equal(t, 2, r.d.Attempt)

	if !e.f.Clock || !e.f.HoldTheLine {
		return
	}
	// A waiter blocked before a delayed requeue learns of it and wakes
	// when it is due.
	e.open(nil)
	e.publish("order", "m1")
	e.next("order", "g", "m1")
	ch = e.waitAsync(context.Background(), "order", "g")
	e.nack("order", "g", "m1")
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	require.NoError(t, e.clk.WaitTimers(ctx, 1), "wait should arm a timer for the retry")
	e.clk.Advance(time.Second)
	r = within(t, ch, "wait woken by the retry delay")
	require.NoError(t, r.err)
	require.Equal(t, "m1", r.d.ID)
}

func testClose(t *testing.T, e *env) {
	b := e.open(nil)
	ctx := context.Background()
	e.publish("order", "m1", "m2")
	e.next("order", "g", "m1")
	require.NoError(t, b.Close())
	require.NoError(t, b.Close(), "second close")
	require.ErrorIs(t, b.Publish(ctx, msg("order", "m3")), broker.ErrClosed)
	_, err := b.Next(ctx, "order", "g")
	require.ErrorIs(t, err, broker.ErrClosed)
	require.ErrorIs(t, b.Ack(ctx, "order", "g", "m1"), broker.ErrClosed)
	require.ErrorIs(t, b.Nack(ctx, "order", "g", "m1"), broker.ErrClosed)
	if w, ok := b.(broker.Waiter); ok {
		_, err := w.Wait(ctx, "order", "g")
		require.ErrorIs(t, err, broker.ErrClosed)
	}
	_ = b.Capabilities() // still answers
}

func testCloseWakesWaiters(t *testing.T, e *env) {
	e.need(e.f.Blocking)
	b := e.open(nil)
	var chans []<-chan result
	for _, g := range []string{"a", "b", "c"} {
		chans = append(chans, e.waitAsync(context.Background(), "order", g))
	}
	require.NoError(t, b.Close())
	for _, ch := range chans {
		r := within(t, ch, "wait woken by close")
		require.ErrorIs(t, r.err, broker.ErrClosed)
	}
}

func testIsolation(t *testing.T, e *env) {
	b := e.open(nil)
	m := msg("order", "m1")
	require.NoError(t, b.Publish(context.Background(), m))
	m.Data[2] = 'X' // the caller's buffer is not the broker's
	d := e.next("order", "g", "m1")
	require.JSONEq(t, `{"id":"m1"}`, string(d.Data))
	d.Data[2] = 'X' // nor is a consumer's
	require.JSONEq(t, `{"id":"m1"}`, string(e.next("order", "other", "m1").Data))
}

func testDeduplicates(t *testing.T, e *env) {
	e.need(e.f.Deduplicates)
	b := e.open(nil)
	e.publish("order", "m1", "m2")
	dup := msg("order", "m1")
	dup.Type = "Changed"
	require.NoError(t, b.Publish(context.Background(), dup, msg("order", "m3"), msg("order", "m3")))
	require.Equal(t, "Tested", e.next("order", "g", "m1").Type, "the first message wins")
	e.next("order", "g", "m2")
	e.next("order", "g", "m3")
	e.empty("order", "g")
	e.publish("payment", "m1") // IDs are per stream
	e.next("payment", "g", "m1")
}

// testBatch pins broker.Batcher: a batch is the ready messages in order;
// a released message comes back untried (same attempt) in publish order
// behind an earlier one awaiting its retry; a redelivery runs alone.
func testBatch(t *testing.T, e *env) {
	e.need(e.f.HoldTheLine, e.f.Clock)
	b := e.open(nil)
	bt, ok := b.(broker.Batcher)
	e.need(ok)
	ctx := context.Background()
	batch := func(limit int, want ...string) []broker.Delivery {
		t.Helper()
		ds, err := bt.NextBatch(ctx, "order", "g", limit)
		if len(want) == 0 {
			require.ErrorIs(t, err, broker.ErrEmpty)
			return nil
		}
		require.NoError(t, err)
		var ids []string
		for _, d := range ds {
			ids = append(ids, d.ID)
		}
		require.Equal(t, want, ids)
		return ds
	}
	batch(3)
	e.publish("order", "m1", "m2", "m3", "m4", "m5")
	ds := batch(3, "m1", "m2", "m3")
	for _, d := range ds {
		require.Equal(t, 1, d.Attempt, d.ID)
	}
	e.ack("order", "g", "m1")
	e.nack("order", "g", "m2")
	require.NoError(t, bt.Release(ctx, "order", "g", "m3"))
	require.NoError(t, bt.Release(ctx, "order", "g", "m3"), "release twice")
	require.ErrorIs(t, bt.Release(ctx, "order", "g", "m1"), broker.ErrAcked)
	require.ErrorIs(t, bt.Release(ctx, "order", "g", "m5"), broker.ErrNotDelivered)
	// m2 holds the line for its retry delay; m3 waits behind it.
	batch(10)
	e.clk.Advance(time.Second)
	ds = batch(10, "m2") // a redelivery runs alone
	require.Equal(t, 2, ds[0].Attempt)
	e.ack("order", "g", "m2")
	ds = batch(10, "m3", "m4", "m5")
	require.Equal(t, 1, ds[0].Attempt, "a released message was not tried")
	for _, d := range ds {
		e.ack("order", "g", d.ID)
	}
	batch(10)
	require.Zero(t, e.stats("order", "g").InFlight)
}
