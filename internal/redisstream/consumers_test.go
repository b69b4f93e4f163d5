package redisstream_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/clock"
	"github.com/proteanhq/protean-host/internal/owner"
	"github.com/proteanhq/protean-host/internal/redisstream"
	"github.com/proteanhq/protean-host/internal/testlog"
	"github.com/proteanhq/protean-host/internal/testwait"
)

// consumers returns the group's consumers by name: pending entries and
// idle milliseconds.
func consumers(t *testing.T, c *redis.Client, key, group string) map[string]redis.XInfoConsumer {
	t.Helper()
	cs, err := c.XInfoConsumers(context.Background(), key, group).Result()
	require.NoError(t, err)
	out := make(map[string]redis.XInfoConsumer, len(cs))
	for _, x := range cs {
		out[x.Name] = x
	}
	return out
}

// waitIdle waits until the named consumer has been idle longer than d by
// Redis's clock, which is what the sweep judges.
func waitIdle(t *testing.T, c *redis.Client, key, group, name string, d time.Duration) {
	t.Helper()
	testwait.For(t, name+" idle longer than "+d.String(), func() (bool, string) {
		x, ok := consumers(t, c, key, group)[name]
		return ok && x.Idle > d, fmt.Sprintf("%+v (present %v)", x, ok)
	})
}

// TestRestartsDoNotPileUpConsumers: every host start reads with a fresh
// consumer name (owner.New); the reads of the live one delete the idle,
// empty consumers of earlier starts, so the group keeps a bounded number
// of consumers however often the host restarts, and each deletion is
// logged at INFO with its group and consumer.
func TestRestartsDoNotPileUpConsumers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, prefix := client(t)
	const idle, restarts = 50 * time.Millisecond, 12
	logs := &testlog.Buffer{}
	opts := broker.DefaultOptions()
	opts.Logger = slog.New(slog.NewTextHandler(logs, nil))
	var names []string
	for i := range restarts {
		name := owner.New()
		names = append(names, name)
		b, err := redisstream.New(c, redisstream.Options{Options: opts, Prefix: prefix, Consumer: name, ConsumerIdle: idle})
		require.NoError(t, err)
		require.NoError(t, b.Publish(ctx, msg("order", fmt.Sprintf("m%d", i))))
		d, err := b.Next(ctx, "order", "g")
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("m%d", i), d.ID)
		require.NoError(t, b.Ack(ctx, "order", "g", d.ID))
		// This start's own reads (idle polling) clear its predecessors.
		testwait.For(t, fmt.Sprintf("start %d: only its own consumer in the group", i), func() (bool, string) {
			_, err := b.Next(ctx, "order", "g")
			require.ErrorIs(t, err, broker.ErrEmpty)
			cs := consumers(t, c, prefix+"order", "g")
			_, own := cs[name]
			return own && len(cs) == 1, fmt.Sprint(cs)
		})
		require.NoError(t, b.Close()) // a crash or a deploy: the name is never used again
	}
	out := logs.String()
	for _, name := range names[:restarts-1] {
		require.Contains(t, out, `msg="broker: deleted idle consumer" stream=order group=g consumer=`+name)
	}
	require.Equal(t, restarts-1, strings.Count(out, "deleted idle consumer"), out)
}

