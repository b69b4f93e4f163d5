package partition_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/partition"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// newLeases returns the protocol on a test's own key prefix, and a client
// for arranging state by hand.
func newLeases(t *testing.T) (*partition.Leases, *redis.Client, string) {
	t.Helper()
	url, prefix := testserver.Redis(t)
	opt, err := redis.ParseURL(url)
	require.NoError(t, err)
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	return partition.NewLeases(rdb, prefix), rdb, prefix
}

func xadd(t *testing.T, rdb *redis.Client, stream string, n int) []string {
	t.Helper()
	var ids []string
	for i := 0; i < n; i++ {
		id, err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: []any{"seq", strconv.Itoa(i)}}).Result()
		require.NoError(t, err)
		ids = append(ids, id)
	}
	return ids
}

func TestLeaseAcquireRenewRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ls, _, _ := newLeases(t)
	const ttl = time.Minute

	a, err := ls.Acquire(ctx, "g", "order:c-1", "host-a", ttl)
	require.NoError(t, err)
	require.Equal(t, int64(1), a.Generation)
	require.Equal(t, "host-a:1", a.Token())

	_, err = ls.Acquire(ctx, "g", "order:c-1", "host-b", ttl)
	require.ErrorIs(t, err, partition.ErrLeaseHeld)

	// Another group owns the same partition independently.
	other, err := ls.Acquire(ctx, "g2", "order:c-1", "host-b", ttl)
	require.NoError(t, err)
	require.Equal(t, int64(1), other.Generation)

	require.NoError(t, ls.Renew(ctx, a, ttl))
	require.NoError(t, ls.Release(ctx, a))
	require.ErrorIs(t, ls.Renew(ctx, a, ttl), partition.ErrLeaseLost, "a released lease cannot be renewed")
	require.ErrorIs(t, ls.Release(ctx, a), partition.ErrLeaseLost)

	b, err := ls.Acquire(ctx, "g", "order:c-1", "host-b", ttl)
	require.NoError(t, err)
	require.Equal(t, int64(2), b.Generation, "every acquire gets the next generation")
}

// The bulk calls span several scripts (more units than one chunk) and give
// each unit its own outcome: acquired, held by another owner, halted; and
// renewing reports exactly the leases that were lost.
func TestLeasesInBulk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ls, _, _ := newLeases(t)
	const n, ttl = 1234, time.Minute
	units := make([]partition.Unit, n)
	for i := range units {
		units[i] = partition.Unit{Group: "g", Unit: "order:k" + strconv.Itoa(i)}
	}
	// Every 7th held by host-b, every 11th (not 7th) halted.
	for i := 0; i < n; i += 7 {
		_, err := ls.Acquire(ctx, "g", units[i].Unit, "host-b", ttl)
		require.NoError(t, err)
	}
	for i := 0; i < n; i += 11 {
		if i%7 == 0 {
			continue
		}
		l, err := ls.Acquire(ctx, "g", units[i].Unit, "host-c", ttl)
		require.NoError(t, err)
		require.NoError(t, ls.Halt(ctx, l, partition.Halt{Stream: "s", Entry: "1-0", Reason: "x"}))
	}
	got, err := ls.AcquireAll(ctx, units, "host-a", ttl)
	require.NoError(t, err)
	require.Len(t, got, n)
	var mine []partition.Lease
	for i, a := range got {
		switch {
		case i%7 == 0:
			require.ErrorIs(t, a.Err, partition.ErrLeaseHeld, "unit %d", i)
		case i%11 == 0:
			require.ErrorIs(t, a.Err, partition.ErrHalted, "unit %d", i)
		default:
			require.NoError(t, a.Err, "unit %d", i)
			require.Equal(t, units[i].Unit, a.Lease.Unit)
			require.Equal(t, "host-a", a.Lease.Owner)
			require.Equal(t, int64(1), a.Lease.Generation, "unit %d", i)
			mine = append(mine, a.Lease)
		}
	}
	// Release a few, and let host-b take one of them: all are lost.
	wantLost := []int{0, 3, len(mine) - 1}
	for _, i := range wantLost {
		require.NoError(t, ls.Release(ctx, mine[i]))
	}
	_, err = ls.Acquire(ctx, "g", mine[3].Unit, "host-b", ttl)
	require.NoError(t, err)
	lost, err := ls.RenewAll(ctx, mine, ttl)
	require.NoError(t, err)
	require.Equal(t, wantLost, lost)
	require.ErrorIs(t, ls.Renew(ctx, mine[3], ttl), partition.ErrLeaseLost)
	require.NoError(t, ls.Renew(ctx, mine[1], ttl))
}

