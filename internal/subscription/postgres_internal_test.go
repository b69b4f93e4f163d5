package subscription

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/testserver"
)

// An owner's read of its unit's open failure records walks the partial
// index of open records (migration 0008), also on a generic plan (pgx
// prepares the statement; PostgreSQL may switch a prepared statement to a
// generic plan after five runs), not every record the unit ever had.
func TestPostgresOpenFailuresUseTheirIndex(t *testing.T) {
	t.Parallel()
	pool := testserver.PostgresPool(t)
	ctx := t.Context()
	_, err := pool.Exec(ctx, `INSERT INTO subscription_failures (consumer_group, unit, global_position, message_id, stream, type,
			partition_key, status, attempts, error, failed_at, updated_at)
		SELECT 'proj', 'order', g, 'm' || g, 'order-a', 'Happened', 'a', CASE WHEN g % 1000 = 0 THEN 'held' ELSE 'resolved' END,
			1, '', now(), now()
		FROM generate_series(1, 20000) g`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE subscription_failures`)
	require.NoError(t, err)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`)
	require.NoError(t, err)
	defer conn.Exec(ctx, `RESET plan_cache_mode`) //nolint:errcheck // the connection goes back to a test pool
	_, err = conn.Exec(ctx, `PREPARE open_failures(text, text) AS `+openSQL)
	require.NoError(t, err)
	rows, err := conn.Query(ctx, `EXPLAIN EXECUTE open_failures('proj', 'order')`)
	require.NoError(t, err)
	var plan []string
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		plan = append(plan, line)
	}
	require.NoError(t, rows.Err())
	require.Contains(t, strings.Join(plan, "\n"), "subscription_failures_open", strings.Join(plan, "\n"))

	fs := NewPostgresFailures(pool)
	open, err := fs.List(ctx, "proj", "order", true)
	require.NoError(t, err)
	require.Len(t, open, 20)
	for _, f := range open {
		require.Equal(t, StatusHeld, f.Status)
	}
}
