package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/broker/brokertest"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/faultproxy"
	"github.com/proteanhq/protean-host/internal/redispartition"
	"github.com/proteanhq/protean-host/internal/redisstream"
	"github.com/proteanhq/protean-host/internal/relay"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/outbox"
	"github.com/proteanhq/protean-host/partition"
	"github.com/proteanhq/protean-host/position"
)

// TestRelaysKeepPerKeyOrderOnRedis runs three relays (three host
// instances) on one PostgreSQL outbox, publishing to the Redis broker,
// while writers commit rows for several keys. Every {category}:{key} stream
// must hold its key's rows exactly once each, in commit order. Small claims
// make each key's rows go out through every relay in turn.
func TestRelaysKeepPerKeyOrderOnRedis(t *testing.T) {
	t.Parallel()
	const (
		nKeys   = 6
		perKey  = 40
		nRelays = 3
	)
	ctx := context.Background()
	store := outbox.NewPostgres(testserver.PostgresPool(t), nil)
	url, prefix := testserver.Redis(t)
	ro, err := redis.ParseURL(url)
	require.NoError(t, err)
	rdb := redis.NewClient(ro)
	t.Cleanup(func() { _ = rdb.Close() })
	b, err := redisstream.New(rdb, redisstream.Options{Options: broker.DefaultOptions(), Prefix: prefix})
	require.NoError(t, err)

	var mu sync.Mutex
	relaysOf := make(map[string]map[int]bool) // key -> relays that published it
	for i := range nRelays {
		pub := publishFunc{Publisher: b, before: func(msgs []delivery.Message) {
			mu.Lock()
			defer mu.Unlock()
			for _, m := range msgs {
				if relaysOf[m.PartitionKey] == nil {
					relaysOf[m.PartitionKey] = make(map[int]bool)
				}
				relaysOf[m.PartitionKey][i] = true
			}
		}}
		r := relay.New(store, relay.Options{
			Broker: "default", Owner: fmt.Sprintf("relay-%d", i), Publisher: pub,
			BatchSize: 3, Tick: 2 * time.Millisecond,
		})
		require.NoError(t, r.Start(ctx))
		t.Cleanup(func() {
			sctx, cancel := context.WithTimeout(context.Background(), testwait.Limit())
			defer cancel()
			_ = r.Stop(sctx)
		})
	}

	// One writer per key commits its rows in order, some one per
	// transaction, some several to a transaction; the keys' writers run
	// at once, and with the relays.
	var wg sync.WaitGroup
	errs := make(chan error, nKeys)
	for k := range nKeys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("c-%d", k)
			for n := 0; n < perKey; {
				var rows []outbox.Row
				for size := 1 + n%3; size > 0 && n < perKey; size-- {
					rows = append(rows, outbox.Row{
						MessageID: fmt.Sprintf("00000000-0000-4000-8000-%06d%06d", k, n),
						Stream:    "order-" + key, Type: "OrderPlaced", TargetBroker: "default",
						Data:         json.RawMessage(fmt.Sprintf(`{"n":%d}`, n)),
						Metadata:     json.RawMessage(fmt.Sprintf(`{"position":%d,"global_position":%d}`, n, k*1000+n)),
						PartitionKey: &key,
					})
					n++
				}
				if err := store.Add(ctx, rows); err != nil {
					errs <- fmt.Errorf("key %s: %w", key, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	stream := func(k int) string { return prefix + fmt.Sprintf("order:c-%d", k) }
	testwait.For(t, "every row in Redis", func() (bool, string) {
		seen := ""
		ok := true
		for k := range nKeys {
			n := rdb.XLen(ctx, stream(k)).Val()
			seen += fmt.Sprintf("c-%d:%d ", k, n)
			ok = ok && n >= perKey
		}
		return ok, seen
	})
	for k := range nKeys {
		entries, err := rdb.XRange(ctx, stream(k), "-", "+").Result()
		require.NoError(t, err)
		var got []int
		for _, e := range entries {
			m, err := redisstream.Decode(e.ID, e.Values)
			require.NoError(t, err)
			var d struct{ N int }
			require.NoError(t, json.Unmarshal(m.Data, &d))
			require.Equal(t, "order", m.Category)
			got = append(got, d.N)
		}
		want := make([]int, perKey)
		for i := range want {
			want[i] = i
		}
		require.Equal(t, want, got, "key c-%d: stream order must be commit order, each row once", k)
	}
	mu.Lock()
	shared := 0
	for _, rs := range relaysOf {
		if len(rs) > 1 {
			shared++
		}
	}
	mu.Unlock()
	// Without this the test would not be about several relays. With 40
	// rows a key in claims of 3, a key served by one relay only is
	// already unlikely; all six so is not a case worth a retry.
	t.Logf("%d of %d keys published by more than one relay", shared, nKeys)
	require.Positive(t, shared, "no key was published by more than one relay: %v", relaysOf)
	keys, err := rdb.SMembers(ctx, prefix+"order:__partitions__").Result()
	require.NoError(t, err)
	require.Len(t, keys, nKeys)
}

// publishFunc is a Publisher that reports each call before passing it on.
type publishFunc struct {
	broker.Publisher
	before func([]delivery.Message)
}

func (p publishFunc) Publish(ctx context.Context, msgs ...delivery.Message) error {
	p.before(msgs)
	return p.Publisher.Publish(ctx, msgs...)
}

// A Redis that comes back empty (restarted without persistence) loses
// nothing accepted: its publishes fail until the relay has made every row
// published within the retention pending again, in commit order ahead of
// the rows committed since, and set a new epoch marker; then the key's
// stream holds every row, in commit order (partition workers ack the rows
// they applied before by their positions). On its first start the relay
// only marks the broker: nothing is published twice. (Before, what Redis
// held and no consumer had read was gone for good.)
func TestRepublishesWhenRedisLostItsData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := outbox.NewPostgres(testserver.PostgresPool(t), nil)
	k := newKeyA(t, store, relay.Options{PublishedRetention: time.Hour})
	add, stream, drain, b, rdb, prefix := k.add, k.stream, k.drain, k.b, k.rdb, k.prefix
	add(1, 3)
	drain()
	require.Equal(t, []string{"order-1", "order-2", "order-3"}, stream(), "the first start marks the broker and publishes once")
	epoch, restarted, err := b.Epoch(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, epoch)
	require.False(t, restarted)

	// Redis loses everything; a row is committed meanwhile.
	keys, err := rdb.Keys(ctx, prefix+"*").Result()
	require.NoError(t, err)
	require.NoError(t, rdb.Del(ctx, keys...).Err())
	add(4, 4)
	drain()
	require.Equal(t, []string{"order-1", "order-2", "order-3", "order-4"}, stream(), "republished in commit order, then the new row")
	again, _, err := b.Epoch(ctx)
	require.NoError(t, err)
	require.NotEqual(t, epoch, again, "a new epoch")

	// Without the marker check, the new row would have gone out alone.
	plain, err := redisstream.New(rdb, redisstream.Options{Options: broker.DefaultOptions(), Prefix: prefix})
	require.NoError(t, err)
	require.NoError(t, rdb.Del(ctx, prefix+redisstream.EpochKey).Err())
	require.ErrorIs(t, b.Publish(ctx, delivery.Message{ID: "x", Stream: "order"}), broker.ErrEpochLost)
	require.NoError(t, plain.Publish(ctx, delivery.Message{ID: "x", Stream: "order"}), "the check is the option's")

	// A relay that read the epoch before another relay marked the broker
	// anew publishes nothing under its old epoch (spin's variant g: its
	// run would go out ahead of the rows made pending again).
	require.NoError(t, b.SetEpoch(ctx, "new"))
	require.ErrorIs(t, b.PublishIn(ctx, again, delivery.Message{ID: "y", Stream: "order"}), broker.ErrEpochLost)
	require.NoError(t, b.PublishIn(ctx, "new", delivery.Message{ID: "y", Stream: "order"}))
}

// Each message on a partition stream carries the global position of the
// message before it on that stream (prev), within a claim and across
// claims (from the published rows), so a partition worker can tell a
// message its stream lost.
func TestChainsEachPartitionStream(t *testing.T) {
	t.Parallel()
	k := newKeyA(t, outbox.NewPostgres(testserver.PostgresPool(t), nil), relay.Options{})
	k.add(1, 3)
	k.drain()
	k.add(4, 5)
	k.drain()
	xs, err := k.rdb.XRange(context.Background(), k.prefix+"order:A", "-", "+").Result()
	require.NoError(t, err)
	var chain [][2]int64
	for _, x := range xs {
		m, err := redisstream.Decode(x.ID, x.Values)
		require.NoError(t, err)
		chain = append(chain, [2]int64{m.GlobalPosition, m.Prev})
	}
	require.Equal(t, [][2]int64{{1, 0}, {2, 1}, {3, 2}, {4, 3}, {5, 4}}, chain)
}

// After Redis lost its data, the rows every partition consumer group has
// applied (its position of the row's unit on the row's stream is at or
// past the row) are not sent again: only what some group still needs is,
// so an empty Redis costs the rows not yet applied, not the whole
// retention. (Before, all three rows went again.)
func TestRepublishesOnlyWhatAConsumerHasNotApplied(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testserver.PostgresPool(t)
	store := outbox.NewPostgres(pool, nil)
	subs := []partition.Subscription{{Group: "g1", Categories: []string{"order"}}, {Group: "g2", Categories: []string{"order"}}}
	k := newKeyA(t, store, relay.Options{PublishedRetention: time.Hour,
		Partitions: func() []partition.Subscription { return subs }})
	k.add(1, 3)
	k.drain()
	require.Equal(t, []string{"order-1", "order-2", "order-3"}, k.stream())
	positions := position.NewPostgres(pool, nil)
	require.NoError(t, positions.Set(ctx, "g1", "order:A", "order:A", 3))
	require.NoError(t, positions.Set(ctx, "g2", "order:A", "order:A", 1), "g2 is behind: rows 2 and 3 are not applied")

	keys, err := k.rdb.Keys(ctx, k.prefix+"*").Result()
	require.NoError(t, err)
	require.NoError(t, k.rdb.Del(ctx, keys...).Err())
	k.add(4, 4)
	k.drain()
	require.Equal(t, []string{"order-2", "order-3", "order-4"}, k.stream(), "row 1, which both groups applied, is kept")
}

// A Redis that restarted keeping its epoch marker (AOF loaded) but lost
// what it acknowledged last (appendfsync everysec and a crash, or a
// replica promoted behind its primary) loses nothing accepted: the
// marker's run_id is not the server's any more, so publishes fail with
// ErrRestarted until the relay has made the rows published within
// RestartWindow before the last publish pending again and marked the
// broker anew; the rows Redis still holds are dropped as duplicates, the
// lost ones go out again, in commit order, ahead of newer rows. (Before,
// the marker matched, the relay published on, and the lost tail was gone
// for good, its key's later rows moving the consumers past it.)
func TestRepublishesTheLastWritesAfterARestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	k, clock := newRestartRig(t)
	add, stream, drain, b, rdb, prefix, store := k.add, k.stream, k.drain, k.b, k.rdb, k.prefix, k.store
	add(1, 3)
	drain()
	clock.Advance(time.Hour) // rows 1-3 are an hour old: outside the window
	add(4, 6)
	drain()
	require.Equal(t, []string{"order-1", "order-2", "order-3", "order-4", "order-5", "order-6"}, stream())

	// The restart: Redis loses its last two writes (rows 5 and 6, entries
	// and ids) and comes back under another run_id, with the marker.
	xs, err := rdb.XRange(ctx, prefix+"order:A", "-", "+").Result()
	require.NoError(t, err)
	for _, x := range xs[4:] {
		m, err := redisstream.Decode(x.ID, x.Values)
		require.NoError(t, err)
		require.NoError(t, rdb.XDel(ctx, prefix+"order:A", x.ID).Err())
		require.NoError(t, rdb.HDel(ctx, prefix+redispartition.IDIndexKey("order:A"), m.ID).Err())
	}
	epoch := k.restarted()
	_, restarted, err := b.Epoch(ctx)
	require.NoError(t, err)
	require.True(t, restarted)
	require.ErrorIs(t, b.PublishIn(ctx, epoch, delivery.Message{ID: "y", Stream: "order"}), broker.ErrRestarted)

	add(7, 7)
	drain()
	require.Equal(t, []string{"order-1", "order-2", "order-3", "order-4", "order-5", "order-6", "order-7"}, stream(),
		"the lost rows again, in commit order, then the new one; rows Redis kept are not doubled")
	again, restarted, err := b.Epoch(ctx)
	require.NoError(t, err)
	require.False(t, restarted)
	require.NotEqual(t, epoch, again, "marked anew")
	for id := int64(1); id <= 7; id++ {
		got, err := store.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, outbox.StatusPublished, got.Status, "row %d", id)
	}
}