// One Ack of more ids than the script's inner chunk acks every one and
// forgets every one's attempts.
func TestAckInBulk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ls, rdb, prefix := newLeases(t)
	const stream = "order:big"
	ids := xadd(t, rdb, prefix+stream, 2345)
	l, err := ls.Acquire(ctx, "g", stream, "host-a", time.Minute)
	require.NoError(t, err)
	got, err := ls.Read(ctx, l, stream, false, len(ids))
	require.NoError(t, err)
	require.Len(t, got, len(ids))
	for _, id := range []string{ids[0], ids[1500], ids[len(ids)-1]} {
		_, err := ls.Attempt(ctx, l, stream, id)
		require.NoError(t, err)
	}
	n, err := ls.Ack(ctx, l, stream, ids...)
	require.NoError(t, err)
	require.Equal(t, len(ids), n)
	pending, err := rdb.XPending(ctx, prefix+stream, "g").Result()
	require.NoError(t, err)
	require.Zero(t, pending.Count)
	left, err := rdb.HLen(ctx, prefix+partition.AttemptsKey("g", stream)).Result()
	require.NoError(t, err)
	require.Zero(t, left)
}

func TestLeaseExpiryHandsOverAtTheNextGeneration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ls, rdb, prefix := newLeases(t)
	a, err := ls.Acquire(ctx, "g", "u", "host-a", time.Minute)
	require.NoError(t, err)
	// Expire it by hand rather than waiting for a TTL.
	require.NoError(t, rdb.Del(ctx, prefix+partition.LeaseKey("g", "u")).Err())
	b, err := ls.Acquire(ctx, "g", "u", "host-b", time.Minute)
	require.NoError(t, err)
	require.Equal(t, a.Generation+1, b.Generation)
	require.ErrorIs(t, ls.Renew(ctx, a, time.Minute), partition.ErrLeaseLost)
	require.NoError(t, ls.Renew(ctx, b, time.Minute))
}

func TestFencedReadAckReclaimRefuseAStaleOwner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ls, rdb, prefix := newLeases(t)
	stream := "order:c-1"
	ids := xadd(t, rdb, prefix+stream, 3)

	a, err := ls.Acquire(ctx, "g", stream, "host-a", time.Minute)
	require.NoError(t, err)
	got, err := ls.Read(ctx, a, stream, false, 2)
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.Equal(t, ids[0], got[0].ID)
	require.Equal(t, "0", got[0].Values["seq"])

	// a stalls; its lease expires and b takes over.
	require.NoError(t, rdb.Del(ctx, prefix+partition.LeaseKey("g", stream)).Err())
	b, err := ls.Acquire(ctx, "g", stream, "host-b", time.Minute)
	require.NoError(t, err)

	_, err = ls.Read(ctx, a, stream, false, 10)
	require.ErrorIs(t, err, partition.ErrLeaseLost)
	_, err = ls.Ack(ctx, a, stream, ids[0])
	require.ErrorIs(t, err, partition.ErrLeaseLost)
	_, err = ls.Reclaim(ctx, a, stream)
	require.ErrorIs(t, err, partition.ErrLeaseLost, "a stale owner must not steal its successor's pending entries")

	moved, err := ls.Reclaim(ctx, b, stream)
	require.NoError(t, err)
	require.Equal(t, 2, moved)
	pend, err := ls.Read(ctx, b, stream, true, 10)
	require.NoError(t, err)
	require.Equal(t, []string{ids[0], ids[1]}, entryIDs(pend), "pending first, in order")
	fresh, err := ls.Read(ctx, b, stream, false, 10)
	require.NoError(t, err)
	require.Equal(t, []string{ids[2]}, entryIDs(fresh))
	n, err := ls.Ack(ctx, b, stream, ids...)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	pend, err = ls.Read(ctx, b, stream, true, 10)
	require.NoError(t, err)
	require.Empty(t, pend)
}

func entryIDs(es []partition.Entry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.ID)
	}
	return out
}

func TestHaltIsDurableAndBlocksAcquire(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ls, rdb, prefix := newLeases(t)
	a, err := ls.Acquire(ctx, "g", "u", "host-a", time.Minute)
	require.NoError(t, err)
	n, err := ls.Attempt(ctx, a, "s", "1-0")
	require.NoError(t, err)
	require.Equal(t, 1, n)

	// The attempt count survives a change of owner.
	require.NoError(t, ls.Release(ctx, a))
	b, err := ls.Acquire(ctx, "g", "u", "host-b", time.Minute)
	require.NoError(t, err)
	n, err = ls.Attempt(ctx, b, "s", "1-0")
	require.NoError(t, err)
	require.Equal(t, 2, n)

	require.ErrorIs(t, ls.Halt(ctx, a, partition.Halt{Stream: "s", Entry: "1-0"}), partition.ErrLeaseLost)
	require.NoError(t, ls.Halt(ctx, b, partition.Halt{Stream: "s", Entry: "1-0", Reason: "boom", Attempts: 2, HaltedAt: time.Now()}))
	_, err = ls.Acquire(ctx, "g", "u", "host-c", time.Minute)
	require.ErrorIs(t, err, partition.ErrHalted)
	h, err := rdb.HGetAll(ctx, prefix+partition.HaltKey("g", "u")).Result()
	require.NoError(t, err)
	require.Equal(t, "boom", h["reason"])
	require.Equal(t, "1-0", h["entry"])
}

