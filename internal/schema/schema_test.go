package schema_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/schema"
	"github.com/proteanhq/protean-host/internal/testserver"
)

func TestMain(m *testing.M) { testserver.Main(m) }

func newPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), testserver.Postgres(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func allNames() []string {
	var out []string
	for _, m := range schema.Migrations() {
		out = append(out, m.Name)
	}
	return out
}

func TestMigrateIsIdempotentAndCheckFollows(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := newPool(t)

	err := schema.Check(ctx, pool)
	require.ErrorIs(t, err, schema.ErrNotMigrated)
	require.Contains(t, err.Error(), "protean-host migrate --config FILE")

	applied, err := schema.Migrate(ctx, pool)
	require.NoError(t, err)
	require.Len(t, applied, len(schema.Migrations()))
	require.Equal(t, "0001_message_store", applied[0])
	require.NoError(t, schema.Check(ctx, pool))

	applied, err = schema.Migrate(ctx, pool)
	require.NoError(t, err)
	require.Empty(t, applied, "a migrated database needs nothing")

	var names []string
	rows, err := pool.Query(ctx, `SELECT name FROM protean_schema_migrations ORDER BY version`)
	require.NoError(t, err)
	for rows.Next() {
		var n string
		require.NoError(t, rows.Scan(&n))
		names = append(names, n)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, allNames(), names)

	// A database behind this host fails the check, naming the step.
	_, err = pool.Exec(ctx, `DELETE FROM protean_schema_migrations WHERE version = $1`, schema.Latest())
	require.NoError(t, err)
	err = schema.Check(ctx, pool)
	require.ErrorIs(t, err, schema.ErrNotMigrated)
	require.Contains(t, err.Error(), schema.Migrations()[schema.Latest()-1].Name)
}

func TestConcurrentMigratorsApplyEachStepOnce(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := newPool(t)
	const hosts = 4
	applied := make([][]string, hosts)
	errs := make([]error, hosts)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range hosts {
		wg.Go(func() {
			<-start
			applied[i], errs[i] = schema.Migrate(ctx, pool)
		})
	}
	close(start)
	wg.Wait()
	count := map[string]int{}
	for i := range hosts {
		require.NoError(t, errs[i])
		for _, name := range applied[i] {
			count[name]++
		}
	}
	require.Len(t, count, len(schema.Migrations()))
	for name, n := range count {
		require.Equal(t, 1, n, "%s applied %d times", name, n)
	}
	require.NoError(t, schema.Check(ctx, pool))
}

func TestMessageDBFunctions(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := newPool(t)
	_, err := schema.Migrate(ctx, pool)
	require.NoError(t, err)

	var category string
	require.NoError(t, pool.QueryRow(ctx, `SELECT message_store.category('order-a-b')`).Scan(&category))
	require.Equal(t, "order", category)
	var hash int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT message_store.hash_64('order')`).Scan(&hash))
	require.NotZero(t, hash)

	write := func(id string, expected any) (int64, error) {
		var pos int64
		err := pool.QueryRow(ctx, `SELECT message_store.write_message($1, 'order-1', 'Placed', '{"n":1}', NULL, $2)`, id, expected).Scan(&pos)
		return pos, err
	}
	pos, err := write("6f9619ff-8b86-4011-b42d-00c04fc964ff", int64(-1))
	require.NoError(t, err)
	require.Equal(t, int64(0), pos)
	pos, err = write("6f9619ff-8b86-4011-b42d-00c04fc964f0", nil)
	require.NoError(t, err)
	require.Equal(t, int64(1), pos)
	_, err = write("6f9619ff-8b86-4011-b42d-00c04fc964f1", int64(0))
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "Wrong expected version: 0 (Stream: order-1, Stream Version: 1)", pgErr.Message)

	// Category reads can use MessageDB's category index.
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SET enable_seqscan = off`)
	require.NoError(t, err)
	defer conn.Exec(context.Background(), `RESET enable_seqscan`) //nolint:errcheck
	rows, err := conn.Query(ctx, `EXPLAIN SELECT * FROM message_store.messages
		WHERE message_store.category(stream_name) = $1 AND global_position >= $2 ORDER BY global_position LIMIT $3`, "order", 1, 10)
	require.NoError(t, err)
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Contains(t, strings.Join(plan, "\n"), "messages_category")
}

// TestRecordsJSONKeepsExistingRows migrates a database that holds records
// written while data was jsonb: they stay readable, tombstones stay NULL,
// and a document written after reads back as its bytes.
func TestRecordsJSONKeepsExistingRows(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := newPool(t)
	const step = 14 // 0014_records_json
	require.Equal(t, "records_json", schema.Migrations()[step-1].Name)

	// The database as a host before step 14 left it.
	_, err := pool.Exec(ctx, `CREATE TABLE protean_schema_migrations (
		version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`)
	require.NoError(t, err)
	for _, m := range schema.Migrations()[:step-1] {
		_, err := pool.Exec(ctx, m.SQL)
		require.NoError(t, err, m.Name)
		_, err = pool.Exec(ctx, `INSERT INTO protean_schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name)
		require.NoError(t, err)
	}
	_, err = pool.Exec(ctx, `INSERT INTO records (kind, type, id, version, data) VALUES
		('projection', 'totals', 'old', 3, '{"z":1,"a":[1, 2]}'),
		('aggregate', 'order', 'gone', 2, NULL)`)
	require.NoError(t, err)

	applied, err := schema.Migrate(ctx, pool)
	require.NoError(t, err)
	require.Contains(t, applied, "0014_records_json")

	read := func(id string) (int64, *string) {
		var v int64
		var data *string
		require.NoError(t, pool.QueryRow(ctx, `SELECT version, data::text FROM records WHERE id = $1`, id).Scan(&v, &data))
		return v, data
	}
	v, data := read("old")
	require.Equal(t, int64(3), v)
	require.NotNil(t, data)
	require.Equal(t, `{"a": [1, 2], "z": 1}`, *data, "a row written as jsonb keeps jsonb's text")
	v, data = read("gone")
	require.Equal(t, int64(2), v)
	require.Nil(t, data, "a tombstone stays NULL")

	_, err = pool.Exec(ctx, `UPDATE records SET data = $1, version = 4 WHERE id = 'old'`, `{"z":1,"a":[1, 2],"n":1.50}`)
	require.NoError(t, err)
	_, data = read("old")
	require.Equal(t, `{"z":1,"a":[1, 2],"n":1.50}`, *data)
	_, err = pool.Exec(ctx, `UPDATE records SET data = $1 WHERE id = 'old'`, `{"z":`)
	require.Error(t, err, "json still refuses text that is not JSON")
}
