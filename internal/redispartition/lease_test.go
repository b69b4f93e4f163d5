package redispartition_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/redispartition"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/partition"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// newLeases returns the protocol on a test's own key prefix, and a client
// for arranging state by hand.
func newLeases(t *testing.T) (*redispartition.Leases, *redis.Client, string) {
	t.Helper()
	url, prefix := testserver.Redis(t)
	opt, err := redis.ParseURL(url)
	require.NoError(t, err)
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	return redispartition.NewLeases(rdb, prefix), rdb, prefix
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

func TestLeaseAcquireCheckRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ls, _, _ := newLeases(t)

	a, err := ls.Acquire(ctx, "g", "order:c-1", "host-a")
	require.NoError(t, err)
	require.Equal(t, int64(1), a.Generation)
	require.Equal(t, "host-a:1", a.Token())

	_, err = ls.Acquire(ctx, "g", "order:c-1", "host-b")
	require.ErrorIs(t, err, redispartition.ErrLeaseHeld)

	// Another group owns the same partition independently.
	other, err := ls.Acquire(ctx, "g2", "order:c-1", "host-b")
	require.NoError(t, err)
	require.Equal(t, int64(1), other.Generation)

	require.NoError(t, ls.Check(ctx, a))
	require.NoError(t, ls.Release(ctx, a))
	require.ErrorIs(t, ls.Check(ctx, a), redispartition.ErrLeaseLost, "a released lease is no longer the caller's")
	require.ErrorIs(t, ls.Release(ctx, a), redispartition.ErrLeaseLost)

	b, err := ls.Acquire(ctx, "g", "order:c-1", "host-b")
	require.NoError(t, err)
	require.Equal(t, int64(2), b.Generation, "every acquire gets the next generation")
}

// The bulk calls span several scripts (more units than one chunk) and give
// each unit its own outcome: acquired, held by another owner (with its
// token), halted; and checking reports exactly the leases that were lost.
func TestLeasesInBulk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ls, _, _ := newLeases(t)
	const n = 1234
	units := make([]redispartition.Unit, n)
	for i := range units {
		units[i] = redispartition.Unit{Group: "g", Unit: "order:k" + strconv.Itoa(i)}
	}
	// Every 7th held by host-b, every 11th (not 7th) halted.
	for i := 0; i < n; i += 7 {
		_, err := ls.Acquire(ctx, "g", units[i].Unit, "host-b")
		require.NoError(t, err)
	}
	for i := 0; i < n; i += 11 {
		if i%7 == 0 {
			continue
		}
		l, err := ls.Acquire(ctx, "g", units[i].Unit, "host-c")
		require.NoError(t, err)
		require.NoError(t, ls.Halt(ctx, l, redispartition.Halt{Stream: "s", Entry: "1-0", Reason: "x"}))
	}
	wants := make([]redispartition.Want, n)
	for i, u := range units {
		wants[i] = redispartition.Want{Unit: u}
	}
	got, err := ls.AcquireAll(ctx, wants, "host-a", -1)
	require.NoError(t, err)
	require.Len(t, got, n)
	var mine []redispartition.Lease
	for i, a := range got {
		switch {
		case i%7 == 0:
			require.ErrorIs(t, a.Err, redispartition.ErrLeaseHeld, "unit %d", i)
			require.Equal(t, "host-b:1", a.Holder)
		case i%11 == 0:
			require.ErrorIs(t, a.Err, redispartition.ErrHalted, "unit %d", i)
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
	_, err = ls.Acquire(ctx, "g", mine[3].Unit, "host-b")
	require.NoError(t, err)
	lost, err := ls.CheckAll(ctx, mine)
	require.NoError(t, err)
	require.Equal(t, wantLost, lost)
	require.ErrorIs(t, ls.Check(ctx, mine[3]), redispartition.ErrLeaseLost)
	require.NoError(t, ls.Check(ctx, mine[1]))
}

// A limit across chunks takes exactly that many free units; the rest are
// reported free but not taken, and held or halted ones as such.
func TestAcquireAllStopsAtItsLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ls, _, _ := newLeases(t)
	const n, limit = 1234, 600
	wants := make([]redispartition.Want, n)
	for i := range wants {
		wants[i] = redispartition.Want{Unit: redispartition.Unit{Group: "g", Unit: "order:k" + strconv.Itoa(i)}}
	}
	for i := 0; i < n; i += 5 {
		_, err := ls.Acquire(ctx, "g", wants[i].Unit.Unit, "host-b")
		require.NoError(t, err)
	}
	got, err := ls.AcquireAll(ctx, wants, "host-a", limit)
	require.NoError(t, err)
	taken, over := 0, 0
	for i, a := range got {
		switch {
		case i%5 == 0:
			require.ErrorIs(t, a.Err, redispartition.ErrLeaseHeld, "unit %d", i)
		case a.Err == nil:
			require.Zero(t, over, "unit %d taken after the limit was reached", i)
			taken++
		default:
			require.ErrorIs(t, a.Err, redispartition.ErrOverLimit, "unit %d", i)
			over++
		}
	}
	require.Equal(t, limit, taken)
	require.Equal(t, n-n/5-1-limit, over)
	// Sent again (its reply lost), the call answers the caller's own
	// leases, at the same generations.
	again, err := ls.AcquireAll(ctx, wants[1:3], "host-a", -1)
	require.NoError(t, err)
	for i, a := range again {
		require.NoError(t, a.Err)
		require.Equal(t, got[1+i].Lease, a.Lease)
	}
	got, err = ls.AcquireAll(ctx, wants[:10], "host-c", 0)
	require.NoError(t, err)
	for i, a := range got {
		require.Error(t, a.Err, "unit %d: a zero limit takes nothing", i)
	}
}

