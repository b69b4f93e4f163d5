package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/config"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// reloads returns how many reloads had outcome, from /metrics.
func reloads(t *testing.T, h *testHost, outcome string) int {
	t.Helper()
	m := regexp.MustCompile(`protean_plugin_reloads_total\{outcome="` + outcome + `"\} (\d+)`).FindStringSubmatch(get(t, h, "/metrics").raw)
	if m == nil {
		return 0
	}
	n, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	return n
}

// waitReloads waits until more reloads than before had outcome.
func waitReloads(t *testing.T, h *testHost, what, outcome string, before int) {
	t.Helper()
	eventually(t, h, what, func() (bool, string) {
		n := reloads(t, h, outcome)
		return n > before, fmt.Sprintf("%d reloads %s (%d before)", n, outcome, before)
	})
}

// plugins counts the running modules (GET /v1/plugins also lists files
// a reload rejected).
func plugins(t *testing.T, h *testHost) int {
	t.Helper()
	n := 0
	for _, p := range get(t, h, "/v1/plugins").body["plugins"].([]any) {
		if p.(map[string]any)["state"] == "running" {
			n++
		}
	}
	return n
}

// waitPlugins waits until n modules are loaded.
func waitPlugins(t *testing.T, h *testHost, what string, n int) {
	t.Helper()
	eventually(t, h, what, func() (bool, string) {
		got := plugins(t, h)
		return got == n, fmt.Sprintf("%d modules loaded, want %d", got, n)
	})
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
	waitPlugins(t, h, "the projector loaded", 5)
	require.Equal(t, 200, post(t, h, "PlaceOrder", `{"order_id":"o-2","client_id":"c-2","total":2}`).code)
	projected(t, h, "c-2 projected by the new module", "/v1/projections/client_orders/c-2")
	// A new consumer group on the inline broker starts at the stream's
	// first message, so the order placed before the module came is
	// projected too.
	projected(t, h, "c-1 projected from the start of the stream", "/v1/projections/client_orders/c-1")

	// A bad file is refused as a whole; the running set keeps serving.
	rejected := reloads(t, h, "rejected") // a partly copied file may have been rejected already
	require.NoError(t, os.WriteFile(filepath.Join(dir, "junk.wasm"), []byte("junk"), 0o644))
	waitReloads(t, h, "the junk rejected", "rejected", rejected)
	require.Equal(t, 5, plugins(t, h))
	require.Equal(t, 200, post(t, h, "PlaceOrder", `{"order_id":"o-3","client_id":"c-3","total":3}`).code)
	projected(t, h, "c-3 projected while the directory is invalid", "/v1/projections/client_orders/c-3")
	unchanged := reloads(t, h, "unchanged")
	require.NoError(t, os.Remove(filepath.Join(dir, "junk.wasm")))
	waitReloads(t, h, "the directory back to the running set", "unchanged", unchanged)

	// Removing a module removes its handlers.
	require.NoError(t, os.Remove(filepath.Join(dir, "client_orders.wasm")))
	waitPlugins(t, h, "the projector unloaded", 4)
	require.Equal(t, 404, get(t, h, "/v1/projections/client_orders/c-2").code)
	require.Equal(t, 200, post(t, h, "PlaceOrder", `{"order_id":"o-4","client_id":"c-4","total":4}`).code)
	require.Equal(t, 2, reloads(t, h, "applied"), "the addition and the removal; a partly written file is only ever rejected")
}