// keyA is a relay over store publishing to a real Redis with the epoch
// check, and helpers for key A's rows: add commits rows from..to, stream
// lists the EventStreams in A's partition stream, drain runs passes until
// one claims nothing.
type keyA struct {
	t      *testing.T
	store  *outbox.Postgres
	rdb    *redis.Client
	prefix string
	b      *redisstream.Broker
	r      *relay.Relay
}

func newKeyA(t *testing.T, store *outbox.Postgres, opts relay.Options) *keyA {
	url, prefix := testserver.Redis(t)
	ro, err := redis.ParseURL(url)
	require.NoError(t, err)
	rdb := redis.NewClient(ro)
	t.Cleanup(func() { _ = rdb.Close() })
	b, err := redisstream.New(rdb, redisstream.Options{Options: broker.DefaultOptions(), Prefix: prefix, Epoch: true})
	require.NoError(t, err)
	opts.Broker, opts.Owner, opts.Publisher = "default", "r1", b
	return &keyA{t: t, store: store, rdb: rdb, prefix: prefix, b: b, r: relay.New(store, opts)}
}

// newRestartRig is a keyA whose store and relay read clock, which moves
// only when the test advances it, with a restart window of a minute
// inside a day's retention.
func newRestartRig(t *testing.T) (*keyA, *brokertest.Clock) {
	clock := brokertest.NewClock(time.Now().UTC())
	store := outbox.NewPostgres(testserver.PostgresPool(t), clock.Now)
	return newKeyA(t, store, relay.Options{Clock: at(clock.Now), PublishedRetention: 24 * time.Hour, RestartWindow: time.Minute}), clock
}

