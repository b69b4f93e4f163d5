package redispartition_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/redispartition"
	"github.com/proteanhq/protean-host/partition"
)

// xaddIndexed appends n entries with an "id" field (as the broker's codec
// writes them) and records each in the stream's id index, as Publish does.
func xaddIndexed(t *testing.T, rdb *redis.Client, stream string, from, n int) []string {
	t.Helper()
	ctx := context.Background()
	var ids []string
	for i := from; i < from+n; i++ {
		mid := "m" + strconv.Itoa(i)
		id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"id", mid}}).Result()
		require.NoError(t, err)
		require.NoError(t, rdb.HSet(ctx, redispartition.IDIndexKey(stream), mid, id).Err())
		ids = append(ids, id)
	}
	return ids
}

func readGroup(t *testing.T, rdb *redis.Client, stream, group, consumer string, n int) []string {
	t.Helper()
	res, err := rdb.XReadGroup(context.Background(), &redis.XReadGroupArgs{
		Group: group, Consumer: consumer, Streams: []string{stream, ">"}, Count: int64(n),
	}).Result()
	require.NoError(t, err)
	var ids []string
	for _, m := range res[0].Messages {
		ids = append(ids, m.ID)
	}
	require.Len(t, ids, n)
	return ids
}

func streamIDs(t *testing.T, rdb *redis.Client, stream string) []string {
	t.Helper()
	es, err := rdb.XRange(context.Background(), stream, "-", "+").Result()
	require.NoError(t, err)
	var ids []string
	for _, e := range es {
		ids = append(ids, e.ID)
	}
	return ids
}

// indexed returns the message ids the stream's id index holds.
func indexed(t *testing.T, rdb *redis.Client, stream string) []string {
	t.Helper()
	keys, err := rdb.HKeys(context.Background(), redispartition.IDIndexKey(stream)).Result()
	require.NoError(t, err)
	return keys
}

// TestTrimKeepsWhatAnyGroupStillNeeds: a trim removes only the prefix every
// group acked. Entries pending for one group's consumer and entries a slow
// group has not read yet stay; the id index keeps exactly the entries left.
func TestTrimKeepsWhatAnyGroupStillNeeds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ls, rdb, prefix := newLeases(t)
	stream := partition.StreamName("order", "c-1")
	s := prefix + stream
	ids := xaddIndexed(t, rdb, s, 0, 10)
	require.NoError(t, rdb.XGroupCreate(ctx, s, "fast", "0").Err())
	require.NoError(t, rdb.XGroupCreate(ctx, s, "slow", "0").Err())

	// fast: consumer c1 reads everything and acks 0..5; 6..9 stay pending.
	readGroup(t, rdb, s, "fast", "c1", 10)
	require.NoError(t, rdb.XAck(ctx, s, "fast", ids[:6]...).Err())
	// slow: read and acked 0..2 only.
	readGroup(t, rdb, s, "slow", "c2", 3)
	require.NoError(t, rdb.XAck(ctx, s, "slow", ids[:3]...).Err())

	n, err := ls.Trim(ctx, stream)
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "only what is below slow's last-delivered entry")
	require.Equal(t, ids[2:], streamIDs(t, rdb, s))
	require.ElementsMatch(t, []string{"m2", "m3", "m4", "m5", "m6", "m7", "m8", "m9"}, indexed(t, rdb, s))

	// slow catches up: fast's pending entries (another consumer's) hold the line now.
	readGroup(t, rdb, s, "slow", "c2", 7)
	require.NoError(t, rdb.XAck(ctx, s, "slow", ids[3:]...).Err())
	n, err = ls.Trim(ctx, stream)
	require.NoError(t, err)
	require.EqualValues(t, 4, n)
	require.Equal(t, ids[6:], streamIDs(t, rdb, s), "entries pending for fast stay")
	pend, err := rdb.XPending(ctx, s, "fast").Result()
	require.NoError(t, err)
	require.EqualValues(t, 4, pend.Count)

	// A second trim with nothing new to remove removes nothing.
	n, err = ls.Trim(ctx, stream)
	require.NoError(t, err)
	require.Zero(t, n)

	require.NoError(t, rdb.XAck(ctx, s, "fast", ids[6:]...).Err())
	n, err = ls.Trim(ctx, stream)
	require.NoError(t, err)
	require.EqualValues(t, 3, n)
	require.Equal(t, ids[9:], streamIDs(t, rdb, s), "the last delivered entry stays: the trim point is exclusive")
	require.Equal(t, []string{"m9"}, indexed(t, rdb, s))

	// Retention is "until every existing group acked it": a group created
	// now starts at the entries left.
	require.NoError(t, rdb.XGroupCreate(ctx, s, "late", "0").Err())
	require.Equal(t, ids[9:], readGroup(t, rdb, s, "late", "c3", 1))
}

