package redisstream_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/internal/redisstream"
)

// TestDeadLettersListsEveryDLQStream: DeadLetters finds the DLQ streams
// by SCAN, every group's and a partition's (told by its unit), at most
// perStream of each, and skips a key that only looks like one (the hash
// of a group named "dlq").
func TestDeadLettersListsEveryDLQStream(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, prefix := client(t)
	opts := broker.DefaultOptions()
	opts.MaxRetries = 0
	b, err := redisstream.New(c, redisstream.Options{Options: opts, Prefix: prefix, Consumer: "test"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	require.NoError(t, b.Publish(ctx, msg("order", "o1"), msg("order", "o2"), msg("payment", "p1")))
	kill := func(stream, group string, ids ...string) {
		for _, id := range ids {
			d, err := b.Next(ctx, stream, group)
			require.NoError(t, err)
			require.Equal(t, id, d.ID)
			require.NoError(t, b.Nack(ctx, stream, group, id))
		}
	}
	kill("order", "a", "o1", "o2")
	kill("order", "b", "o1")
	kill("payment", "a", "p1")
	_, err = b.Next(ctx, "order", "dlq") // a group named dlq: its hash ends in :dlq
	require.NoError(t, err)
	// A partition's dead letter, as `partitions dlq` writes it.
	require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: prefix + "order:c-1:dlq", Values: []any{"id", "k1", "type", "Placed", "data", `{"n":1}`,
		"dl_group", "a", "dl_reason", "max_retries", "dl_attempts", "3", "dl_failed_at", "1700000000 5", "dl_entry", "1-0",
		"dl_stream", "order:c-1", "dl_unit", "order:c-1"}}).Err())

	all, err := b.DeadLetters(ctx, "", 100)
	require.NoError(t, err)
	type row struct{ stream, group, id, unit string }
	var got []row
	for _, dl := range all {
		got = append(got, row{dl.Stream, dl.Group, dl.ID, dl.Unit})
	}
	require.Equal(t, []row{{"order", "a", "o1", ""}, {"order", "a", "o2", ""}, {"order", "b", "o1", ""},
		{"order:c-1", "a", "k1", "order:c-1"}, {"payment", "a", "p1", ""}}, got)
	p := all[3]
	require.Equal(t, "Placed", p.Type)
	require.Equal(t, 3, p.Attempts)
	require.Equal(t, int64(1700000000), p.FailedAt.Unix())

	capped, err := b.DeadLetters(ctx, "", 2)
	require.NoError(t, err)
	require.Len(t, capped, 4, "two of order's three, and the others' one each")
	one, err := b.DeadLetters(ctx, "payment", 100)
	require.NoError(t, err)
	require.Len(t, one, 1)
	require.Equal(t, "p1", one[0].ID)
	_, err = b.DeadLetters(ctx, "", 0)
	require.ErrorIs(t, err, broker.ErrInvalid)
}
