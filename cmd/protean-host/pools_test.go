package main

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/config"
	"github.com/proteanhq/protean-host/internal/httpapi"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// TestPoolsShowOnServers: on PostgreSQL and Redis, GET /v1/plugins, the
// status page and /metrics show each connection pool's size, use and
// waits; the embedded host has none.
func TestPoolsShowOnServers(t *testing.T) {
	d := newRedisDeployment(t)
	var cfg config.Config
	h, err := startHostWith(t, "production.toml", wasmbuild.Examples(t), func(c *config.Config) { d.fastLeases(c); cfg = *c })
	require.NoError(t, err)
	modules := countModules(cfg.Plugins.Dir)
	require.Positive(t, modules)
	require.Equal(t, 200, post(t, h, "PlaceOrder", `{"order_id":"o-1","client_id":"c-1","total":1}`).code)
	var out struct {
		Pools []httpapi.Pool `json:"pools"`
	}
	require.NoError(t, json.Unmarshal([]byte(get(t, h, "/v1/plugins").raw), &out))
	require.Len(t, out.Pools, 2)
	pg, rd := out.Pools[0], out.Pools[1]
	require.Equal(t, "postgres", pg.Name)
	conn, err := pgx.Connect(t.Context(), d.dbURL)
	require.NoError(t, err)
	defer conn.Close(t.Context())
	var open int
	require.NoError(t, conn.QueryRow(t.Context(), `SELECT current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int`).Scan(&open))
	require.EqualValues(t, min(16, open/4), pg.Max, "derived, within the server's share")
	require.Positive(t, pg.Acquires, "the command took a connection")
	require.Equal(t, "redis", rd.Name)
	require.EqualValues(t, redisPoolSize(modules, runtime.GOMAXPROCS(0)), rd.Max, "derived")
	require.Positive(t, rd.Acquires)

	m := get(t, h, "/metrics").raw
	for _, want := range []string{fmt.Sprintf(`protean_pool_connections{pool="postgres",state="max"} %d`, pg.Max), `protean_pool_waits_total{pool="postgres"}`,
		`protean_pool_wait_seconds_total{pool="redis"}`, `protean_pool_timeouts_total{pool="redis"}`} {
		require.Contains(t, m, want)
	}
	require.Contains(t, get(t, h, "/").raw, `data-pool="postgres"`)

	e := embedded(t, wasmbuild.Examples(t))
	require.NotContains(t, get(t, e, "/v1/plugins").raw, `"pools"`)
	require.False(t, strings.Contains(get(t, e, "/metrics").raw, "protean_pool_connections{"))
}

// The PostgreSQL pool is 16 (within the server's share); the Redis pool
// is go-redis's 10 per CPU, plus room for each module's blocked reader and
// the partition listener.
func TestDerivePools(t *testing.T) {
	t.Parallel()
	require.Equal(t, 16, defaultPostgresPool)
	require.Equal(t, 20+5+1, redisPoolSize(5, 2))
	require.Equal(t, 80+100+1, redisPoolSize(100, 8))
}