// One Ack of more ids than the script's inner chunk acks every one and
// forgets every one's attempts.
func TestAckInBulk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ls, rdb, prefix := newLeases(t)
	const stream = "order:big"
	ids := xadd(t, rdb, prefix+stream, 2345)
	l, err := ls.Acquire(ctx, "g", stream, "host-a")
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
	left, err := rdb.HLen(ctx, prefix+redispartition.AttemptsKey("g", stream)).Result()
	require.NoError(t, err)
	require.Zero(t, left)
}

// A lease holds while its owner heartbeats. Once the owner's heartbeat
// has lapsed, a successor that names the lapsed token takes the lease
// over at the next generation, and the stale owner is fenced; a token
// that is not the holder's, or a lease with a TTL (an older host's), is
// not taken.
func TestLapsedOwnersLeaseIsTakenOver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ls, rdb, prefix := newLeases(t)
	beat, err := ls.Heartbeat(ctx, "host-a", time.Hour, []string{"g"}, nil)
	require.NoError(t, err)
	require.True(t, beat.Lapsed, "a first heartbeat reports the owner new")
	require.True(t, beat.Live["host-a"])
	require.Equal(t, map[string]int{"g": 1}, beat.Members)
	a, err := ls.Acquire(ctx, "g", "u", "host-a")
	require.NoError(t, err)
	ttl, err := rdb.PTTL(ctx, prefix+redispartition.LeaseKey("g", "u")).Result()
	require.NoError(t, err)
	require.Equal(t, time.Duration(-1), ttl, "a lease key has no TTL")

	beat, err = ls.Heartbeat(ctx, "host-b", 20*time.Millisecond, []string{"g", "h"}, nil)
	require.NoError(t, err)
	require.True(t, beat.Lapsed)
	require.Equal(t, map[string]int{"g": 2, "h": 1}, beat.Members, "each group counts its live consumers")
	got, err := ls.AcquireAll(ctx, []redispartition.Want{{Unit: redispartition.Unit{Group: "g", Unit: "u"}, Lapsed: "host-a:0"}}, "host-b", -1)
	require.NoError(t, err)
	require.ErrorIs(t, got[0].Err, redispartition.ErrLeaseHeld, "not the holder's token")
	require.Equal(t, "host-a:1", got[0].Holder)

	// host-a stops heartbeating: once its entry is past, it is not live.
	require.NoError(t, rdb.ZAdd(ctx, prefix+redispartition.HostsKey, redis.Z{Score: 1, Member: "host-a"}).Err())
	live, err := ls.Live(ctx)
	require.NoError(t, err)
	require.False(t, live["host-a"])
	got, err = ls.AcquireAll(ctx, []redispartition.Want{{Unit: redispartition.Unit{Group: "g", Unit: "u"}, Lapsed: got[0].Holder}}, "host-b", -1)
	require.NoError(t, err)
	require.NoError(t, got[0].Err)
	require.Equal(t, a.Generation+1, got[0].Lease.Generation)
	require.ErrorIs(t, ls.Check(ctx, a), redispartition.ErrLeaseLost)
	_, err = ls.Read(ctx, a, "s", false, 1)
	require.ErrorIs(t, err, redispartition.ErrLeaseLost, "the stale owner is fenced")
	beat, err = ls.Heartbeat(ctx, "host-a", time.Hour, nil, []string{"g"})
	require.NoError(t, err)
	require.True(t, beat.Lapsed, "its heartbeat tells the stale owner it had lapsed")
	require.Empty(t, beat.Members)
	require.ErrorIs(t, rdb.ZScore(ctx, prefix+redispartition.MembersKey("g"), "host-a").Err(), redis.Nil, "host-a left g")

	// A lease with a TTL (written by an older host) expires by itself.
	require.NoError(t, rdb.Set(ctx, prefix+redispartition.LeaseKey("g", "v"), "old:3", time.Hour).Err())
	got, err = ls.AcquireAll(ctx, []redispartition.Want{{Unit: redispartition.Unit{Group: "g", Unit: "v"}, Lapsed: "old:3"}}, "host-b", -1)
	require.NoError(t, err)
	require.ErrorIs(t, got[0].Err, redispartition.ErrLeaseHeld)

	require.NoError(t, ls.Leave(ctx, "host-b", []string{"h"}))
	n, err := rdb.ZCard(ctx, prefix+redispartition.MembersKey("h")).Result()
	require.NoError(t, err)
	require.Equal(t, int64(0), n)
	live, err = ls.Live(ctx)
	require.NoError(t, err)
	require.Equal(t, map[string]bool{"host-a": true}, live)
}