// TestSweepKeepsAConsumerWithPendingEntries: a dead consumer that holds
// unsettled messages is not deleted however long it is idle (XGROUP
// DELCONSUMER would drop its pending entries); once its entries were
// settled elsewhere (redelivered to a live consumer after a Nack, or
// dead-lettered by MessageTimeout) it is.
func TestSweepKeepsAConsumerWithPendingEntries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, prefix := client(t)
	const idle = 50 * time.Millisecond
	var mu sync.Mutex
	now := time.Date(2026, 12, 1, 7, 0, 0, 0, time.UTC)
	opts := broker.DefaultOptions()
	opts.Delay = time.Millisecond
	opts.Clock = clock.Funcs{NowFunc: func() time.Time { mu.Lock(); defer mu.Unlock(); return now }}
	newB := func(name string) *redisstream.Broker {
		b, err := redisstream.New(c, redisstream.Options{Options: opts, Prefix: prefix, Consumer: name, ConsumerIdle: idle})
		require.NoError(t, err)
		t.Cleanup(func() { _ = b.Close() })
		return b
	}
	dead1, dead2, live := newB("dead-1"), newB("dead-2"), newB("live")
	key := prefix + "order"
	require.NoError(t, dead1.Publish(ctx, msg("order", "m1"), msg("order", "m2")))

	// dead-1 takes m1, dead-2 takes m2, dead-1 nacks m1 (it waits in the
	// requeued line, still in dead-1's pending list); both then die.
	d, err := dead1.Next(ctx, "order", "g")
	require.NoError(t, err)
	require.Equal(t, "m1", d.ID)
	d, err = dead2.Next(ctx, "order", "g")
	require.NoError(t, err)
	require.Equal(t, "m2", d.ID)
	require.NoError(t, dead1.Nack(ctx, "order", "g", "m1"))
	require.NoError(t, dead1.Close())
	require.NoError(t, dead2.Close())

	waitIdle(t, c, key, "g", "dead-1", idle)
	waitIdle(t, c, key, "g", "dead-2", idle)
	gone, err := live.SweepConsumers(ctx, "order", "g")
	require.NoError(t, err)
	require.Empty(t, gone, "consumers with pending entries are kept")
	for _, sg := range [][2]string{{"order", "nogroup"}, {"nostream", "g"}} {
		gone, err := live.SweepConsumers(ctx, sg[0], sg[1])
		require.NoError(t, err, sg)
		require.Empty(t, gone, sg)
	}
	cs := consumers(t, c, key, "g")
	require.EqualValues(t, 1, cs["dead-1"].Pending)
	require.EqualValues(t, 1, cs["dead-2"].Pending)

	// The live consumer gets m1 again (XCLAIM moves it to its list): the
	// sweep that its read runs deletes dead-1, which holds nothing now,
	// and keeps dead-2, which still holds m2.
	mu.Lock()
	now = now.Add(time.Second) // m1's retry is due
	mu.Unlock()
	d, err = live.Next(ctx, "order", "g")
	require.NoError(t, err)
	require.Equal(t, "m1", d.ID)
	require.Equal(t, 2, d.Attempt)
	require.ElementsMatch(t, []string{"dead-2", "live"}, keys(consumers(t, c, key, "g")))
	require.NoError(t, live.Ack(ctx, "order", "g", "m1"))

	// m2 times out: dead-lettered (XACK), so dead-2 holds nothing either,
	// and the same read's sweep deletes it.
	mu.Lock()
	now = now.Add(opts.MessageTimeout + time.Second)
	mu.Unlock()
	waitIdle(t, c, key, "g", "dead-2", idle)
	_, err = live.Next(ctx, "order", "g")
	require.ErrorIs(t, err, broker.ErrEmpty)
	dl, err := live.DLQ(ctx, "order", "g")
	require.NoError(t, err)
	require.Len(t, dl, 1)
	require.Equal(t, "m2", dl[0].ID)
	require.Equal(t, broker.ReasonTimeout, dl[0].Reason)
	require.Equal(t, []string{"live"}, keys(consumers(t, c, key, "g")))
}

func keys(m map[string]redis.XInfoConsumer) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestDeletedIdleConsumerKeepsReceiving: a live consumer blocked in Wait
// with nothing pending may be deleted by another's sweep; its next read
// (XREADGROUP) creates it again, and it receives the next message. A
// sweep never deletes its own consumer, however idle.
func TestDeletedIdleConsumerKeepsReceiving(t *testing.T) {
	t.Parallel()
	ctx := testwait.Context(t)
	c, prefix := client(t)
	const idle = 50 * time.Millisecond
	key := prefix + "order"
	opts := broker.DefaultOptions()
	a, err := redisstream.New(c, redisstream.Options{Options: opts, Prefix: prefix, Consumer: "a", ConsumerIdle: -1, BlockSlice: time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	b, err := redisstream.New(c, redisstream.Options{Options: opts, Prefix: prefix, Consumer: "b", ConsumerIdle: idle})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })

	// Each has read a message, so each is a consumer of the group (an
	// XREADGROUP that finds nothing does not create one on Redis 7.0).
	require.NoError(t, b.Publish(ctx, msg("order", "m0"), msg("order", "m1")))
	for _, x := range []*redisstream.Broker{a, b} {
		d, err := x.Next(ctx, "order", "g")
		require.NoError(t, err)
		require.NoError(t, x.Ack(ctx, "order", "g", d.ID))
	}
	type result struct {
		d   broker.Delivery
		err error
	}
	got := make(chan result, 1)
	go func() {
		d, err := a.Wait(ctx, "order", "g")
		got <- result{d, err}
	}()
	waitIdle(t, c, key, "g", "a", idle) // a is blocked in XREAD, without its group
	waitIdle(t, c, key, "g", "b", idle)
	gone, err := b.SweepConsumers(ctx, "order", "g")
	require.NoError(t, err)
	require.Equal(t, []string{"a"}, gone, "b keeps itself")
	require.Equal(t, []string{"b"}, keys(consumers(t, c, key, "g")))

	require.NoError(t, b.Publish(ctx, msg("order", "m2")))
	r := testwait.Recv(t, "a's Wait to deliver m2", got)
	require.NoError(t, r.err)
	require.Equal(t, "m2", r.d.ID)
	require.EqualValues(t, 1, consumers(t, c, key, "g")["a"].Pending, "a exists again and holds m2")
	require.NoError(t, a.Ack(ctx, "order", "g", "m2"))
}