// restarted makes Redis look restarted with its marker kept: the marker's
// run_id is rewritten (the server's cannot be). It returns the marker's
// epoch.
func (k *keyA) restarted() string {
	k.t.Helper()
	ctx := context.Background()
	mark, err := k.rdb.Get(ctx, k.prefix+redisstream.EpochKey).Result()
	require.NoError(k.t, err)
	epoch, _, _ := strings.Cut(mark, "@")
	require.NoError(k.t, k.rdb.Set(ctx, k.prefix+redisstream.EpochKey, epoch+"@0123456789abcdef", 0).Err())
	return epoch
}

func (k *keyA) add(from, to int) {
	k.t.Helper()
	var rows []outbox.Row
	for i := from; i <= to; i++ {
		r := row(fmt.Sprintf("00000000-0000-4000-8000-%012d", i), fmt.Sprintf("order-%d", i), key("A"), 0)
		r.Metadata = json.RawMessage(fmt.Sprintf(`{"position": 0, "global_position": %d, "time": "2026-11-30T00:00:00Z"}`, i))
		rows = append(rows, r)
	}
	require.NoError(k.t, k.store.Add(context.Background(), rows))
}

func (k *keyA) stream() []string {
	k.t.Helper()
	xs, err := k.rdb.XRange(context.Background(), k.prefix+"order:A", "-", "+").Result()
	require.NoError(k.t, err)
	var out []string
	for _, x := range xs {
		m, err := redisstream.Decode(x.ID, x.Values)
		require.NoError(k.t, err)
		out = append(out, m.EventStream)
	}
	return out
}

