package redispartition_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/redispartition"
	"github.com/proteanhq/protean-host/internal/redisstream"
	"github.com/proteanhq/protean-host/internal/schema"
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

func (h *noop) Handle(_ context.Context, b delivery.Batch) (int, error) {
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

func (h *fenced) Handle(ctx context.Context, b delivery.Batch) (int, error) {
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
		msg := delivery.Message{ID: "m-" + strconv.Itoa(i), Type: "Happened", Category: "order", EventStream: "order-" + key,
			Data: []byte(`{"client_id":"` + key + `"}`), GlobalPosition: int64(i + 1), PartitionKey: key}
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: prefix + partition.StreamName("order", key), Values: redisstream.Encode(msg)})
		if i < keys {
			pipe.SAdd(ctx, prefix+redispartition.IndexKey("order"), key)
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
// partitioned consumer (one instance) with 1, 64, 1,000 and 10,000 keys,
// beside BenchmarkRawStreamLoop and BenchmarkRawKeyedLoop on the same
// server. b.N messages are published
// first; the timer covers discovery to the last message handled.
func BenchmarkConsumer(b *testing.B) {
	for _, keys := range []int{1, 64, 1000, 10000} {
		for _, kind := range []string{"noop", "fenced"} {
			b.Run(fmt.Sprintf("handler=%s/keys=%d", kind, keys), func(b *testing.B) {
				rdb, prefix := benchRedis(b)
				n := max(b.N, keys)
				preload(b, rdb, prefix, keys, n)
				var h delivery.Handler
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
				c, err := redispartition.NewConsumer(redispartition.ConsumerOptions{
					Leases: redispartition.NewLeases(rdb, prefix), Positions: store, Handler: h,
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

// BenchmarkRawKeyedLoop is the per-key-ordered baseline: b.N messages
// over keys streams, each stream read by one of up to 64 goroutines with
// XREADGROUP COUNT 64 and acked with one XACK per read, so each key's
// messages go in order and different keys in parallel; no leases, no
// decoding.
func BenchmarkRawKeyedLoop(b *testing.B) {
	for _, keys := range []int{1, 64, 1000, 10000} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			rdb, prefix := benchRedis(b)
			n := max(b.N, keys)
			preload(b, rdb, prefix, keys, n)
			ctx := context.Background()
			streams := make([]string, keys)
			for k := range streams {
				streams[k] = prefix + partition.StreamName("order", "k"+strconv.Itoa(k))
				require.NoError(b, rdb.XGroupCreate(ctx, streams[k], "raw", "0").Err())
			}
			workers := min(keys, 64)
			var got atomic.Int64
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for w := 0; w < workers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for got.Load() < int64(n) {
						idle := true
						for k := w; k < keys; k += workers {
							res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "raw", Consumer: "c", Streams: []string{streams[k], ">"}, Count: 64, Block: -1}).Result()
							if err != nil || len(res) == 0 || len(res[0].Messages) == 0 {
								continue
							}
							ids := make([]string, 0, len(res[0].Messages))
							for _, m := range res[0].Messages {
								ids = append(ids, m.ID)
							}
							if err := rdb.XAck(ctx, streams[k], "raw", ids...).Err(); err == nil {
								got.Add(int64(len(ids)))
								idle = false
							}
						}
						if idle && got.Load() >= int64(n) {
							return
						}
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(got.Load())/time.Since(start).Seconds(), "msgs/s")
		})
	}
}

// BenchmarkFailover measures the time from an owner's death (it holds
// the lease and vanishes: nothing renewed, nothing released) to the next
// message of its key handled by the surviving instance, at a 2 s lease TTL
// and the default heartbeat (TTL/5). Each iteration fails over 20 keys at
// once and reports p50 and p99 over all samples.
func BenchmarkFailover(b *testing.B) {
	const ttl, keys = 2 * time.Second, 20
	rdb, prefix := benchRedis(b)
	leases := redispartition.NewLeases(rdb, prefix)
	var samples []time.Duration
	for i := 0; i < b.N; i++ {
		require.NoError(b, rdb.Del(context.Background(), prefix+redispartition.IndexKey("order")).Err())
		// The dead owner heartbeated once: its leases hold for ttl.
		_, err := leases.Heartbeat(context.Background(), "dead", ttl, nil, nil)
		require.NoError(b, err)
		died := map[string]time.Time{}
		for k := 0; k < keys; k++ {
			key := fmt.Sprintf("f%d-%d", i, k)
			preload1(b, rdb, prefix, key, int64(k+1))
			_, err := leases.Acquire(context.Background(), "proj", partition.PartitionUnit("order", key), "dead")
			require.NoError(b, err)
			died[partition.PartitionUnit("order", key)] = time.Now()
		}
		h := &firstSeen{at: map[string]time.Time{}, done: make(chan struct{}), want: keys}
		c, err := redispartition.NewConsumer(redispartition.ConsumerOptions{
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

func (h *firstSeen) Handle(_ context.Context, b delivery.Batch) (int, error) {
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
	msg := delivery.Message{ID: key, Type: "Happened", Category: "order", GlobalPosition: gp, PartitionKey: key, Data: []byte(`{}`)}
	require.NoError(b, rdb.XAdd(ctx, &redis.XAddArgs{Stream: prefix + partition.StreamName("order", key), Values: redisstream.Encode(msg)}).Err())
	require.NoError(b, rdb.SAdd(ctx, prefix+redispartition.IndexKey("order"), key).Err())
}

func handled(h delivery.Handler) int64 {
	switch h := h.(type) {
	case *noop:
		return h.handled.Load()
	case *fenced:
		return h.handled.Load()
	}
	return -1
}

// BenchmarkIdle measures what a host holding keys idle partitions costs
// while nothing is published: its own CPU (the consumer's goroutines, as
// a share of one core) and the commands Redis runs per second, over a
// window of thirty heartbeats (0.5 s, a sixth of the default) after every partition is owned and drained; and
// the time from Start to owning them all. It also reports the Redis memory
// per partition (its stream of one message, index entry, lease, group).
func BenchmarkIdle(b *testing.B) {
	for _, keys := range []int{1000, 10000, 100000} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			rdb, prefix := benchRedis(b)
			ctx := context.Background()
			memBefore := usedMemory(b, rdb)
			preload(b, rdb, prefix, keys, keys)
			nh := &noop{done: make(chan struct{}), want: int64(keys)}
			const heartbeat = 500 * time.Millisecond
			opts := redispartition.DefaultConsumerOptions()
			opts.Leases, opts.Positions, opts.Handler, opts.Decode, opts.Owner = redispartition.NewLeases(rdb, prefix), position.NewMemory(nil), nh, redisstream.Decode, "idle"
			opts.Subscriptions = func() []partition.Subscription {
				return []partition.Subscription{{Group: "proj", Categories: []string{"order"}}}
			}
			opts.Heartbeat = heartbeat
			c, err := redispartition.NewConsumer(opts)
			require.NoError(b, err)
			b.ResetTimer()
			begin := time.Now()
			require.NoError(b, c.Start(ctx))
			defer func() { require.NoError(b, c.Stop(ctx)) }()
			for len(c.Owned()) < keys {
				time.Sleep(5 * time.Millisecond)
			}
			acquired := time.Since(begin)
			<-nh.done
			perPartition := float64(usedMemory(b, rdb)-memBefore) / float64(keys)
			// Past the trims that follow the drain, then a window long
			// enough to hold the safety net's re-reads at 1,000 keys
			// (idleWait: Poll, 10 s, plus a quarter).
			time.Sleep(4 * heartbeat)
			// At 100,000 keys the drain's trims run on for seconds: wait,
			// up to a minute, for a heartbeat with under 1,000 commands.
			for settle := time.Now(); time.Since(settle) < time.Minute; {
				before := totalCommands(b, rdb)
				time.Sleep(heartbeat)
				if totalCommands(b, rdb)-before < 1000 {
					break
				}
			}
			window := 30 * heartbeat
			cmds0, cpu0, t0 := totalCommands(b, rdb), processCPU(), time.Now()
			time.Sleep(window)
			cmds1, cpu1, elapsed := totalCommands(b, rdb), processCPU(), time.Since(t0)
			// One scrape of the lag metrics over every owned partition:
			// it must finish (4 series) within its bound.
			reg := prometheus.NewRegistry()
			reg.MustRegister(c.LagCollector())
			scrape := time.Now()
			mfs, err := reg.Gather()
			scraped := time.Since(scrape)
			require.NoError(b, err)
			require.Len(b, mfs, 4, "every lag series, read within the scrape's bound")
			b.StopTimer()
			require.Len(b, c.Owned(), keys, "a live, connected host lost leases")
			b.ReportMetric(scraped.Seconds(), "lag_scrape_s")
			b.ReportMetric(acquired.Seconds(), "acquire_s")
			b.ReportMetric(float64(cmds1-cmds0-1)/elapsed.Seconds(), "redis_cmds/s")
			b.ReportMetric(100*(cpu1-cpu0).Seconds()/elapsed.Seconds(), "cpu_%")
			b.ReportMetric(perPartition, "redis_B/partition")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// BenchmarkFirstEvent measures the time from the publish of a key never
// seen before to its first message handled, with 1,000 other partitions
// held idle, beside the raw floor in the same run: one go-redis XADD read
// by a reader blocked in XREAD on that stream.
func BenchmarkFirstEvent(b *testing.B) {
	rdb, prefix := benchRedis(b)
	ctx := context.Background()
	const idle, samples = 1000, 200
	preload(b, rdb, prefix, idle, idle)
	h := &firstSeen{at: map[string]time.Time{}, done: make(chan struct{}), want: idle + samples}
	opts := redispartition.DefaultConsumerOptions()
	opts.Leases, opts.Positions, opts.Handler, opts.Decode, opts.Owner = redispartition.NewLeases(rdb, prefix), position.NewMemory(nil), h, redisstream.Decode, "first"
	opts.Subscriptions = func() []partition.Subscription {
		return []partition.Subscription{{Group: "proj", Categories: []string{"order"}}}
	}
	c, err := redispartition.NewConsumer(opts)
	require.NoError(b, err)
	require.NoError(b, c.Start(ctx))
	defer func() { require.NoError(b, c.Stop(ctx)) }()
	for len(c.Owned()) < idle {
		time.Sleep(5 * time.Millisecond)
	}
	pub, err := redisstream.New(rdb, redisstream.Options{Options: broker.DefaultOptions(), Prefix: prefix, Consumer: "relay"})
	require.NoError(b, err)
	b.ResetTimer()
	var host, raw []time.Duration
	for i := 0; i < samples; i++ {
		key := "new" + strconv.Itoa(i)
		unit := partition.PartitionUnit("order", key)
		sent := time.Now()
		require.NoError(b, pub.Publish(ctx, delivery.Message{ID: key, Type: "Happened", Stream: partition.StreamName("order", key),
			Category: "order", EventStream: "order-" + key, Data: []byte(`{}`), GlobalPosition: int64(idle + i + 1), PartitionKey: key}))
		for {
			h.mu.Lock()
			at, ok := h.at[unit]
			h.mu.Unlock()
			if ok {
				host = append(host, at.Sub(sent))
				break
			}
			time.Sleep(100 * time.Microsecond)
		}
		raw = append(raw, rawFirstEvent(b, rdb, prefix+"raw:"+key))
	}
	b.StopTimer()
	p := func(ds []time.Duration, q int) float64 {
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		return float64(ds[(len(ds)-1)*q/100].Microseconds()) / 1000
	}
	b.ReportMetric(p(host, 50), "p50_ms")
	b.ReportMetric(p(host, 99), "p99_ms")
	b.ReportMetric(p(raw, 50), "raw_p50_ms")
	b.ReportMetric(p(raw, 99), "raw_p99_ms")
	b.ReportMetric(0, "ns/op")
}

// rawFirstEvent is the floor of BenchmarkFirstEvent: a reader blocked in
// XREAD on stream, one XADD, the time until the reader has it.
func rawFirstEvent(b *testing.B, rdb *redis.Client, stream string) time.Duration {
	ctx := context.Background()
	// Read after an id, not '$': a reader that blocks late still gets the
	// entry, so the floor never waits on a race.
	after, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"k", "start"}}).Result()
	require.NoError(b, err)
	blocked := func() int64 { return infoInt(b, rdb, "clients", "blocked_clients") }
	before := blocked() // the consumer's wake-up listener is one
	got := make(chan time.Time, 1)
	go func() {
		conn := rdb.Conn()
		defer conn.Close()
		_, _ = conn.XRead(ctx, &redis.XReadArgs{Streams: []string{stream, after}, Block: 0}).Result()
		got <- time.Now()
	}()
	// The reader is blocked once Redis counts one more blocked client.
	for blocked() <= before {
		time.Sleep(100 * time.Microsecond)
	}
	sent := time.Now()
	require.NoError(b, rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"k", "v"}}).Err())
	return (<-got).Sub(sent)
}

func usedMemory(b *testing.B, rdb *redis.Client) int64 {
	return infoInt(b, rdb, "memory", "used_memory")
}

func totalCommands(b *testing.B, rdb *redis.Client) int64 {
	return infoInt(b, rdb, "stats", "total_commands_processed")
}

func infoInt(b *testing.B, rdb *redis.Client, section, field string) int64 {
	b.Helper()
	s, err := rdb.Info(context.Background(), section).Result()
	require.NoError(b, err)
	for _, line := range strings.Split(s, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(b, err)
			return n
		}
	}
	b.Fatalf("INFO %s has no %s", section, field)
	return 0
}

// processCPU is the CPU time this process has used (user and system).
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkFairShare measures how many heartbeats it takes, after a second
// and then a third host join, until every host owns at most its fair share
// (the units over the hosts, plus one) and the hosts together own every
// unit, with one host holding all of them at first and messages arriving
// on random keys meanwhile. The bound is 5 heartbeats.
func BenchmarkFairShare(b *testing.B) {
	for _, keys := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			rdb, prefix := benchRedis(b)
			ctx := context.Background()
			preload(b, rdb, prefix, keys, keys)
			const heartbeat = 500 * time.Millisecond
			consumer := func(owner string) *redispartition.Consumer {
				opts := redispartition.DefaultConsumerOptions()
				opts.Leases, opts.Positions, opts.Decode, opts.Owner = redispartition.NewLeases(rdb, prefix), position.NewMemory(nil), redisstream.Decode, owner
				opts.Handler = &noop{done: make(chan struct{}), want: -1}
				opts.Subscriptions = func() []partition.Subscription {
					return []partition.Subscription{{Group: "proj", Categories: []string{"order"}}}
				}
				opts.Heartbeat = heartbeat
				c, err := redispartition.NewConsumer(opts)
				require.NoError(b, err)
				require.NoError(b, c.Start(ctx))
				b.Cleanup(func() { _ = c.Stop(ctx) })
				return c
			}
			hosts := []*redispartition.Consumer{consumer("a")}
			for len(hosts[0].Owned()) < keys {
				time.Sleep(5 * time.Millisecond)
			}
			stop := make(chan struct{})
			loaded := make(chan struct{})
			go func() { // load: a message on a random key every millisecond
				defer close(loaded)
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					case <-time.After(time.Millisecond):
					}
					key := "k" + strconv.Itoa(i*7919%keys)
					msg := delivery.Message{ID: "load-" + strconv.Itoa(i), Type: "Happened", Category: "order", EventStream: "order-" + key,
						Data: []byte(`{}`), GlobalPosition: int64(keys + i + 1), PartitionKey: key}
					_ = rdb.XAdd(ctx, &redis.XAddArgs{Stream: prefix + partition.StreamName("order", key), Values: redisstream.Encode(msg)}).Err()
				}
			}()
			fair := func() bool {
				share, total := keys/len(hosts)+1, 0
				for _, c := range hosts {
					n := len(c.Owned())
					if n > share {
						return false
					}
					total += n
				}
				return total == keys
			}
			b.ResetTimer()
			for _, name := range []string{"b", "c"} {
				begin := time.Now()
				hosts = append(hosts, consumer(name))
				for !fair() {
					time.Sleep(5 * time.Millisecond)
				}
				b.ReportMetric(float64(time.Since(begin))/float64(heartbeat), "join_"+name+"_heartbeats")
			}
			b.StopTimer()
			close(stop)
			<-loaded
			b.ReportMetric(0, "ns/op")
		})
	}
}

