package redisstream_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/broker/brokertest"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/redisstream"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/testwait"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// client returns a client of the test server and the test's key prefix.
func client(t testing.TB) (*redis.Client, string) {
	t.Helper()
	url, prefix := testserver.Redis(t)
	o, err := redis.ParseURL(url)
	require.NoError(t, err)
	o.PoolSize = 64 // the suite's stress test holds many blocking reads at once
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	return c, prefix
}

func newBroker(t testing.TB, opts broker.Options) *redisstream.Broker {
	t.Helper()
	c, prefix := client(t)
	b, err := redisstream.New(c, redisstream.Options{Options: opts, Prefix: prefix, Consumer: "test"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func TestConformance(t *testing.T) {
	features := brokertest.Features{
		Ordered:        true,
		HoldTheLine:    true,
		DeadLetters:    true,
		MessageTimeout: true,
		Blocking:       true,
		Stats:          true,
		Deduplicates:   true,
		Clock:          true,
	}
	brokertest.Run(t, features, func(t *testing.T, opts broker.Options) broker.Broker {
		return newBroker(t, opts)
	})
}

func msg(stream, id string) delivery.Message {
	return delivery.Message{ID: id, Stream: stream, Type: "Tested", Data: json.RawMessage(`{"id":"` + id + `"}`)}
}

func TestPublishIndexesPartitionKeysInTheSameScript(t *testing.T) {
	t.Parallel()
	c, prefix := client(t)
	b, err := redisstream.New(c, redisstream.Options{Options: broker.DefaultOptions(), Prefix: prefix})
	require.NoError(t, err)
	ctx := context.Background()

	m1 := msg("order:c-1", "m1")
	m1.PartitionKey, m1.Category = "c-1", "order"
	m2 := msg("order:c-2", "m2")
	m2.PartitionKey, m2.EventStream = "c-2", "order-o-2" // category from the event stream
	m3 := msg("order", "m3")                             // no key: no index
	ids, err := b.PublishIDs(ctx, m1, m2, m3)
	require.NoError(t, err)
	require.Len(t, ids, 3)
	for i, s := range []string{"order:c-1", "order:c-2", "order"} {
		entries, err := c.XRange(ctx, prefix+s, "-", "+").Result()
		require.NoError(t, err)
		require.Len(t, entries, 1, s)
		require.Equal(t, ids[i], entries[0].ID)
		got, err := redisstream.Decode(entries[0].ID, entries[0].Values)
		require.NoError(t, err)
		require.Equal(t, []string{"m1", "m2", "m3"}[i], got.ID)
	}
	keys, err := c.SMembers(ctx, prefix+"order:__partitions__").Result()
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"c-1", "c-2"}, keys)

	// A republished message is dropped from its stream, and its key stays indexed.
	require.NoError(t, c.SRem(ctx, prefix+"order:__partitions__", "c-1").Err())
	ids, err = b.PublishIDs(ctx, m1)
	require.NoError(t, err)
	require.Equal(t, []string{""}, ids)
	require.EqualValues(t, 1, c.XLen(ctx, prefix+"order:c-1").Val())
	require.True(t, c.SIsMember(ctx, prefix+"order:__partitions__", "c-1").Val())

	// All or nothing: one bad key fails the whole call before any write.
	require.NoError(t, c.Set(ctx, prefix+"payment:c-9", "not a stream", 0).Err())
	m4 := msg("order:c-3", "m4")
	m4.PartitionKey, m4.Category = "c-3", "order"
	m5 := msg("payment:c-9", "m5")
	m5.PartitionKey, m5.Category = "c-9", "payment"
	err = b.Publish(ctx, m4, m5)
	require.ErrorContains(t, err, "WRONGTYPE")
	require.EqualValues(t, 0, c.Exists(ctx, prefix+"order:c-3", prefix+"payment:__partitions__").Val())
	require.False(t, c.SIsMember(ctx, prefix+"order:__partitions__", "c-3").Val())

	bad := msg("x:k", "m6")
	bad.PartitionKey = "k" // no category, no event stream
	require.ErrorIs(t, b.Publish(ctx, bad), broker.ErrInvalid)
}

func TestPoisonEntryDoesNotBlockItsGroup(t *testing.T) {
	t.Parallel()
	clk := brokertest.NewClock(brokertest.Epoch)
	opts := broker.DefaultOptions()
	opts.Clock = clk
	c, prefix := client(t)
	b, err := redisstream.New(c, redisstream.Options{Options: opts, Prefix: prefix})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: prefix + "order", Values: []any{"id", "p1", "data", "{"}}).Err())
	require.NoError(t, b.Publish(ctx, msg("order", "m1")))

	_, err = b.Next(ctx, "order", "g")
	require.ErrorIs(t, err, redisstream.ErrMalformed)
	d, err := b.Next(ctx, "order", "g")
	require.NoError(t, err)
	require.Equal(t, "m1", d.ID)
	require.NoError(t, b.Ack(ctx, "order", "g", "m1"))

	clk.Advance(opts.MessageTimeout + time.Nanosecond)
	dl, err := b.DLQ(ctx, "order", "g")
	require.NoError(t, err, "a malformed dead letter is listed, not an error")
	require.Len(t, dl, 1)
	require.Equal(t, "p1", dl[0].ID)
	require.Equal(t, broker.ReasonTimeout, dl[0].Reason)
}