func TestLeaseExpiryHandsOverAtTheNextGeneration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ls, rdb, prefix := newLeases(t)
	a, err := ls.Acquire(ctx, "g", "u", "host-a")
	require.NoError(t, err)
	// Expire it by hand rather than waiting for a TTL.
	require.NoError(t, rdb.Del(ctx, prefix+redispartition.LeaseKey("g", "u")).Err())
	b, err := ls.Acquire(ctx, "g", "u", "host-b")
	require.NoError(t, err)
	require.Equal(t, a.Generation+1, b.Generation)
	require.ErrorIs(t, ls.Check(ctx, a), redispartition.ErrLeaseLost)
	require.NoError(t, ls.Check(ctx, b))
}

func TestFencedReadAckReclaimRefuseAStaleOwner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ls, rdb, prefix := newLeases(t)
	stream := "order:c-1"
	ids := xadd(t, rdb, prefix+stream, 3)

	a, err := ls.Acquire(ctx, "g", stream, "host-a")
	require.NoError(t, err)
	got, err := ls.Read(ctx, a, stream, false, 2)
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.Equal(t, ids[0], got[0].ID)
	require.Equal(t, "0", got[0].Values["seq"])

	// a stalls; its lease expires and b takes over.
	require.NoError(t, rdb.Del(ctx, prefix+redispartition.LeaseKey("g", stream)).Err())
	b, err := ls.Acquire(ctx, "g", stream, "host-b")
	require.NoError(t, err)

	_, err = ls.Read(ctx, a, stream, false, 10)
	require.ErrorIs(t, err, redispartition.ErrLeaseLost)
	_, err = ls.Ack(ctx, a, stream, ids[0])
	require.ErrorIs(t, err, redispartition.ErrLeaseLost)
	_, err = ls.Reclaim(ctx, a, stream)
	require.ErrorIs(t, err, redispartition.ErrLeaseLost, "a stale owner must not steal its successor's pending entries")

	moved, err := ls.Reclaim(ctx, b, stream)
	require.NoError(t, err)
	require.Equal(t, 2, moved)
	pend, err := ls.Read(ctx, b, stream, true, 10)
	require.NoError(t, err)
	require.Equal(t, []string{ids[0], ids[1]}, entryIDs(pend), "pending first, in order")
	again, err := ls.Read(ctx, b, stream, false, 10)
	require.NoError(t, err)
	require.Equal(t, []string{ids[0], ids[1]}, entryIDs(again), "a read of new entries answers the pending ones while there are any")
	n, err := ls.Ack(ctx, b, stream, ids[0], ids[1])
	require.NoError(t, err)
	require.Equal(t, 2, n)
	fresh, err := ls.Read(ctx, b, stream, false, 10)
	require.NoError(t, err)
	require.Equal(t, []string{ids[2]}, entryIDs(fresh))
	n, err = ls.Ack(ctx, b, stream, ids...)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	pend, err = ls.Read(ctx, b, stream, true, 10)
	require.NoError(t, err)
	require.Empty(t, pend)
}

