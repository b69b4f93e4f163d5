package partition_test

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/broker/redisstream"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/partition"
	"github.com/proteanhq/protean-host/position"
)

// noop is the native no-op handler: it takes every message and commits
// nothing, so a benchmark with it measures the consumer's own cost
// (discovery, leases, fenced reads and acks, decoding).
type noop struct {
	handled atomic.Int64
	done    chan struct{}
	want    int64
}

func (h *noop) Handle(_ context.Context, b partition.Batch) (int, error) {
	if h.handled.Add(int64(len(b.Messages))) == h.want {
		close(h.done)
	}
	return len(b.Messages), nil
}

// fenced is the no-op handler plus the fenced position commit a real
// handler's unit of work makes (in memory).
type fenced struct {
	noop
	store *position.Memory
}

func (h *fenced) Handle(ctx context.Context, b partition.Batch) (int, error) {
	tx := h.store.Begin()
	err := tx.Advance(ctx, position.Fence{Group: b.Group, Unit: b.Unit, Generation: b.Generation,
		Advance: map[string]int64{b.Source: b.Messages[len(b.Messages)-1].GlobalPosition}})
	if err != nil {
		tx.Rollback()
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, err
	}
	return h.noop.Handle(ctx, b)
}

// preload publishes n messages round-robin over keys partition streams of
// category "order", pipelined.
func preload(b *testing.B, rdb *redis.Client, prefix string, keys, n int) {
	b.Helper()
	ctx := context.Background()
	pipe := rdb.Pipeline()
	for i := 0; i < n; i++ {
		key := "k" + strconv.Itoa(i%keys)
		msg := broker.Message{ID: "m-" + strconv.Itoa(i), Type: "Happened", Category: "order", EventStream: "order-" + key,
			Data: []byte(`{"client_id":"` + key + `"}`), GlobalPosition: int64(i + 1), PartitionKey: key}
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: prefix + partition.StreamName("order", key), Values: redisstream.Encode(msg)})
		if i < keys {
			pipe.SAdd(ctx, prefix+partition.IndexKey("order"), key)
		}
		if pipe.Len() >= 1000 {
			_, err := pipe.Exec(ctx)
			require.NoError(b, err)
		}
	}
	_, err := pipe.Exec(ctx)
	require.NoError(b, err)
}

func benchRedis(b *testing.B) (*redis.Client, string) {
	b.Helper()
	url, prefix := testserver.Redis(b)
	opt, err := redis.ParseURL(url)
	require.NoError(b, err)
	opt.PoolSize = 64
	rdb := redis.NewClient(opt)
	b.Cleanup(func() { _ = rdb.Close() })
	return rdb, prefix
}

// BenchmarkConsumer measures ordered messages per second through the whole
// partitioned consumer (one instance) with 1, 64 and 1,000 keys, beside
// BenchmarkRawStreamLoop on the same server. b.N messages are published
// first; the timer covers discovery to the last message handled.
func BenchmarkConsumer(b *testing.B) {
	for _, keys := range []int{1, 64, 1000} {
		for _, kind := range []string{"noop", "fenced"} {
			b.Run(fmt.Sprintf("handler=%s/keys=%d", kind, keys), func(b *testing.B) {
				rdb, prefix := benchRedis(b)
				n := max(b.N, keys)
				preload(b, rdb, prefix, keys, n)
				var h partition.Handler
				var done chan struct{}
				store := position.NewMemory(nil)
				switch kind {
				case "noop":
					nh := &noop{done: make(chan struct{}), want: int64(n)}
					h, done = nh, nh.done
				default:
					fh := &fenced{noop: noop{done: make(chan struct{}), want: int64(n)}, store: store}
					h, done = fh, fh.done
				}
				c, err := partition.NewConsumer(partition.ConsumerOptions{
					Leases: partition.NewLeases(rdb, prefix), Positions: store, Handler: h,
					Decode: redisstream.Decode, Owner: "bench",
					Subscriptions: func() []partition.Subscription {
						return []partition.Subscription{{Group: "proj", Categories: []string{"order"}}}
					},
					LeaseTTL: 10 * time.Second, Heartbeat: time.Second, Poll: 250 * time.Millisecond, ReapIdle: time.Hour,
					Retry: delivery.Policy{MaxRetries: 3, Delay: time.Millisecond},
				})
				require.NoError(b, err)
				b.ResetTimer()
				start := time.Now()
				require.NoError(b, c.Start(context.Background()))
				select {
				case <-done:
				case <-time.After(2 * time.Minute):
					b.Fatalf("consumer did not finish: %d of %d handled", handled(h), n)
				}
				elapsed := time.Since(start)
				b.StopTimer()
				require.NoError(b, c.Stop(context.Background()))
				b.ReportMetric(float64(n)/elapsed.Seconds(), "msgs/s")
			})
		}
	}
}

