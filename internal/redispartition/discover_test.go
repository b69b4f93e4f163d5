package redispartition

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/partition"
	"github.com/proteanhq/protean-host/position"
)

// indexReads counts the keys the index reads answered (SSCAN pages) and
// the whole reads (SMEMBERS).
type indexReads struct {
	mu      sync.Mutex
	scanned int
	whole   int
}

func (h *indexReads) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *indexReads) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *indexReads) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.mu.Lock()
		defer h.mu.Unlock()
		switch c := cmd.(type) {
		case *redis.ScanCmd:
			keys, _ := c.Val()
			h.scanned += len(keys)
		case *redis.StringSliceCmd:
			if c.Name() == "smembers" {
				h.whole++
			}
		}
		return err
	}
}

func (h *indexReads) take() (scanned, whole int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	scanned, whole = h.scanned, h.whole
	h.scanned, h.whole = 0, 0
	return scanned, whole
}

type ackAll struct{}

func (ackAll) Handle(_ context.Context, b delivery.Batch) (int, error) { return len(b.Messages), nil }

// discoveryRig is a consumer whose discovery passes the test runs one at
// a time (no heartbeat loop, no listener: nothing is announced), over
// keys partitions put straight into the index of "order".
func discoveryRig(t *testing.T, keys int) (*Consumer, *redis.Client, string, *indexReads) {
	url, prefix := testserver.Redis(t)
	opt, err := redis.ParseURL(url)
	require.NoError(t, err)
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	reads := &indexReads{}
	rdb.AddHook(reads)
	opts := DefaultConsumerOptions()
	opts.Leases, opts.Positions, opts.Handler, opts.Owner = NewLeases(rdb, prefix), position.NewMemory(nil), ackAll{}, "host"
	opts.Decode = func(id string, _ map[string]any) (delivery.Message, error) { return delivery.Message{ID: id}, nil }
	opts.Subscriptions = func() []partition.Subscription {
		return []partition.Subscription{{Group: "proj", Categories: []string{"order"}}}
	}
	opts.WarnLivePartitions = 0
	c, err := NewConsumer(opts)
	require.NoError(t, err)
	soft, cancel := context.WithCancel(context.Background())
	c.soft, c.work, c.ctl = soft, context.Background(), c.opts.Leases
	t.Cleanup(func() {
		cancel()
		c.shutdownWorkers()
		c.wg.Wait()
	})
	for from := 0; from < keys; from += 1000 {
		pipe := rdb.Pipeline()
		for i := from; i < min(from+1000, keys); i++ {
			unannounced(context.Background(), pipe, prefix, "k"+strconv.Itoa(i))
		}
		_, err := pipe.Exec(context.Background())
		require.NoError(t, err)
	}
	return c, rdb, prefix, reads
}

// unannounced adds a key to the index with one message on its stream, as
// a publish does, but names it on no wake-up stream.
func unannounced(ctx context.Context, p redis.Cmdable, prefix, key string) {
	p.XAdd(ctx, &redis.XAddArgs{Stream: prefix + partition.StreamName("order", key), Values: []any{"k", "v"}})
	p.SAdd(ctx, prefix+IndexKey("order"), key)
}

func (c *Consumer) owns(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.owned[unitID{"proj", partition.PartitionUnit("order", key)}] != nil
}

// A steady discovery pass reads a page of the index, not the whole of it,
// and a unit no wake-up announced is still found within the walk's bound:
// the keys over the page (sweepPage), passes. Reading the index whole
// every pass (SMEMBERS) fails the first half; finding new units only on
// wake-ups fails the second.
func TestDiscoveryWalksTheIndexAPageAPassAndFindsUnannouncedUnits(t *testing.T) {
	const keys = 5 * sweepPage
	c, rdb, prefix, reads := discoveryRig(t, keys)
	require.NoError(t, c.pass()) // the first pass walks the index whole
	require.Equal(t, keys, len(c.Owned()))
	scanned, whole := reads.take()
	require.GreaterOrEqual(t, scanned, keys)
	require.Zero(t, whole)

	unannounced(context.Background(), rdb, prefix, "late")
	bound := (keys + 1 + sweepPage - 1) / sweepPage
	for pass := 1; !c.owns("late"); pass++ {
		require.LessOrEqual(t, pass, bound, "an unannounced unit is found within %d passes", bound)
		require.NoError(t, c.pass())
		scanned, whole := reads.take()
		require.Zero(t, whole, "a steady pass reads no index whole")
		require.Less(t, scanned, keys/2, "a steady pass reads a page of the index")
	}
	require.Equal(t, keys+1, len(c.Owned()))
}

// A host that leaves the hosts set makes the next pass walk the indexes
// whole: the units it held are taken over at once, not a page a pass.
func TestAHostLeavingMakesTheNextPassWalkTheIndexWhole(t *testing.T) {
	const keys = 3 * sweepPage
	c, rdb, prefix, reads := discoveryRig(t, keys)
	ls := NewLeases(rdb, prefix)
	ctx := context.Background()
	_, err := ls.Heartbeat(ctx, "other", time.Minute, []string{"proj"}, nil)
	require.NoError(t, err)
	var want []Want
	for i := 0; i < keys; i++ {
		want = append(want, Want{Unit: Unit{"proj", partition.PartitionUnit("order", "k"+strconv.Itoa(i))}})
	}
	got, err := ls.AcquireAll(ctx, want, "other", -1)
	require.NoError(t, err)
	for _, a := range got {
		require.NoError(t, a.Err)
	}
	require.NoError(t, c.pass()) // every unit held by a live host
	require.Empty(t, c.Owned())
	require.NoError(t, c.pass())
	reads.take()

	require.NoError(t, ls.Leave(ctx, "other", []string{"proj"})) // gone, its leases kept: lapsed
	require.NoError(t, c.pass())
	require.Equal(t, keys, len(c.Owned()), "every unit of the host that left, taken over in one pass")
	scanned, _ := reads.take()
	require.GreaterOrEqual(t, scanned, keys)
}
