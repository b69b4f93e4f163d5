package redisstream_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/redisstream"
)

// TestDedupeIndexStaysBounded: under continuous publishing and consuming,
// the trims that Acks run keep the stream and its id index at about
// TrimEvery entries, not one per message ever published. A republish of a
// message still in the stream is dropped; the dedupe window is the stream.
func TestDedupeIndexStaysBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, prefix := client(t)
	const every, total = 16, 600
	b, err := redisstream.New(c, redisstream.Options{Options: broker.DefaultOptions(), Prefix: prefix, Consumer: "test", TrimEvery: every})
	require.NoError(t, err)
	ids := prefix + "order:__ids__"

	for i := 0; i < total; i += 50 {
		var msgs []delivery.Message
		for j := i; j < i+50; j++ {
			msgs = append(msgs, msg("order", fmt.Sprintf("m%d", j)))
		}
		require.NoError(t, b.Publish(ctx, msgs...))
		for range msgs {
			d, err := b.Next(ctx, "order", "g")
			require.NoError(t, err)
			require.NoError(t, b.Ack(ctx, "order", "g", d.ID))
		}
		require.LessOrEqual(t, c.HLen(ctx, ids).Val(), int64(every+1), "after %d messages", i+50)
	}
	require.Equal(t, c.XLen(ctx, prefix+"order").Val(), c.HLen(ctx, ids).Val(), "one index field per entry left")

	// The last message is still in the stream: its republish is dropped.
	got, err := b.PublishIDs(ctx, msg("order", fmt.Sprintf("m%d", total-1)))
	require.NoError(t, err)
	require.Equal(t, []string{""}, got)
	_, err = b.Next(ctx, "order", "g")
	require.ErrorIs(t, err, broker.ErrEmpty)

	// Partitioned streams use the same index; partition.Leases.Trim bounds it.
	for i := range 40 {
		m := msg("order:c-1", fmt.Sprintf("p%d", i))
		m.PartitionKey, m.Category = "c-1", "order"
		require.NoError(t, b.Publish(ctx, m))
	}
	require.NoError(t, c.XGroupCreate(ctx, prefix+"order:c-1", "h", "$").Err()) // delivered and acked all
	n, err := b.Trim(ctx, "order:c-1")
	require.NoError(t, err)
	require.EqualValues(t, 39, n)
	require.EqualValues(t, 1, c.HLen(ctx, prefix+"order:c-1:__ids__").Val())
}

// TestTrimKeepsDeadLettersReplayable: a dead letter is acked by its group,
// so a trim may remove its entry; it stays listed, replayable with its
// content, ackable, and dead-letterable again.
func TestTrimKeepsDeadLettersReplayable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, prefix := client(t)
	opts := broker.DefaultOptions()
	opts.MaxRetries, opts.EnableDLQ = 0, true
	b, err := redisstream.New(c, redisstream.Options{Options: opts, Prefix: prefix, Consumer: "test", TrimEvery: -1})
	require.NoError(t, err)
	require.NoError(t, b.Publish(ctx, msg("order", "m1"), msg("order", "m2"), msg("order", "m3")))

	d, err := b.Next(ctx, "order", "g")
	require.NoError(t, err)
	require.Equal(t, "m1", d.ID)
	require.NoError(t, b.Nack(ctx, "order", "g", "m1")) // past MaxRetries: dead
	d, err = b.Next(ctx, "order", "g")
	require.NoError(t, err)
	require.Equal(t, "m2", d.ID)
	require.NoError(t, b.Ack(ctx, "order", "g", "m2"))

	n, err := b.Trim(ctx, "order")
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "m1 (dead, acked) goes; m2 is the last delivered entry and stays")
	require.False(t, c.HExists(ctx, prefix+"order:__ids__", "m1").Val())

	require.ErrorIs(t, b.Ack(ctx, "order", "g", "m1"), broker.ErrNotInFlight, "still known as dead-lettered")
	dl, err := b.DLQ(ctx, "order", "g")
	require.NoError(t, err)
	require.Len(t, dl, 1)
	require.Equal(t, "m1", dl[0].ID)

	require.NoError(t, b.Replay(ctx, "order", "g", "m1"))
	d, err = b.Next(ctx, "order", "g")
	require.NoError(t, err)
	require.Equal(t, "m1", d.ID, "the replayed letter comes first, from its kept copy")
	require.JSONEq(t, `{"id":"m1"}`, string(d.Data))
	require.Equal(t, "Tested", d.Type)

	// Dead again: the copy goes back to the DLQ whole, and replays again.
	require.NoError(t, b.Nack(ctx, "order", "g", "m1"))
	dl, err = b.DLQ(ctx, "order", "g")
	require.NoError(t, err)
	require.Len(t, dl, 1)
	require.JSONEq(t, `{"id":"m1"}`, string(dl[0].Data))
	require.NoError(t, b.Replay(ctx, "order", "g", "m1"))
	d, err = b.Next(ctx, "order", "g")
	require.NoError(t, err)
	require.Equal(t, "m1", d.ID)
	require.NoError(t, b.Ack(ctx, "order", "g", "m1"))

	d, err = b.Next(ctx, "order", "g")
	require.NoError(t, err)
	require.Equal(t, "m3", d.ID)
	require.NoError(t, b.Ack(ctx, "order", "g", "m3"))

	// Nothing of m1 is left in the group's state.
	fields, err := c.HKeys(ctx, prefix+"order:__group__:g").Result()
	require.NoError(t, err)
	for _, f := range fields {
		require.False(t, strings.HasPrefix(f, "r:") || strings.HasPrefix(f, "d:"), "left over: %s", f)
	}
	st, err := b.Stats(ctx, "order", "g")
	require.NoError(t, err)
	require.Equal(t, broker.Stats{}, st)
}

// TestTrimWaitsForEveryGroup: Ack-driven trims never remove what another
// group has not read; a group created after a trim starts at what is left.
func TestTrimWaitsForEveryGroup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, prefix := client(t)
	b, err := redisstream.New(c, redisstream.Options{Options: broker.DefaultOptions(), Prefix: prefix, Consumer: "test", TrimEvery: 1})
	require.NoError(t, err)
	var msgs []delivery.Message
	for i := range 10 {
		msgs = append(msgs, msg("order", fmt.Sprintf("m%d", i)))
	}
	require.NoError(t, b.Publish(ctx, msgs...))

	// slow has read one message and holds it; fast reads and acks all.
	d, err := b.Next(ctx, "order", "slow")
	require.NoError(t, err)
	require.Equal(t, "m0", d.ID)
	for i := range 10 {
		d, err := b.Next(ctx, "order", "fast")
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("m%d", i), d.ID)
		require.NoError(t, b.Ack(ctx, "order", "fast", d.ID))
	}
	require.EqualValues(t, 10, c.XLen(ctx, prefix+"order").Val(), "slow's pending m0 holds every entry")

	require.NoError(t, b.Ack(ctx, "order", "slow", "m0"))
	require.EqualValues(t, 10, c.XLen(ctx, prefix+"order").Val(), "m0 is slow's last delivered entry: kept")
	for i := 1; i < 10; i++ {
		d, err := b.Next(ctx, "order", "slow")
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("m%d", i), d.ID)
		require.NoError(t, b.Ack(ctx, "order", "slow", d.ID))
	}
	require.EqualValues(t, 1, c.XLen(ctx, prefix+"order").Val())

	// Retention is until every existing group acked: a new group starts at what is left.
	d, err = b.Next(ctx, "order", "late")
	require.NoError(t, err)
	require.Equal(t, "m9", d.ID)
}