func entryIDs(es []redispartition.Entry) []string {
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
	a, err := ls.Acquire(ctx, "g", "u", "host-a")
	require.NoError(t, err)
	n, err := ls.Attempt(ctx, a, "s", "1-0")
	require.NoError(t, err)
	require.Equal(t, 1, n)

	// The attempt count survives a change of owner.
	require.NoError(t, ls.Release(ctx, a))
	b, err := ls.Acquire(ctx, "g", "u", "host-b")
	require.NoError(t, err)
	n, err = ls.Attempt(ctx, b, "s", "1-0")
	require.NoError(t, err)
	require.Equal(t, 2, n)

	require.ErrorIs(t, ls.Halt(ctx, a, redispartition.Halt{Stream: "s", Entry: "1-0"}), redispartition.ErrLeaseLost)
	require.NoError(t, ls.Halt(ctx, b, redispartition.Halt{Stream: "s", Entry: "1-0", Reason: "boom", Attempts: 2, HaltedAt: time.Now()}))
	_, err = ls.Acquire(ctx, "g", "u", "host-c")
	require.ErrorIs(t, err, redispartition.ErrHalted)
	h, err := rdb.HGetAll(ctx, prefix+redispartition.HaltKey("g", "u")).Result()
	require.NoError(t, err)
	require.Equal(t, "boom", h["reason"])
	require.Equal(t, "1-0", h["entry"])
}

func TestReapOnlyAnIdleCaughtUpPartition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ls, rdb, prefix := newLeases(t)
	stream := partition.StreamName("order", "c-1")
	require.NoError(t, rdb.SAdd(ctx, prefix+redispartition.IndexKey("order"), "c-1").Err())
	ids := xadd(t, rdb, prefix+stream, 2)
	l, err := ls.Acquire(ctx, "g", stream, "host-a")
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
	n, err := rdb.Exists(ctx, prefix+stream, prefix+redispartition.GenerationKey("g", stream)).Result()
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

	prev, err := ls.Acquire(ctx, "g", stream, "host-0")
	require.NoError(t, err)
	got, err := ls.Read(ctx, prev, stream, false, 1)
	require.NoError(t, err)
	require.Len(t, got, 1)
	for i := 1; i < len(ids); i++ {
		// prev crashes holding one entry; its lease lapses.
		require.NoError(t, rdb.Del(ctx, prefix+redispartition.LeaseKey("g", stream)).Err())
		l, err := ls.Acquire(ctx, "g", stream, "host-"+strconv.Itoa(i))
		require.NoError(t, err)

		dropped, err := ls.DropStale(ctx, l, stream)
		require.NoError(t, err)
		require.Empty(t, dropped, "generation %d: the predecessor still holds its entry", i)
		require.Equal(t, map[string]int64{prev.Token(): 1}, consumers())

		moved, err := ls.Reclaim(ctx, l, stream)
		require.NoError(t, err)
		require.Equal(t, 1, moved)
		_, err = ls.DropStale(ctx, prev, stream)
		require.ErrorIs(t, err, redispartition.ErrLeaseLost, "a stale owner deletes nothing")
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

func TestKeyLayout(t *testing.T) {
	t.Parallel()
	require.Equal(t, "test::order:__partitions__", redispartition.IndexKey("test::order"))
	require.Equal(t, "test::order:__wake__", redispartition.WakeKey("test::order"))
	// A valid key can never produce the index or wake-up name.
	for _, key := range []string{"__partitions__", "__wake__"} {
		require.NotEmpty(t, partition.KeyReason(key, partition.DefaultBackfillSuffix), key)
	}
}

// Take pipelines the reclaim, the stale consumers' drop and the first
// read; each is fenced on its own, so a stale owner's Take moves nothing
// and delivers nothing, and the successor's Take reclaims and reads in
// order.
func TestTakeIsFencedAtEachStep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ls, rdb, prefix := newLeases(t)
	stream := "order:c-1"
	ids := xadd(t, rdb, prefix+stream, 4)

	a, err := ls.Acquire(ctx, "g", stream, "host-a")
	require.NoError(t, err)
	ta, err := ls.Take(ctx, a, stream, 2)
	require.NoError(t, err)
	require.True(t, ta.Complete)
	require.Zero(t, ta.Moved)
	require.Equal(t, ids[:2], entryIDs(ta.Entries))
	require.Equal(t, "1", ta.Entries[1].Values["seq"])

	// a stalls; b takes over, then a (stale) tries to take the unit again.
	require.NoError(t, rdb.Del(ctx, prefix+redispartition.LeaseKey("g", stream)).Err())
	b, err := ls.Acquire(ctx, "g", stream, "host-b")
	require.NoError(t, err)
	tb, err := ls.Take(ctx, b, stream, 10)
	require.NoError(t, err)
	require.Equal(t, 2, tb.Moved)
	require.Equal(t, []string{a.Token()}, tb.Dropped, "a's consumer is empty once b reclaimed it")
	require.Equal(t, ids[:2], entryIDs(tb.Entries), "the reclaimed entries first")

	_, err = ls.Take(ctx, a, stream, 10)
	require.ErrorIs(t, err, redispartition.ErrLeaseLost)
	pend, err := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: prefix + stream, Group: "g", Start: "-", End: "+", Count: 10}).Result()
	require.NoError(t, err)
	require.Len(t, pend, 2, "the stale Take delivered nothing")
	for _, p := range pend {
		require.Equal(t, b.Token(), p.Consumer, "the stale Take moved nothing")
	}

	// b acks, and reads on past them: the next read's guess is right.
	_, err = ls.Ack(ctx, b, stream, ids[0], ids[1])
	require.NoError(t, err)
	rest, err := ls.ReadAfter(ctx, b, stream, false, 10, ids[1])
	require.NoError(t, err)
	require.Equal(t, ids[2:], entryIDs(rest))
	require.Equal(t, "3", rest[1].Values["seq"])
}

