package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/httpapi"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// TestPoolsShowOnServers: on PostgreSQL and Redis, GET /v1/plugins, the
// status page and /metrics show each connection pool's size, use and
// waits; the embedded host has none.
func TestPoolsShowOnServers(t *testing.T) {
	d := newRedisDeployment(t)
	h, err := startHostWith(t, "production.toml", wasmbuild.Examples(t), d.fastLeases)
	require.NoError(t, err)
	require.Equal(t, 200, post(t, h, "PlaceOrder", `{"order_id":"o-1","client_id":"c-1","total":1}`).code)
	var out struct {
		Pools []httpapi.Pool `json:"pools"`
	}
	require.NoError(t, json.Unmarshal([]byte(get(t, h, "/v1/plugins").raw), &out))
	require.Len(t, out.Pools, 2)
	pg, rd := out.Pools[0], out.Pools[1]
	require.Equal(t, "postgres", pg.Name)
	require.EqualValues(t, defaultPoolMaxConns, pg.Max)
	require.Positive(t, pg.Acquires, "the command took a connection")
	require.Equal(t, "redis", rd.Name)
	require.Positive(t, rd.Max)
	require.Positive(t, rd.Acquires)

	m := get(t, h, "/metrics").raw
	for _, want := range []string{`protean_pool_connections{pool="postgres",state="max"} 16`, `protean_pool_waits_total{pool="postgres"}`,
		`protean_pool_wait_seconds_total{pool="redis"}`, `protean_pool_timeouts_total{pool="redis"}`} {
		require.Contains(t, m, want)
	}
	require.Contains(t, get(t, h, "/").raw, `data-pool="postgres"`)

	e := embedded(t, wasmbuild.Examples(t))
	require.NotContains(t, get(t, e, "/v1/plugins").raw, `"pools"`)
	require.False(t, strings.Contains(get(t, e, "/metrics").raw, "protean_pool_connections{"))
}
