package main

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/config"
	"github.com/proteanhq/protean-host/internal/idempotency"
	"github.com/proteanhq/protean-host/internal/schema"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// TestProductionConfig runs the shipped production config against a real
// PostgreSQL: run refuses an unmigrated database, migrate is idempotent, a
// command leaves exactly one event row and one outbox row (with its
// partition key), a rejected key leaves none, and the outbox commands see
// the rows.
func TestProductionConfig(t *testing.T) {
	url := testserver.Postgres(t)
	t.Setenv(config.EnvDatabaseURL, url)
	redisURL, prefix := testserver.Redis(t)
	t.Setenv(config.EnvRedisURL, redisURL)
	prod := filepath.Join(wasmbuild.Root(), "configs", "production.toml")
	dir := wasmbuild.Examples(t)
	startHost := func(t *testing.T, name, dir string) (*testHost, error) {
		return startHostWith(t, name, dir, func(c *config.Config) { withKeyPrefix(c, prefix) })
	}

	_, err := startHost(t, "production.toml", dir)
	require.ErrorContains(t, err, "protean-host migrate")

	code, out, errs := cli(t, "migrate", "--config", prod)
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "applied 0001")
	code, out, errs = cli(t, "migrate", "--config", prod)
	require.Equal(t, 0, code, errs)
	require.NotContains(t, out, "applied", "a second migrate applies nothing")
	require.Contains(t, out, "schema at version")

	h, err := startHost(t, "production.toml", dir)
	require.NoError(t, err)
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	defer pool.Close()

	r := post(t, h, "PlaceOrder", `{"order_id":"o-1","client_id":"c-1","total":42.5}`)
	require.Equal(t, 200, r.code, r.raw)
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM message_store.messages WHERE stream_name = 'order-o-1' AND type = 'OrderPlaced'`))
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM message_store.messages`))
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM outbox WHERE partition_key = 'c-1' AND target_broker = 'default'`))
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM outbox`))
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM records WHERE kind = 'aggregate' AND type = 'order' AND id = 'o-1' AND version = 1`))

	r = post(t, h, "PlaceOrder", `{"order_id":"o-2","client_id":"a:b","total":1}`)
	require.Equal(t, 422, r.code, r.raw)
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM message_store.messages`), "a rejected key leaves no event")
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM outbox`), "a rejected key leaves no outbox row")
	require.Equal(t, 0, count(t, pool, `SELECT count(*) FROM records WHERE id = 'o-2'`), "a rejected key leaves no aggregate")

	// The projection is delivered through the relay and the broker, and
	// stored in PostgreSQL too.
	doc := projected(t, h, "the projection", "/v1/projections/client_orders/c-1")
	require.JSONEq(t, `{"client_id":"c-1","orders":1,"total":42.5,"order_ids":["o-1"]}`, doc.raw)
	eventually(t, h, "the row published", func() (bool, string) {
		n := count(t, pool, `SELECT count(*) FROM outbox WHERE status = 'published'`)
		return n == 1, fmt.Sprintf("%d published rows", n)
	})

	code, out, errs = cli(t, "outbox", "status", "--config", prod)
	require.Equal(t, 0, code, errs)
	require.Regexp(t, `(?m)^published\s+1$`, out)
	require.Contains(t, out, "oldest pending: none")
	// The running host's relay holds the lease (a host starved past its
	// renewal shows it lapsed, which is the line's other form).
	require.Regexp(t, `(?m)^relay lease of broker default: (\S+ claims its rows \(lease for \S+ more unless renewed\)|free \(\S+'s lapsed \S+ ago\).*)$`, out)
	code, _, errs = cli(t, "outbox", "retry", "999", "--config", prod)
	require.Equal(t, 1, code)
	require.Contains(t, errs, "outbox row 999")
	code, _, errs = cli(t, "outbox", "retry", "x", "--config", prod)
	require.Equal(t, 2, code, "a usage error")
	require.Contains(t, errs, "must be a positive integer")
}

func TestDatabaseCommandsOnMemoryConfig(t *testing.T) {
	domain := filepath.Join(wasmbuild.Root(), "configs", "domain.toml")
	code, out, errs := cli(t, "migrate", "--config", domain)
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "nothing to migrate")
	code, _, errs = cli(t, "outbox", "status", "--config", domain)
	require.Equal(t, 1, code)
	require.Contains(t, errs, "no database to act on")
}

// withKeyPrefix namespaces the Redis broker's keys under a test's prefix.
func withKeyPrefix(c *config.Config, prefix string) {
	b := c.Brokers[c.Outbox.Broker]
	b.KeyPrefix = prefix
	c.Brokers[c.Outbox.Broker] = b
}

// A host's sessions end a transaction left idle longer than the lease TTL
// (at least 5 s), so a stalled host's locks (a positions row, a category's
// append lock, the relay's claim lock) do not outlive its leases.
func TestPoolBoundsIdleTransactions(t *testing.T) {
	cfg := config.Default()
	url := testserver.Postgres(t)
	cfg.Databases[config.DefaultName] = config.Database{Provider: config.ProviderPostgreSQL, DatabaseURI: url}
	cfg.EventStore = config.EventStore{Provider: config.ProviderMessageDB, DatabaseURI: url}
	pool, err := openPool(context.Background(), cfg)
	require.NoError(t, err)
	defer pool.Close()
	var v string
	require.NoError(t, pool.QueryRow(context.Background(), "SHOW idle_in_transaction_session_timeout").Scan(&v))
	require.Equal(t, "15s", v, "the default lease TTL")

	cfg.Server.Partitioning.LeaseTTLMS = 2000
	pool2, err := openPool(context.Background(), cfg)
	require.NoError(t, err)
	defer pool2.Close()
	require.NoError(t, pool2.QueryRow(context.Background(), "SHOW idle_in_transaction_session_timeout").Scan(&v))
	require.Equal(t, "5s", v, "never below 5 s")
}

// A host that dies in the middle of an idempotent command holds the
// command's key no longer than its other leases: the key's lease is the
// partition lease TTL (renewed every third of it while the command runs),
// not a fixed minute, during which every repeat of the command waited.
func TestIdempotencyLeaseIsTheLeaseTTL(t *testing.T) {
	cfg := config.Default()
	url := testserver.Postgres(t)
	cfg.Databases[config.DefaultName] = config.Database{Provider: config.ProviderPostgreSQL, DatabaseURI: url}
	cfg.EventStore = config.EventStore{Provider: config.ProviderMessageDB, DatabaseURI: url}
	cfg.Server.Partitioning.LeaseTTLMS = 2000
	pool, err := openPool(context.Background(), cfg)
	require.NoError(t, err)
	_, err = schema.Migrate(context.Background(), pool)
	pool.Close()
	require.NoError(t, err)
	st, err := openStores(context.Background(), cfg)
	require.NoError(t, err)
	defer st.close()
	pg, ok := st.idempotency.(*idempotency.Postgres)
	require.True(t, ok, "%T", st.idempotency)
	require.Equal(t, 2*time.Second, pg.Lease())
}