// failClaimAll is a positions store whose bulk claim fails, so that every
// worker claims its own row as it starts: the path before bulk claims.
type failClaimAll struct{ *position.Postgres }

func (failClaimAll) ClaimAll(context.Context, string, []string) ([]position.Row, error) {
	return nil, errors.New("claim all: off")
}

// BenchmarkStartOnPostgres measures a host's start with keys partitions
// waiting, one message each, with positions on PostgreSQL through a pool
// of 16 (the host's default): the time from Start to every message
// handled, and the time one query waits meanwhile for a connection of
// that pool (what a command waits behind the start). Beside it, in the
// same run, the same start with each unit's row claimed by its own
// worker, a round trip each (one_by_one, the path before bulk claims).
func BenchmarkStartOnPostgres(b *testing.B) {
	url := testserver.Postgres(b)
	for _, keys := range []int{2000, 10000} {
		for _, mode := range []string{"one_by_one", "bulk"} {
			b.Run(fmt.Sprintf("keys=%d/%s", keys, mode), func(b *testing.B) {
				ctx := context.Background()
				cfg, err := pgxpool.ParseConfig(url)
				require.NoError(b, err)
				cfg.MaxConns = 16
				pool, err := pgxpool.NewWithConfig(ctx, cfg)
				require.NoError(b, err)
				defer pool.Close()
				_, err = schema.Migrate(ctx, pool)
				require.NoError(b, err)
				var positions partition.Positions = position.NewPostgres(pool, nil)
				if mode == "one_by_one" {
					positions = failClaimAll{position.NewPostgres(pool, nil)}
				}
				group := fmt.Sprintf("start-%d-%s-%d", keys, mode, time.Now().UnixNano())
				var starts, probes []time.Duration
				for i := 0; i < b.N; i++ {
					rdb, prefix := benchRedis(b)
					preload(b, rdb, prefix, keys, keys)
					nh := &noop{done: make(chan struct{}), want: int64(keys)}
					opts := redispartition.DefaultConsumerOptions()
					opts.Leases, opts.Positions, opts.Handler, opts.Decode, opts.Owner = redispartition.NewLeases(rdb, prefix), positions, nh, redisstream.Decode, "start"
					g := fmt.Sprintf("%s-%d", group, i)
					opts.Subscriptions = func() []partition.Subscription {
						return []partition.Subscription{{Group: g, Categories: []string{"order"}}}
					}
					c, err := redispartition.NewConsumer(opts)
					require.NoError(b, err)
					done := make(chan struct{})
					var probed []time.Duration
					go func() { // a command's query, every 10 ms, while the start runs
						defer close(done)
						for {
							select {
							case <-nh.done:
								return
							case <-time.After(10 * time.Millisecond):
							}
							t0 := time.Now()
							var one int
							if err := pool.QueryRow(ctx, "SELECT 1").Scan(&one); err == nil {
								probed = append(probed, time.Since(t0))
							}
						}
					}()
					begin := time.Now()
					require.NoError(b, c.Start(ctx))
					<-nh.done
					starts = append(starts, time.Since(begin))
					<-done
					require.NoError(b, c.Stop(ctx))
					probes = append(probes, probed...)
				}
				slices.Sort(starts)
				slices.Sort(probes)
				b.ReportMetric(starts[len(starts)/2].Seconds(), "start_s")
				if len(probes) > 0 {
					b.ReportMetric(float64(probes[len(probes)/2].Microseconds())/1000, "query_p50_ms")
					b.ReportMetric(float64(probes[(len(probes)-1)*99/100].Microseconds())/1000, "query_p99_ms")
				}
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}
