package testserver

import (
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) {
	code := m.Run()
	Stop()
	os.Exit(code)
}

func TestPostgresGivesEachCallerAnEmptyDatabase(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	var names []string
	var dropped string
	for range 2 {
		t.Run("caller", func(t *testing.T) {
			conn, err := pgx.Connect(ctx, Postgres(t))
			require.NoError(t, err)
			defer conn.Close(ctx)
			var name string
			var tables int
			require.NoError(t, conn.QueryRow(ctx, `SELECT current_database(),
				(SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public')`).Scan(&name, &tables))
			require.Zero(t, tables, "the database is empty")
			_, err = conn.Exec(ctx, `CREATE TABLE mine (n int)`)
			require.NoError(t, err)
			names = append(names, name)
			dropped = name
		})
	}
	require.NotEqual(t, names[0], names[1])

	// The databases are dropped when their tests end.
	conn, err := pgx.Connect(ctx, Postgres(t))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var n int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname = $1`, dropped).Scan(&n))
	require.Zero(t, n)
}

func TestRedisGivesEachCallerAPrefix(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	var first, url string
	t.Run("caller", func(t *testing.T) {
		var prefix string
		url, prefix = Redis(t)
		c, err := dialRedis(ctx, url)
		require.NoError(t, err)
		defer c.close()
		_, err = c.do("SET", prefix+"k", "v")
		require.NoError(t, err)
		got, err := c.do("GET", prefix+"k")
		require.NoError(t, err)
		require.Equal(t, "v", got)
		first = prefix
	})

	url2, second := Redis(t)
	require.Equal(t, url, url2, "one server")
	require.NotEqual(t, first, second, "a prefix per caller")
	c, err := dialRedis(ctx, url2)
	require.NoError(t, err)
	defer c.close()
	got, err := c.do("EXISTS", first+"k")
	require.NoError(t, err)
	require.Equal(t, int64(0), got, "a caller's keys are deleted when its test ends")
}
