package redispartition_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/redispartition"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/partition"
)

// holdAcks is a consumer whose workers hold their acks for delay and read
// again only on a wake-up (the safety net's re-read an hour away).
func holdAcks(delay time.Duration) func(*redispartition.ConsumerOptions) {
	return func(o *redispartition.ConsumerOptions) {
		o.AckDelay = delay
		o.Poll = time.Hour
	}
}

// pendingIDs are the entries of key's stream pending in group proj.
func (r *rig) pendingIDs(key string) []string {
	r.t.Helper()
	p, err := r.rdb.XPendingExt(context.Background(), &redis.XPendingExtArgs{
		Stream: r.prefix + partition.StreamName("order", key), Group: "proj", Start: "-", End: "+", Count: 100}).Result()
	require.NoError(r.t, err)
	ids := make([]string, len(p))
	for i, e := range p {
		ids[i] = e.ID
	}
	return ids
}

// waitNonePending waits until key's stream has no entry pending.
func (r *rig) waitNonePending(key, what string) {
	r.t.Helper()
	testwait.For(r.t, what, func() (bool, string) {
		p := r.pendingIDs(key)
		return len(p) == 0, fmt.Sprint(p)
	})
}

// holdingThree publishes three messages to c-1 and starts a consumer
// (not stopped at the test's end) that applies them and holds their acks
// for an hour.
func (r *rig) holdingThree(h *effects) *redispartition.Consumer {
	r.t.Helper()
	r.pub.publish("order", "c-1", 3)
	c := r.consumer("host-a", h, time.Hour, holdAcks(time.Hour))
	require.NoError(r.t, c.Start(context.Background()))
	r.waitApplied(h)
	require.Len(r.t, r.pendingIDs("c-1"), 3, "applied, the acks held")
	return c
}

// wake announces a publish to key, as the broker's publish does.
func (r *rig) wake(key string) {
	r.t.Helper()
	require.NoError(r.t, r.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: r.prefix + redispartition.WakeKey("order"), Values: []any{key, "1"}}).Err())
}

// entryIDs are the ids of key's stream entries, oldest first.
func (r *rig) entryIDs(key string) []string {
	r.t.Helper()
	es, err := r.rdb.XRange(context.Background(), r.prefix+partition.StreamName("order", key), "-", "+").Result()
	require.NoError(r.t, err)
	ids := make([]string, len(es))
	for i, e := range es {
		ids[i] = e.ID
	}
	return ids
}

// A worker holds the acks of what it applied (AckDelay), and sends them
// with its next read of the unit: the entry it applied first stays
// pending until the wake-up for the second, whose read acks it; nothing
// else could have (the hold is an hour, nothing reaps, halts or stops).
// The lag metrics count a held entry as handled.
func TestHeldAcksRideWithTheNextRead(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	h := newEffects(r.store)
	c := r.consumer("host-a", h, time.Hour, holdAcks(time.Hour))
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c.LagCollector())
	r.pub.publish("order", "c-1", 1)
	start(t, c)
	r.waitApplied(h)
	first := r.entryIDs("c-1")
	require.Len(t, first, 1)
	require.Equal(t, first, r.pendingIDs("c-1"), "applied, its ack held")
	lag := func() string {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() == "protean_partition_lag" {
				return fmt.Sprintf("%d series, lag %g", len(mf.GetMetric()), mf.GetMetric()[0].GetGauge().GetValue())
			}
		}
		return "none"
	}
	// The worker holds the ack just after the handler returns (Handled),
	// so the gauge may lag the applied log by a moment: wait for it.
	testwait.For(t, "a held ack's entry counted as handled", func() (bool, string) {
		got := lag()
		return got == "1 series, lag 0", got
	})

	r.pub.publish("order", "c-1", 1)
	r.wake("c-1")
	r.waitApplied(h)
	r.requireExactlyOnceInOrder(h)
	both := r.entryIDs("c-1")
	require.Len(t, both, 2)
	require.Equal(t, both[1:], r.pendingIDs("c-1"), "the read of the second acked the first; the second's ack is held")
}

// With no read to ride with, held acks go on their own AckDelay after the
// first of them.
func TestHeldAcksGoAfterTheDelay(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	h := newEffects(r.store)
	r.pub.publish("order", "c-1", 3)
	start(t, r.consumer("host-a", h, time.Hour, holdAcks(20*time.Millisecond)))
	r.waitApplied(h)
	r.waitNonePending("c-1", "the held acks sent")
}

// A worker that lets its unit go (a stop) sends what it holds first: the
// next owner finds nothing pending.
func TestStopSendsTheHeldAcks(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	h := newEffects(r.store)
	a := r.holdingThree(h)
	require.NoError(t, a.Stop(context.Background()))
	require.Empty(t, r.pendingIDs("c-1"), "sent before the release")
}

// An owner that loses its lease with acks held loses them; the next
// owner acks those entries as applied, by the positions row, and applies
// nothing twice.
func TestHeldAcksOfALostLeaseAreAckedByTheNextOwner(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	h := newEffects(r.store)
	a := r.holdingThree(h)
	// The lease lapses under a (a stall): its acks at the stop are fenced.
	require.NoError(t, r.rdb.Del(context.Background(), r.prefix+redispartition.LeaseKey("proj", "order:c-1")).Err())
	require.NoError(t, a.Stop(context.Background()))
	require.Len(t, r.pendingIDs("c-1"), 3, "the fenced owner acked nothing")

	b := r.consumer("host-b", h, time.Hour)
	start(t, b)
	r.pub.publish("order", "c-1", 1)
	r.waitApplied(h)
	r.requireExactlyOnceInOrder(h)
	h.mu.Lock()
	for _, id := range []string{"m-1", "m-2", "m-3", "m-4"} {
		require.Equal(t, 1, h.calls[id], id)
	}
	h.mu.Unlock()
	r.waitNonePending("c-1", "the next owner acked them")
}

// Held acks do not keep a unit from being reaped: a held ack's entry is
// pending, and a unit with pending entries is not idle, so the worker
// sends them before it tries (and its idle re-read would carry them).
func TestHeldAcksDoNotKeepAUnitFromTheReap(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	h := newEffects(r.store)
	r.pub.publish("order", "c-1", 2)
	start(t, r.consumer("host-a", h, time.Hour, holdAcks(time.Hour), func(o *redispartition.ConsumerOptions) {
		o.ReapIdle = time.Millisecond
	}))
	r.waitApplied(h)
	testwait.For(t, "the unit reaped", func() (bool, string) {
		n, err := r.rdb.Exists(context.Background(), r.prefix+partition.StreamName("order", "c-1")).Result()
		return err == nil && n == 0, fmt.Sprintf("stream exists: %d (%v)", n, err)
	})
}

func TestAckDelayIsChecked(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	opts := r.options("host-a", newEffects(r.store), time.Hour)
	opts.AckDelay = -time.Millisecond
	_, err := redispartition.NewConsumer(opts)
	require.ErrorContains(t, err, "ack delay must be >= 0, got -1ms")
}