func TestReapOnlyAnIdleCaughtUpPartition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ls, rdb, prefix := newLeases(t)
	stream := partition.StreamName("order", "c-1")
	require.NoError(t, rdb.SAdd(ctx, prefix+partition.IndexKey("order"), "c-1").Err())
	ids := xadd(t, rdb, prefix+stream, 2)
	l, err := ls.Acquire(ctx, "g", stream, "host-a", time.Minute)
	require.NoError(t, err)

	// No group has read it: not reapable.
	ok, err := ls.Reap(ctx, l, "order", "c-1", []string{stream}, 0)
	require.NoError(t, err)
	require.False(t, ok)

	got, err := ls.Read(ctx, l, stream, false, 10)
	require.NoError(t, err)
	require.Len(t, got, 2)
	// Read but pending: not reapable.
	ok, err = ls.Reap(ctx, l, "order", "c-1", []string{stream}, 0)
	require.NoError(t, err)
	require.False(t, ok)

	_, err = ls.Ack(ctx, l, stream, ids...)
	require.NoError(t, err)
	// Caught up but not idle long enough.
	ok, err = ls.Reap(ctx, l, "order", "c-1", []string{stream}, time.Hour)
	require.NoError(t, err)
	require.False(t, ok)

	ok, err = ls.Reap(ctx, l, "order", "c-1", []string{stream}, 0)
	require.NoError(t, err)
	require.True(t, ok)
	members, err := ls.Members(ctx, "order")
	require.NoError(t, err)
	require.Empty(t, members)
	n, err := rdb.Exists(ctx, prefix+stream, prefix+partition.GenerationKey("g", stream)).Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "the stream is gone, the generation counter stays")
}

// TestDropStaleKeepsOneConsumerPerGroup: every lease generation is a new
// consumer (its token); the next owner, once it has reclaimed its
// predecessor's pending entries, deletes the predecessor's consumer, so
// however many handovers there were, the group has one consumer. Before
// the reclaim, the predecessor still holds entries and is kept; a stale
// owner deletes nothing.
func TestDropStaleKeepsOneConsumerPerGroup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ls, rdb, prefix := newLeases(t)
	stream := "order:c-1"
	ids := xadd(t, rdb, prefix+stream, 12)
	consumers := func() map[string]int64 {
		cs, err := rdb.XInfoConsumers(ctx, prefix+stream, "g").Result()
		require.NoError(t, err)
		out := map[string]int64{}
		for _, c := range cs {
			out[c.Name] = c.Pending
		}
		return out
	}

	prev, err := ls.Acquire(ctx, "g", stream, "host-0", time.Minute)
	require.NoError(t, err)
	got, err := ls.Read(ctx, prev, stream, false, 1)
	require.NoError(t, err)
	require.Len(t, got, 1)
	for i := 1; i < len(ids); i++ {
		// prev crashes holding one entry; its lease lapses.
		require.NoError(t, rdb.Del(ctx, prefix+partition.LeaseKey("g", stream)).Err())
		l, err := ls.Acquire(ctx, "g", stream, "host-"+strconv.Itoa(i), time.Minute)
		require.NoError(t, err)

		dropped, err := ls.DropStale(ctx, l, stream)
		require.NoError(t, err)
		require.Empty(t, dropped, "generation %d: the predecessor still holds its entry", i)
		require.Equal(t, map[string]int64{prev.Token(): 1}, consumers())

		moved, err := ls.Reclaim(ctx, l, stream)
		require.NoError(t, err)
		require.Equal(t, 1, moved)
		_, err = ls.DropStale(ctx, prev, stream)
		require.ErrorIs(t, err, partition.ErrLeaseLost, "a stale owner deletes nothing")
		dropped, err = ls.DropStale(ctx, l, stream)
		require.NoError(t, err)
		require.Equal(t, []string{prev.Token()}, dropped)
		require.Equal(t, map[string]int64{l.Token(): 1}, consumers(), "generation %d", i)

		// The reclaimed entry is handled; the next one is taken and held.
		pend, err := ls.Read(ctx, l, stream, true, 10)
		require.NoError(t, err)
		require.Equal(t, []string{ids[i-1]}, entryIDs(pend))
		n, err := ls.Ack(ctx, l, stream, ids[i-1])
		require.NoError(t, err)
		require.Equal(t, 1, n)
		got, err := ls.Read(ctx, l, stream, false, 1)
		require.NoError(t, err)
		require.Equal(t, []string{ids[i]}, entryIDs(got))
		prev = l
	}
	require.Len(t, consumers(), 1)

	// Nothing to drop on a stream without a group or without entries.
	dropped, err := ls.DropStale(ctx, prev, "order:c-2")
	require.NoError(t, err)
	require.Empty(t, dropped)
}