// TestTrimNeedsAGroup: a stream nobody has a group on keeps everything (no
// group has said what it still needs); a missing stream is nothing to trim.
func TestTrimNeedsAGroup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ls, rdb, prefix := newLeases(t)
	ids := xaddIndexed(t, rdb, prefix+"order", 0, 5)

	n, err := ls.Trim(ctx, "order")
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, ids, streamIDs(t, rdb, prefix+"order"))

	// A group that has read nothing needs everything.
	require.NoError(t, rdb.XGroupCreate(ctx, prefix+"order", "g", "0").Err())
	n, err = ls.Trim(ctx, "order")
	require.NoError(t, err)
	require.Zero(t, n)

	n, err = ls.Trim(ctx, "missing")
	require.NoError(t, err)
	require.Zero(t, n)
}

// TestTrimWithTheLeaseProtocol: entries acked through the fenced Ack are
// trimmed; the owner's pending entries survive a trim and a takeover still
// reclaims and reads them.
func TestTrimWithTheLeaseProtocol(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ls, rdb, prefix := newLeases(t)
	stream := partition.StreamName("order", "c-1")
	ids := xaddIndexed(t, rdb, prefix+stream, 0, 6)
	a, err := ls.Acquire(ctx, "g", stream, "host-a")
	require.NoError(t, err)
	got, err := ls.Read(ctx, a, stream, false, 4)
	require.NoError(t, err)
	require.Len(t, got, 4)
	_, err = ls.Ack(ctx, a, stream, ids[0], ids[1])
	require.NoError(t, err)

	n, err := ls.Trim(ctx, stream)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)

	// host-a dies holding ids[2], ids[3]; its successor gets them back first.
	require.NoError(t, rdb.Del(ctx, prefix+redispartition.LeaseKey("g", stream)).Err())
	b, err := ls.Acquire(ctx, "g", stream, "host-b")
	require.NoError(t, err)
	moved, err := ls.Reclaim(ctx, b, stream)
	require.NoError(t, err)
	require.Equal(t, 2, moved)
	got, err = ls.Read(ctx, b, stream, true, 10)
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.Equal(t, ids[2], got[0].ID)
	require.Equal(t, "m2", got[0].Values["id"])
}

// TestTrimInBatches: a long acked prefix is removed in several short
// scripts, and all of it goes.
func TestTrimInBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ls, rdb, prefix := newLeases(t)
	s := prefix + "order"
	const total = 2500
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range total {
			mid := "m" + strconv.Itoa(i)
			p.XAdd(ctx, &redis.XAddArgs{Stream: s, ID: "1-" + strconv.Itoa(i+1), Values: []any{"id", mid}})
			p.HSet(ctx, redispartition.IDIndexKey(s), mid, "1-"+strconv.Itoa(i+1))
		}
		return nil
	})
	require.NoError(t, err)
	// The group has delivered and acked everything: last-delivered is the last entry.
	require.NoError(t, rdb.XGroupCreate(ctx, s, "g", "$").Err())

	n, err := ls.Trim(ctx, "order")
	require.NoError(t, err)
	require.EqualValues(t, total-1, n)
	require.EqualValues(t, 1, rdb.XLen(ctx, s).Val())
	require.EqualValues(t, 1, rdb.HLen(ctx, redispartition.IDIndexKey(s)).Val())
}

// TestReapDeletesTheIDIndex: reaping a partition deletes the broker's id
// index of each of its streams with the streams.
func TestReapDeletesTheIDIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ls, rdb, prefix := newLeases(t)
	stream := partition.StreamName("order", "c-1")
	lane := partition.LaneStreamName("order", "c-1", "backfill")
	require.NoError(t, rdb.SAdd(ctx, prefix+redispartition.IndexKey("order"), "c-1").Err())
	ids := xaddIndexed(t, rdb, prefix+stream, 0, 2)
	xaddIndexed(t, rdb, prefix+lane, 2, 1)
	l, err := ls.Acquire(ctx, "g", stream, "host-a")
	require.NoError(t, err)
	_, err = ls.Read(ctx, l, stream, false, 10)
	require.NoError(t, err)
	_, err = ls.Ack(ctx, l, stream, ids...)
	require.NoError(t, err)
	lg, err := ls.Read(ctx, l, lane, false, 10)
	require.NoError(t, err)
	_, err = ls.Ack(ctx, l, lane, lg[0].ID)
	require.NoError(t, err)

	ok, err := ls.Reap(ctx, l, "order", "c-1", []string{stream, lane}, 0)
	require.NoError(t, err)
	require.True(t, ok)
	n, err := rdb.Exists(ctx, prefix+stream, prefix+lane,
		prefix+redispartition.IDIndexKey(stream), prefix+redispartition.IDIndexKey(lane)).Result()
	require.NoError(t, err)
	require.Zero(t, n, "streams and their id indexes are gone")
}