func TestInstancesShareAGroup(t *testing.T) {
	t.Parallel()
	c, prefix := client(t)
	opts := broker.DefaultOptions()
	opts.Delay = 0
	a, err := redisstream.New(c, redisstream.Options{Options: opts, Prefix: prefix, Consumer: "a"})
	require.NoError(t, err)
	b, err := redisstream.New(c, redisstream.Options{Options: opts, Prefix: prefix, Consumer: "b"})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, a.Publish(ctx, msg("order", "m1"), msg("order", "m2")))

	d, err := a.Next(ctx, "order", "g")
	require.NoError(t, err)
	require.Equal(t, "m1", d.ID)
	_, err = b.Next(ctx, "order", "g") // m2 goes to b: the line is not held by an in-flight message
	require.NoError(t, err)
	require.NoError(t, b.Ack(ctx, "order", "g", "m2"))

	// a waits; b nacks m1 (a settles what b delivered: state is in Redis);
	// a's blocking read wakes through the group's wake stream.
	done := make(chan broker.Delivery, 1)
	errs := make(chan error, 1)
	go func() {
		d, err := a.Wait(ctx, "order", "g")
		errs <- err
		done <- d
	}()
	require.NoError(t, b.Nack(ctx, "order", "g", "m1"))
	require.NoError(t, testwait.Recv(t, "the wait woken by another instance's nack", errs))
	d = <-done
	require.Equal(t, "m1", d.ID)
	require.Equal(t, 2, d.Attempt)
	pending, err := c.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: prefix + "order", Group: "g", Start: "-", End: "+", Count: 10}).Result()
	require.NoError(t, err)
	require.Len(t, pending, 1)
	require.Equal(t, "a", pending[0].Consumer, "the redelivery is claimed by its new consumer")
}

func TestWaitEndsOnCloseAndCancel(t *testing.T) {
	t.Parallel()
	b := newBroker(t, broker.DefaultOptions())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 2)
	go func() { _, err := b.Wait(ctx, "order", "g"); errs <- err }()
	cctx, ccancel := context.WithCancel(context.Background())
	go func() { _, err := b.Wait(cctx, "order", "other"); errs <- err }()
	ccancel()
	require.NoError(t, b.Close())
	var got []error
	for range 2 {
		got = append(got, testwait.Recv(t, "a wait to end on close or cancel", errs))
	}
	require.Condition(t, func() bool {
		return (errors.Is(got[0], broker.ErrClosed) || errors.Is(got[0], context.Canceled)) &&
			(errors.Is(got[1], broker.ErrClosed) || errors.Is(got[1], context.Canceled))
	}, "errors: %v", got)
}

// TestLostConnection: a broker whose Redis is gone (nothing listening, or
// a closed client) returns an error that says so; it does not hang.
func TestLostConnection(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	dead := redis.NewClient(&redis.Options{Addr: addr})
	defer dead.Close()

	live, prefix := client(t)
	closedClient := redis.NewClient(live.Options())
	require.NoError(t, closedClient.Close())

	for name, c := range map[string]*redis.Client{"nothing listening": dead, "closed client": closedClient} {
		t.Run(name, func(t *testing.T) {
			b, err := redisstream.New(c, redisstream.Options{Options: broker.DefaultOptions(), Prefix: prefix})
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			err = b.Publish(ctx, msg("order", "m1"))
			require.ErrorContains(t, err, "redisstream: publish")
			_, err = b.Next(ctx, "order", "g")
			require.ErrorContains(t, err, "redisstream: next: stream order: group g")
			_, err = b.Wait(ctx, "order", "g")
			require.Error(t, err)
			require.NotErrorIs(t, err, context.DeadlineExceeded, "wait must fail, not hang")
			require.NotErrorIs(t, err, broker.ErrEmpty)
			require.ErrorContains(t, b.Ack(ctx, "order", "g", "m1"), "redisstream: ack")
			t.Log(err)
		})
	}
}