// BenchmarkRawStreamLoop is the baseline: one go-redis client reading a
// stream with XREADGROUP COUNT 64 and acking each read with one XACK, no
// leases, no decoding, no order across keys to keep.
func BenchmarkRawStreamLoop(b *testing.B) {
	rdb, prefix := benchRedis(b)
	preload(b, rdb, prefix, 1, b.N)
	ctx := context.Background()
	stream := prefix + partition.StreamName("order", "k0")
	require.NoError(b, rdb.XGroupCreate(ctx, stream, "raw", "0").Err())
	b.ResetTimer()
	start := time.Now()
	got := 0
	for got < b.N {
		res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "raw", Consumer: "c", Streams: []string{stream, ">"}, Count: 64}).Result()
		require.NoError(b, err)
		ids := make([]string, 0, 64)
		for _, m := range res[0].Messages {
			ids = append(ids, m.ID)
		}
		require.NoError(b, rdb.XAck(ctx, stream, "raw", ids...).Err())
		got += len(ids)
	}
	b.ReportMetric(float64(got)/time.Since(start).Seconds(), "msgs/s")
}

// BenchmarkFailover measures the time from an owner's death (it holds
// the lease and vanishes: nothing renewed, nothing released) to the next
// message of its key handled by the surviving instance, at a 2 s lease TTL
// and the default heartbeat (TTL/5). Each iteration fails over 20 keys at
// once and reports p50 and p99 over all samples.
func BenchmarkFailover(b *testing.B) {
	const ttl, keys = 2 * time.Second, 20
	rdb, prefix := benchRedis(b)
	leases := partition.NewLeases(rdb, prefix)
	var samples []time.Duration
	for i := 0; i < b.N; i++ {
		require.NoError(b, rdb.Del(context.Background(), prefix+partition.IndexKey("order")).Err())
		died := map[string]time.Time{}
		for k := 0; k < keys; k++ {
			key := fmt.Sprintf("f%d-%d", i, k)
			preload1(b, rdb, prefix, key, int64(k+1))
			_, err := leases.Acquire(context.Background(), "proj", partition.PartitionUnit("order", key), "dead", ttl)
			require.NoError(b, err)
			died[partition.PartitionUnit("order", key)] = time.Now()
		}
		h := &firstSeen{at: map[string]time.Time{}, done: make(chan struct{}), want: keys}
		c, err := partition.NewConsumer(partition.ConsumerOptions{
			Leases: leases, Positions: position.NewMemory(nil), Handler: h, Decode: redisstream.Decode, Owner: "survivor",
			Subscriptions: func() []partition.Subscription {
				return []partition.Subscription{{Group: "proj", Categories: []string{"order"}}}
			},
			LeaseTTL: ttl, Heartbeat: ttl / 5, Poll: 10 * time.Millisecond, ReapIdle: time.Hour, Retry: delivery.Policy{MaxRetries: 3},
		})
		require.NoError(b, err)
		require.NoError(b, c.Start(context.Background()))
		select {
		case <-h.done:
		case <-time.After(time.Minute):
			b.Fatal("no failover")
		}
		require.NoError(b, c.Stop(context.Background()))
		h.mu.Lock()
		for unit, at := range h.at {
			samples = append(samples, at.Sub(died[unit]))
		}
		h.mu.Unlock()
	}
	sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
	b.ReportMetric(samples[len(samples)/2].Seconds(), "p50_s")
	b.ReportMetric(samples[(len(samples)*99)/100].Seconds(), "p99_s")
	b.ReportMetric(0, "ns/op")
}

// firstSeen records when each unit's first message was handled.
type firstSeen struct {
	mu   sync.Mutex
	at   map[string]time.Time
	done chan struct{}
	want int
}

func (h *firstSeen) Handle(_ context.Context, b partition.Batch) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.at[b.Unit]; !ok {
		h.at[b.Unit] = time.Now()
		if len(h.at) == h.want {
			close(h.done)
		}
	}
	return len(b.Messages), nil
}

func preload1(b *testing.B, rdb *redis.Client, prefix, key string, gp int64) {
	b.Helper()
	ctx := context.Background()
	msg := broker.Message{ID: key, Type: "Happened", Category: "order", GlobalPosition: gp, PartitionKey: key, Data: []byte(`{}`)}
	require.NoError(b, rdb.XAdd(ctx, &redis.XAddArgs{Stream: prefix + partition.StreamName("order", key), Values: redisstream.Encode(msg)}).Err())
	require.NoError(b, rdb.SAdd(ctx, prefix+partition.IndexKey("order"), key).Err())
}

func handled(h partition.Handler) int64 {
	switch h := h.(type) {
	case *noop:
		return h.handled.Load()
	case *fenced:
		return h.handled.Load()
	}
	return -1
}