func (k *keyA) drain() {
	k.t.Helper()
	for range 10 {
		n, err := k.r.RunOnce(context.Background())
		require.NoError(k.t, err)
		if n == 0 {
			return
		}
	}
	k.t.Fatal("the relay did not drain")
}

// A relay whose cached epoch is stale (another relay marked the broker
// since) and that meets a restarted broker republishes the restart's
// window only, not the whole retention: its NOEPOCH is not a loss. (A full
// make chaos run republished 22,847 rows after a Redis kill this way.)
func TestWithAStaleEpochRepublishesOnlyTheRestartWindow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	k, clock := newRestartRig(t)
	store := k.store
	k.add(1, 3)
	k.drain()
	old, err := store.Get(ctx, 1)
	require.NoError(t, err)
	clock.Advance(time.Hour)
	k.add(4, 4)
	k.drain()

	require.NoError(t, k.b.SetEpoch(ctx, "other")) // another relay marked it anew
	k.restarted()                                  // then it restarted
	k.add(5, 5)
	k.drain()
	require.Equal(t, []string{"order-1", "order-2", "order-3", "order-4", "order-5"}, k.stream())
	got, err := store.Get(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, old.PublishedAt, got.PublishedAt, "a row outside the restart's window is not sent again")
	again, err := store.Get(ctx, 4)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPublished, again.Status)
}

