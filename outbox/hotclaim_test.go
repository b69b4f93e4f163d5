package outbox_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/outbox"
)

// On PostgreSQL a claim leases a row through its lock columns and leaves
// its status column alone, so that the claim is a HOT update (no new index
// entries). The store still reports the row as processing, everywhere a
// status shows. Rows an older host left with status 'processing' keep
// working: processing until their lock expires, then claimable, and
// markable by whoever holds them.
func TestPostgresClaimLeavesStatusColumn(t *testing.T) {
	t.Parallel()
	ctx := testwait.Context(t)
	pool := testserver.PostgresPool(t)
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	now := t0
	s := outbox.NewPostgres(pool, func() time.Time { return now })

	require.NoError(t, s.Add(ctx, []outbox.Row{row("00000000-0000-4000-8000-000000000001", "order-1", nil, 0)}))
	claimed, err := s.Claim(ctx, "default", "A", 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	id := claimed[0].ID
	require.Equal(t, outbox.StatusProcessing, claimed[0].Status)
	require.Equal(t, "pending", statusColumn(t, pool, id), "the claim changed the status column: it cannot be a HOT update")
	got, err := s.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusProcessing, got.Status)
	require.Equal(t, "A", got.LockedBy)
	stats, err := s.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, stats.Counts[outbox.StatusProcessing])
	require.Zero(t, stats.Counts[outbox.StatusPending])
	require.Nil(t, stats.OldestPending, "a claimed row is not pending")
	require.ErrorIs(t, s.Retry(ctx, id), outbox.ErrStatus, "a claimed row is not failed, whatever its column says")

	// Two rows an older host claimed (status 'processing'), each with a
	// pending row behind it on its key.
	legacy := func(msg, stream string) int64 {
		var id int64
		require.NoError(t, pool.QueryRow(ctx, `INSERT INTO outbox (message_id, stream_name, category, type, created_at,
				target_broker, status, locked_by, locked_until, last_processed_at)
			VALUES ($1, $2, 'order', 'OrderPlaced', $3, 'default', 'processing', 'old', $4, $3) RETURNING id`,
			msg, stream, t0, t0.Add(time.Minute)).Scan(&id))
		require.NoError(t, s.Add(ctx, []outbox.Row{row(msg+"-next", stream, nil, 0)}))
		return id
	}
	l1, l2 := legacy("legacy-1", "order-2"), legacy("legacy-2", "order-3")
	for _, l := range []int64{l1, l2} {
		got, err := s.Get(ctx, l)
		require.NoError(t, err)
		require.Equal(t, outbox.StatusProcessing, got.Status)
	}
	early, err := s.Claim(ctx, "default", "B", 10, time.Minute)
	require.NoError(t, err)
	require.Empty(t, early, "a live lock of an older host holds its key back")
	require.NoError(t, s.MarkPublished(ctx, l1, "old"), "the older host marks its own row")

	now = t0.Add(2 * time.Minute) // the older host's locks have expired
	late, err := s.Claim(ctx, "default", "B", 10, time.Minute)
	require.NoError(t, err)
	var ids []int64
	for _, r := range late {
		ids = append(ids, r.ID)
		require.Equal(t, outbox.StatusProcessing, r.Status)
	}
	require.Contains(t, ids, l2, "an expired lock of an older host is claimable")
	require.ErrorIs(t, s.MarkPublished(ctx, l2, "old"), outbox.ErrNotOwner)
	require.NoError(t, s.MarkPublishedBatch(ctx, "B", ids))
	for _, id := range append(ids, l1) {
		got, err := s.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, outbox.StatusPublished, got.Status, "row %d", id)
		require.Empty(t, got.LockedBy)
	}
}

// TestPostgresClaimIsHOT pins what the claim's shape is for: on a table
// migrated by package schema, claiming a fresh backlog updates its rows
// in place (HOT), adding no index entries. Setting the status in the
// claim, indexing a lock column, or filling pages full all break it.
func TestPostgresClaimIsHOT(t *testing.T) {
	t.Parallel()
	ctx := testwait.Context(t)
	cfg := testserver.PostgresPool(t).Config()
	cfg.MaxConns = 1 // one backend, whose statistics the test flushes
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s := outbox.NewPostgres(pool, nil)
	var rows []outbox.Row
	for i := range 200 {
		rows = append(rows, row(fmt.Sprintf("00000000-0000-4000-8000-%012d", i), fmt.Sprintf("order-%d", i), nil, 0))
	}
	require.NoError(t, s.Add(ctx, rows))
	for claimed := 0; claimed < len(rows); {
		got, err := s.Claim(ctx, "default", "A", 50, time.Minute)
		require.NoError(t, err)
		require.NotEmpty(t, got)
		claimed += len(got)
	}
	_, err = pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
	require.NoError(t, err)
	var updated, hot int64
	testwait.For(t, "the claims' updates in the statistics", func() (bool, string) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
			WHERE relname = 'outbox'`).Scan(&updated, &hot))
		return updated >= int64(len(rows)), fmt.Sprintf("%d updates", updated)
	})
	require.Equal(t, int64(len(rows)), updated)
	// A leased version is a few bytes longer (the lock columns are no
	// longer NULL), so the half page left free holds all but one or two
	// of a page's leased versions: about 6% of these small rows miss.
	require.GreaterOrEqual(t, hot*10, updated*9, "%d of %d claims were HOT updates", hot, updated)
}

// statusColumn reads row id's status column as stored.
func statusColumn(t *testing.T, pool *pgxpool.Pool, id int64) string {
	t.Helper()
	var status string
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT status FROM outbox WHERE id = $1`, id).Scan(&status))
	return status
}
