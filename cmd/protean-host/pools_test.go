package main

import (
	"encoding/json"
	"fmt"
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
	sizes := hostPools(cfg)
	require.Positive(t, sizes.modules)
	require.Equal(t, sizes.modules*16, sizes.instances, "production.toml: max_instances = 16")
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
	require.EqualValues(t, min(sizes.postgres, open/4), pg.Max, "derived, within the server's share")
	require.Positive(t, pg.Acquires, "the command took a connection")
	require.Equal(t, "redis", rd.Name)
	require.EqualValues(t, sizes.redis, rd.Max, "derived")
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

// The pools are sized from what may run at once: each module's instances
// (its tenant's max_instances, or one per CPU), plus room for reads and
// commits on PostgreSQL (within 16 to 64), and for blocked readers and the
// relay on Redis (at least go-redis's 10 per CPU).
func TestDerivePools(t *testing.T) {
	t.Parallel()
	cfg := config.Default()
	three := []string{"a", "b", "c"}
	p := derivePools(cfg, []string{"a"}, 2)
	require.Equal(t, poolSizes{postgres: 16, redis: 20, modules: 1, instances: 2}, p, "a small host: the floors")
	p = derivePools(cfg, three, 2)
	require.Equal(t, poolSizes{postgres: 16, redis: 2*6 + 3 + 8, modules: 3, instances: 6}, p)

	cfg.Plugins.Limits.MaxInstances = 8
	cfg.Tenants = map[string]config.Tenant{"acme": {Modules: []string{"c"}, MaxInstances: ptr(2)}}
	p = derivePools(cfg, three, 2)
	require.Equal(t, 18, p.instances, "8 + 8 + acme's 2")
	require.Equal(t, 18+8, p.postgres)
	require.Equal(t, 2*18+3+8, p.redis)

	cfg.Plugins.Limits.MaxInstances = 64
	p = derivePools(cfg, three, 2)
	require.Equal(t, 64, p.postgres, "at most 64")
	require.Equal(t, 2*130+3+8, p.redis)
}

func ptr[T any](v T) *T { return &v }

// GET /v1/plugins and /metrics show each module's instances: made on
// first use, kept across calls (a handler's rejection is an answer, not a
// failed call: the instance serves the next), and counted when thrown away.
func TestModuleInstancesShow(t *testing.T) {
	h := embedded(t, wasmbuild.Examples(t))
	for i := range 3 {
		require.Equal(t, 200, post(t, h, "PlaceOrder", fmt.Sprintf(`{"order_id":"o-%d","client_id":"c-1","total":1}`, i)).code)
	}
	require.Equal(t, 422, post(t, h, "CancelOrder", `{"order_id":"nope"}`).code)
	var out struct {
		Plugins []httpapi.Plugin `json:"plugins"`
	}
	require.NoError(t, json.Unmarshal([]byte(get(t, h, "/v1/plugins").raw), &out))
	var orders *httpapi.Plugin
	for i := range out.Plugins {
		if out.Plugins[i].File == "orders.wasm" {
			orders = &out.Plugins[i]
		}
	}
	require.NotNil(t, orders)
	require.NotNil(t, orders.Instances)
	st := *orders.Instances
	require.Positive(t, st.Created)
	require.LessOrEqual(t, st.Created, int64(st.Max))
	require.Equal(t, st.Created, int64(st.Live), "none thrown away")
	require.Equal(t, map[string]int64{"failed": 0, "memory": 0, "exited": 0}, st.Discarded, "a rejection keeps its instance")
	m := get(t, h, "/metrics").raw
	require.Contains(t, m, fmt.Sprintf(`protean_module_instances_created_total{module="orders.wasm"} %d`, st.Created))
	require.Contains(t, m, `protean_module_instances_discarded_total{module="orders.wasm",reason="failed"} 0`)
	require.Contains(t, m, fmt.Sprintf(`protean_module_instances{module="orders.wasm",state="max"} %d`, st.Max))
}