// A relay whose broker went down claims nothing until the broker answers
// again: each later pass reads the broker's epoch first, and only that
// read fails. (Before, every pass claimed its batch, tried it and gave it
// back: with Redis down a minute each claim walked the outage's growing
// backlog, 40 ms for 7,000 rows, at every commit's wake-up.) Once Redis is
// reachable again the first pass publishes every row in commit order.
func TestClaimsNothingWhileTheBrokerIsDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := outbox.NewPostgres(testserver.PostgresPool(t), nil)
	url, prefix := testserver.Redis(t)
	ro, err := redis.ParseURL(url)
	require.NoError(t, err)
	proxy, err := faultproxy.New(ro.Addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	ro.Addr, ro.MaxRetries = proxy.Addr(), -1
	rdb := redis.NewClient(ro)
	t.Cleanup(func() { _ = rdb.Close() })
	b, err := redisstream.New(rdb, redisstream.Options{Options: broker.DefaultOptions(), Prefix: prefix, Epoch: true})
	require.NoError(t, err)
	k := &keyA{t: t, store: store, rdb: rdb, prefix: prefix, b: b,
		r: relay.New(store, relay.Options{Broker: "default", Owner: "r1", Publisher: b})}
	k.add(1, 2)
	k.drain()

	proxy.Cut()
	k.add(3, 5)
	n, err := k.r.RunOnce(ctx)
	require.True(t, delivery.IsInfrastructure(err), "%v", err)
	require.Equal(t, 3, n, "the pass that meets the outage claimed its rows, and gave them back")
	for pass := range 5 {
		n, err := k.r.RunOnce(ctx)
		require.True(t, delivery.IsInfrastructure(err), "pass %d: %v", pass, err)
		require.Zero(t, n, "pass %d: nothing is claimed while the broker is down", pass)
	}
	for id := int64(3); id <= 5; id++ {
		got, err := store.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, outbox.StatusPending, got.Status, "row %d", id)
		require.Zero(t, got.RetryCount, "row %d", id)
		require.Empty(t, got.LockedBy, "row %d: no claim holds it", id)
	}

	proxy.Resume()
	k.drain()
	require.Equal(t, []string{"order-1", "order-2", "order-3", "order-4", "order-5"}, k.stream())
}
