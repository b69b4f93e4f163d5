package redisstream_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/redisstream"
)

func rate(b *testing.B, n int, start time.Time) {
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "msgs/s")
}

// BenchmarkPublish: the broker's Publish (one Lua script per call: XADD,
// id index, partition index), without and with the epoch check, beside raw
// XADDs, one per round trip and pipelined, on the same server in the same
// run.
func BenchmarkPublish(b *testing.B) {
	ctx := context.Background()
	for _, batch := range []int{1, 50} {
		// broker+epoch is the host's publish: the epoch marker and the
		// server's run_id checked in the script (PublishIn).
		for _, epoch := range []bool{false, true} {
			name := "broker"
			if epoch {
				name = "broker+epoch"
			}
			b.Run(fmt.Sprintf("%s/batch=%d", name, batch), func(b *testing.B) {
				c, prefix := client(b)
				br, err := redisstream.New(c, redisstream.Options{Options: broker.DefaultOptions(), Prefix: prefix, Epoch: epoch})
				require.NoError(b, err)
				if epoch {
					require.NoError(b, br.SetEpoch(ctx, "bench"))
				}
				msgs := make([]delivery.Message, batch)
				b.ResetTimer()
				start := time.Now()
				for i := 0; i < b.N; i += batch {
					for j := range msgs {
						m := msg("order:c-1", fmt.Sprintf("m%d", i+j))
						m.PartitionKey, m.Category = "c-1", "order"
						msgs[j] = m
					}
					if err := br.PublishIn(ctx, "bench", msgs...); err != nil {
						b.Fatal(err)
					}
				}
				rate(b, b.N, start)
			})
		}
		b.Run(fmt.Sprintf("raw-xadd/batch=%d", batch), func(b *testing.B) {
			c, prefix := client(b)
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i += batch {
				_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
					for j := range batch {
						m := msg("order:c-1", fmt.Sprintf("m%d", i+j))
						m.PartitionKey, m.Category = "c-1", "order"
						p.XAdd(ctx, &redis.XAddArgs{Stream: prefix + "order:c-1", Values: redisstream.Encode(m)})
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			rate(b, b.N, start)
		})
	}
}

// BenchmarkConsume: the broker's Next/Ack loop (two Lua scripts per
// message, plus a trim every TrimEvery acks) beside a raw XREADGROUP COUNT 1 / XACK loop on the same server.
func BenchmarkConsume(b *testing.B) {
	ctx := context.Background()
	fill := func(b *testing.B, c *redis.Client, stream string) {
		b.Helper()
		br, err := redisstream.New(c, redisstream.Options{Options: broker.DefaultOptions()})
		require.NoError(b, err)
		for i := 0; i < b.N; i += 500 {
			var msgs []delivery.Message
			for j := i; j < min(i+500, b.N); j++ {
				msgs = append(msgs, msg(stream, fmt.Sprintf("m%d", j)))
			}
			require.NoError(b, br.Publish(ctx, msgs...))
		}
	}
	// broker trims every DefaultTrimEvery acks (as in production);
	// broker-no-trim shows what that trimming costs.
	for _, v := range []struct {
		name string
		trim int
	}{{"broker", 0}, {"broker-no-trim", -1}} {
		b.Run(v.name, func(b *testing.B) {
			c, prefix := client(b)
			fill(b, c, prefix+"order")
			br, err := redisstream.New(c, redisstream.Options{Options: broker.DefaultOptions(), Prefix: prefix, TrimEvery: v.trim})
			require.NoError(b, err)
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				d, err := br.Next(ctx, "order", "g")
				if err != nil {
					b.Fatal(err)
				}
				if err := br.Ack(ctx, "order", "g", d.ID); err != nil {
					b.Fatal(err)
				}
			}
			rate(b, b.N, start)
		})
	}
	b.Run("raw-xreadgroup", func(b *testing.B) {
		c, prefix := client(b)
		s := prefix + "order"
		fill(b, c, s)
		require.NoError(b, c.XGroupCreate(ctx, s, "g", "0").Err())
		b.ResetTimer()
		start := time.Now()
		for range b.N {
			res, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{s, ">"}, Count: 1}).Result()
			if err != nil {
				b.Fatal(err)
			}
			e := res[0].Messages[0]
			if _, err := redisstream.Decode(e.ID, e.Values); err != nil {
				b.Fatal(err)
			}
			if err := c.XAck(ctx, s, "g", e.ID).Err(); err != nil {
				b.Fatal(err)
			}
		}
		rate(b, b.N, start)
	})
}
