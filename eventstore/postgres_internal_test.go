package eventstore

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/testserver"
)

// ReadCategoryBackward's query is a backward index scan that stops at its
// limit, also on a generic plan: a page costs its own rows, not a sort of
// the category's. With 8 categories the planner walks the primary key
// back and filters (about 8 rows read per row returned); for a rare
// category, on a custom plan, it takes messages_category.
func TestPostgresCategoryBackwardUsesTheCategoryIndex(t *testing.T) {
	t.Parallel()
	pool := testserver.PostgresPool(t)
	ctx := t.Context()
	_, err := pool.Exec(ctx, `INSERT INTO message_store.messages (id, stream_name, type, position, data)
		SELECT gen_random_uuid(), (ARRAY['order-', 'payment-', 'shipment-', 'invoice-', 'cart-', 'user-', 'stock-', 'mail-'])[g % 8 + 1] || (g % 64), 'Happened', g / 64,
			jsonb_build_object('k', g % 64)
		FROM generate_series(0, 19999) g`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO message_store.messages (id, stream_name, type, position, data)
		SELECT gen_random_uuid(), 'rare-' || g, 'Happened', 0, '{}' FROM generate_series(0, 9) g`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE message_store.messages`)
	require.NoError(t, err)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`)
	require.NoError(t, err)
	defer conn.Exec(ctx, `RESET plan_cache_mode`) //nolint:errcheck // the connection goes back to a test pool
	_, err = conn.Exec(ctx, `PREPARE category_backward(text, bigint, bigint, bigint) AS `+categoryBackwardSQL)
	require.NoError(t, err)
	explain := func(sql string) string {
		t.Helper()
		rows, err := conn.Query(ctx, `EXPLAIN `+sql)
		require.NoError(t, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return strings.Join(lines, "\n")
	}
	generic := explain(`EXECUTE category_backward('order', 0, 15001, 16)`)
	require.Contains(t, generic, "Index Scan Backward", generic)
	require.NotContains(t, generic, "Sort", generic)
	rare := explain(`SELECT global_position, data FROM message_store.messages
		WHERE message_store.category(stream_name) = 'rare' AND global_position > 0 AND global_position <= 15001
		ORDER BY global_position DESC LIMIT 16`)
	require.Contains(t, rare, "messages_category", rare)

	evs, err := NewPostgres(pool).ReadCategoryBackward(ctx, "order", 0, 15001, 16)
	require.NoError(t, err)
	require.Len(t, evs, 16)
	require.Equal(t, int64(15001), evs[0].GlobalPosition, "global position 15,001 is g = 15,000, an order event")
}
