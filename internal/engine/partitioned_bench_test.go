package engine

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/redispartition"
	"github.com/proteanhq/protean-host/internal/redisstream"
	"github.com/proteanhq/protean-host/internal/routes"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/unitofwork"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
	"github.com/proteanhq/protean-host/partition"
)

// counting wraps the engine's partition handler to tell when every
// message was handled.
type counting struct {
	delivery.Handler
	n    atomic.Int64
	want int64
	done chan struct{}
}

func (c *counting) Handle(ctx context.Context, b delivery.Batch) (int, error) {
	n, err := c.Handler.Handle(ctx, b)
	if c.n.Add(int64(n)) == c.want {
		close(c.done)
	}
	return n, err
}

// BenchmarkPartitionedWASM measures ordered events per second through the
// whole partitioned consumer with a trivial WASM projector (a Go guest that
// decodes each event and does nothing, deadline enforced), committing the
// fenced position in the memory stores, with 1 and 64 keys. Compare with
// redispartition.BenchmarkConsumer (the same consumer with a native no-op
// handler) and redispartition.BenchmarkRawStreamLoop from the same run.
func BenchmarkPartitionedWASM(b *testing.B) {
	ctx := context.Background()
	l, err := host.NewLoader(host.LoaderOptions{CacheDir: wasmbuild.CacheDir(b)})
	require.NoError(b, err)
	b.Cleanup(func() { _ = l.Close(ctx) })
	dir := b.TempDir()
	wasmbuild.Copy(b, wasmbuild.Build(b, "./internal/host/testdata/plugins/declared", "variant=projector"), dir, "by_client.wasm")
	for _, keys := range []int{1, 64} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			set, errs := host.LoadSet(ctx, l, dir, host.Broker{Name: "default", Provider: "redis", Capabilities: broker.StreamPartitioning})
			require.Empty(b, errs)
			mem := unitofwork.NewMemory()
			e := New(set, Options{Events: mem.Events, Records: mem.Records, Partitioned: true,
				UnitOfWork: unitofwork.New(mem, unitofwork.Options{Broker: "default"})})
			b.Cleanup(func() { _ = e.Stop(ctx) })
			url, prefix := testserver.Redis(b)
			opt, err := redis.ParseURL(url)
			require.NoError(b, err)
			rdb := redis.NewClient(opt)
			b.Cleanup(func() { _ = rdb.Close() })
			n := max(b.N, keys)
			pipe := rdb.Pipeline()
			for i := 0; i < n; i++ {
				key := "c" + strconv.Itoa(i%keys)
				msg := delivery.Message{ID: "m-" + strconv.Itoa(i), Type: "OrderPlaced", Category: "order",
					EventStream: "order-o" + strconv.Itoa(i), GlobalPosition: int64(i + 1), PartitionKey: key,
					Data: []byte(fmt.Sprintf(`{"order_id":"o%d","client_id":%q,"total":1.5}`, i, key))}
				pipe.XAdd(ctx, &redis.XAddArgs{Stream: prefix + partition.StreamName("order", key), Values: redisstream.Encode(msg)})
				pipe.SAdd(ctx, prefix+redispartition.IndexKey("order"), key)
			}
			_, err = pipe.Exec(ctx)
			require.NoError(b, err)
			h := &counting{Handler: e.Handler(), want: int64(n), done: make(chan struct{})}
			c, err := redispartition.NewConsumer(redispartition.ConsumerOptions{
				Leases: redispartition.NewLeases(rdb, prefix), Positions: mem.Positions, Handler: h, Decode: redisstream.Decode,
				Owner: "bench", Subscriptions: routes.Of(e.Set(), true).Partitions,
				LeaseTTL: 10 * time.Second, Heartbeat: time.Second, Poll: 250 * time.Millisecond, ReapIdle: time.Hour, Retry: delivery.Policy{MaxRetries: 3},
				Logger: benchLogger(),
			})
			require.NoError(b, err)
			b.ResetTimer()
			start := time.Now()
			require.NoError(b, c.Start(ctx))
			select {
			case <-h.done:
			case <-time.After(time.Minute):
				b.Fatalf("handled %d of %d", h.n.Load(), n)
			}
			elapsed := time.Since(start)
			b.StopTimer()
			require.NoError(b, c.Stop(ctx))
			b.ReportMetric(float64(n)/elapsed.Seconds(), "msgs/s")
		})
	}
}

// benchLogger shows warnings and errors (a halt, a lost lease) in the
// benchmark's output.
func benchLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}
