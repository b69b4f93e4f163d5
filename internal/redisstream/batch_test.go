package redisstream_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/broker/brokertest"
	"github.com/proteanhq/protean-host/internal/redisstream"
)

// A malformed entry inside a batch ends it: the messages before it are
// delivered, it comes next as its DecodeError (as from Next), and the
// messages after it follow, untried and in order.
func TestBatchStopsAtAPoisonEntry(t *testing.T) {
	t.Parallel()
	clk := brokertest.NewClock(brokertest.Epoch)
	opts := broker.DefaultOptions()
	opts.Clock = clk
	c, prefix := client(t)
	b, err := redisstream.New(c, redisstream.Options{Options: opts, Prefix: prefix})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, b.Publish(ctx, msg("order", "m1")))
	require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: prefix + "order", Values: []any{"id", "p1", "data", "{"}}).Err())
	require.NoError(t, b.Publish(ctx, msg("order", "m2"), msg("order", "m3")))

	ids := func(ds []broker.Delivery) (out []string) {
		for _, d := range ds {
			out = append(out, d.ID)
			require.Equal(t, 1, d.Attempt, d.ID)
		}
		return out
	}
	ds, err := b.NextBatch(ctx, "order", "g", 10)
	require.NoError(t, err)
	require.Equal(t, []string{"m1"}, ids(ds))
	_, err = b.NextBatch(ctx, "order", "g", 10)
	require.ErrorIs(t, err, redisstream.ErrMalformed)
	ds, err = b.NextBatch(ctx, "order", "g", 10)
	require.NoError(t, err)
	require.Equal(t, []string{"m2", "m3"}, ids(ds))
	for _, id := range []string{"m1", "m2", "m3"} {
		require.NoError(t, b.Ack(ctx, "order", "g", id))
	}

	clk.Advance(opts.MessageTimeout + time.Nanosecond)
	dl, err := b.DLQ(ctx, "order", "g")
	require.NoError(t, err)
	require.Len(t, dl, 1)
	require.Equal(t, "p1", dl[0].ID)
}
