package main

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/config"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// Each running module's instances show in GET /v1/plugins and as
// metrics, with each reason an instance was thrown away: here "idle", an
// instance closed after plugins.limits.instance_idle_ms unused; and its
// compiled code released after code_idle_ms, and loaded again by the
// next call.
func TestModuleInstancesShow(t *testing.T) {
	t.Parallel()
	h, err := startHostWith(t, "domain.toml", wasmbuild.Examples(t), func(c *config.Config) {
		c.Plugins.Limits.InstanceIdleMS = 20
		c.Plugins.Limits.CodeIdleMS = 40
	})
	require.NoError(t, err)
	r := post(t, h, "PlaceOrder", `{"order_id":"o-1","client_id":"c-1","total":42.5}`)
	require.Equal(t, 200, r.code, r.raw)

	eventually(t, h, "the orders module's instance closed idle", func() (bool, string) {
		p := get(t, h, "/v1/plugins")
		var body struct {
			Plugins []struct {
				File      string             `json:"file"`
				Instances host.InstanceStats `json:"instances"`
			} `json:"plugins"`
		}
		if err := json.Unmarshal([]byte(p.raw), &body); err != nil {
			return false, p.String()
		}
		for _, m := range body.Plugins {
			if m.File == "orders.wasm" {
				st := m.Instances
				return st.Created >= 1 && st.Live == 0 && st.Discarded["idle"] == st.Created && st.CodeReleased >= 1 && !st.CodeLoaded,
					fmt.Sprintf("%+v", st)
			}
		}
		return false, p.String()
	})
	m := get(t, h, "/metrics")
	require.Equal(t, 200, m.code)
	lines := metricLines(m.raw, "protean_module_instances_discarded_total")
	require.Contains(t, lines, `protean_module_instances_discarded_total{module="orders.wasm",reason="idle"} `)
	require.NotContains(t, lines, `{module="orders.wasm",reason="idle"} 0`)
	require.Contains(t, metricLines(m.raw, "protean_module_instances{"), `protean_module_instances{module="orders.wasm",state="live"} 0`)
	require.Contains(t, metricLines(m.raw, "protean_module_code_released_total"), `protean_module_code_released_total{module="orders.wasm"} `)
	require.NotContains(t, metricLines(m.raw, "protean_module_code_released_total"), `{module="orders.wasm"} 0`)

	// The next call compiles the released code again, and succeeds.
	r = post(t, h, "PlaceOrder", `{"order_id":"o-2","client_id":"c-1","total":1}`)
	require.Equal(t, 200, r.code, r.raw)
	m = get(t, h, "/metrics")
	require.NotContains(t, metricLines(m.raw, "protean_module_code_loads_total"), `{module="orders.wasm"} 0`)
	require.Contains(t, metricLines(m.raw, "protean_module_code_loads_total"), `protean_module_code_loads_total{module="orders.wasm"} `)
}

// instance_idle_ms = 0 keeps idle instances: host.Limits' zero would take
// the default, so it is passed on as negative.
func TestInstanceIdleZeroKeepsInstances(t *testing.T) {
	t.Parallel()
	require.Negative(t, instanceIdle(config.Limits{InstanceIdleMS: 0}))
	require.Equal(t, host.DefaultLimits().InstanceIdle, instanceIdle(config.Default().Plugins.Limits))
}