// ReadAfter's guess at where the delivered entries begin only saves a
// round trip: a wrong one still answers the delivered entries with their
// bodies, and an entry deleted while pending comes back with no fields,
// as XREADGROUP answers it.
func TestReadAfterAWrongGuess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ls, rdb, prefix := newLeases(t)
	stream := "order:c-1"
	ids := xadd(t, rdb, prefix+stream, 5)
	a, err := ls.Acquire(ctx, "g", stream, "host-a")
	require.NoError(t, err)

	got, err := ls.ReadAfter(ctx, a, stream, false, 2, ids[3]) // the guess is past them
	require.NoError(t, err)
	require.Equal(t, ids[:2], entryIDs(got))
	require.Equal(t, "0", got[0].Values["seq"])
	require.Equal(t, "1", got[1].Values["seq"])

	require.NoError(t, rdb.XDel(ctx, prefix+stream, ids[0]).Err())
	pend, err := ls.ReadAfter(ctx, a, stream, true, 10, "")
	require.NoError(t, err)
	require.Equal(t, ids[:2], entryIDs(pend))
	require.Nil(t, pend[0].Values, "deleted while pending")
	require.Equal(t, "1", pend[1].Values["seq"])
}

// Acks sent with a read go first, each fenced: the read, which answers
// the caller's pending entries first, then reads past them; a stale
// token acks nothing and reads nothing.
func TestAcksRideFencedAheadOfTheRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ls, rdb, prefix := newLeases(t)
	stream, lane := "order:c-1", "order:c-1:backfill"
	ids := xadd(t, rdb, prefix+stream, 4)
	laneIDs := xadd(t, rdb, prefix+lane, 1)
	pending := func(s string) []string {
		p, err := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: prefix + s, Group: "g", Start: "-", End: "+", Count: 10}).Result()
		require.NoError(t, err)
		out := make([]string, len(p))
		for i, e := range p {
			out[i] = e.ID
		}
		return out
	}

	a, err := ls.Acquire(ctx, "g", stream, "host-a")
	require.NoError(t, err)
	first, err := ls.Read(ctx, a, stream, false, 2)
	require.NoError(t, err)
	require.Equal(t, ids[:2], entryIDs(first))
	got, err := ls.Read(ctx, a, lane, false, 1)
	require.NoError(t, err)
	require.Equal(t, laneIDs, entryIDs(got))

	// Without the acks the read would answer ids[0:2] again (pending first).
	rest, err := ls.ReadAfter(ctx, a, stream, false, 10, ids[1],
		redispartition.Acks{Stream: lane, IDs: laneIDs}, redispartition.Acks{Stream: stream, IDs: ids[:2]})
	require.NoError(t, err)
	require.Equal(t, ids[2:], entryIDs(rest), "acked ahead of the read")
	require.Empty(t, pending(lane))
	require.Equal(t, ids[2:], pending(stream))

	// a stalls and b takes the unit: a's acks and read are refused.
	require.NoError(t, rdb.Del(ctx, prefix+redispartition.LeaseKey("g", stream)).Err())
	b, err := ls.Acquire(ctx, "g", stream, "host-b")
	require.NoError(t, err)
	_, err = ls.ReadAfter(ctx, a, stream, false, 10, ids[3], redispartition.Acks{Stream: stream, IDs: ids[2:]})
	require.ErrorIs(t, err, redispartition.ErrLeaseLost)
	require.ErrorIs(t, ls.AckAll(ctx, a, []redispartition.Acks{{Stream: stream, IDs: ids[2:]}}), redispartition.ErrLeaseLost)
	require.Equal(t, ids[2:], pending(stream), "the stale owner acked nothing")
	require.NoError(t, ls.AckAll(ctx, b, []redispartition.Acks{{Stream: stream, IDs: ids[2:]}}))
	require.Empty(t, pending(stream))
}
