package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/config"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// reloads returns how many reloads had outcome, from /metrics.
func reloads(t *testing.T, h *hostProcess, outcome string) int {
	m := regexp.MustCompile(`protean_plugin_reloads_total\{outcome="` + outcome + `"\} (\d+)`).FindStringSubmatch(get(t, h, "/metrics").raw)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

func plugins(t *testing.T, h *hostProcess) int {
	return len(get(t, h, "/v1/plugins").body["plugins"].([]any))
}

func TestEmbeddedHotReload(t *testing.T) {
	examples := wasmbuild.Examples(t)
	dir := t.TempDir()
	for _, name := range []string{"orders", "payments", "shipping", "fulfillment"} {
		wasmbuild.Copy(t, filepath.Join(examples, name+".wasm"), dir, name+".wasm")
	}
	h, err := startHostWith(t, "domain.toml", dir, func(c *config.Config) { c.Plugins.Watch = true })
	require.NoError(t, err)

	require.Equal(t, 200, post(t, h, "PlaceOrder", `{"order_id":"o-1","client_id":"c-1","total":1}`).code)
	require.Equal(t, 404, get(t, h, "/v1/projections/client_orders/c-1").code, "no projector yet")

	// Dropping a module in adds it, with its consumers, without a restart.
	wasmbuild.Copy(t, filepath.Join(examples, "client_orders.wasm"), dir, "client_orders.wasm")
	eventually(t, "the projector loaded", func() bool { return plugins(t, h) == 5 })
	require.Equal(t, 200, post(t, h, "PlaceOrder", `{"order_id":"o-2","client_id":"c-2","total":2}`).code)
	eventually(t, "c-2 projected by the new module", func() bool {
		return get(t, h, "/v1/projections/client_orders/c-2").code == 200
	})
	// A new consumer group on the inline broker starts at the stream's
	// first message, so the order placed before the module came is
	// projected too.
	eventually(t, "c-1 projected from the start of the stream", func() bool {
		return get(t, h, "/v1/projections/client_orders/c-1").code == 200
	})

	// A bad file is refused as a whole; the running set keeps serving.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "junk.wasm"), []byte("junk"), 0o644))
	eventually(t, "the junk rejected", func() bool { return reloads(t, h, "rejected") >= 1 })
	require.Equal(t, 5, plugins(t, h))
	require.Equal(t, 200, post(t, h, "PlaceOrder", `{"order_id":"o-3","client_id":"c-3","total":3}`).code)
	eventually(t, "c-3 projected while the directory is invalid", func() bool {
		return get(t, h, "/v1/projections/client_orders/c-3").code == 200
	})
	require.NoError(t, os.Remove(filepath.Join(dir, "junk.wasm")))
	eventually(t, "the directory back to the running set", func() bool { return reloads(t, h, "unchanged") >= 1 })

	// Removing a module removes its handlers.
	require.NoError(t, os.Remove(filepath.Join(dir, "client_orders.wasm")))
	eventually(t, "the projector unloaded", func() bool { return plugins(t, h) == 4 })
	require.Equal(t, 404, get(t, h, "/v1/projections/client_orders/c-2").code)
	require.Equal(t, 200, post(t, h, "PlaceOrder", `{"order_id":"o-4","client_id":"c-4","total":4}`).code)
	require.Equal(t, 2, reloads(t, h, "applied"), "the addition and the removal; a partly written file is only ever rejected")
}
