package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/config"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/htmltest"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// pluginRow returns GET /v1/plugins' row of file, or nil.
func pluginRow(t *testing.T, h *testHost, file string) map[string]any {
	t.Helper()
	for _, p := range get(t, h, "/v1/plugins").body["plugins"].([]any) {
		if row := p.(map[string]any); row["file"] == file {
			return row
		}
	}
	return nil
}

// A reload tells what it did, in the log and in GET /v1/plugins and the
// status page: a changed module with its old and new version and digest,
// a rejected file that is not running with its error, "valid again" once
// it is gone, "unchanged" for a reload that finds nothing new.
func TestEmbeddedReloadTellsAndStatusPage(t *testing.T) {
	examples := wasmbuild.Examples(t)
	dir := t.TempDir()
	for _, name := range []string{"orders", "payments", "shipping", "fulfillment", "client_orders"} {
		wasmbuild.Copy(t, filepath.Join(examples, name+".wasm"), dir, name+".wasm")
	}
	h, err := startHostWith(t, "domain.toml", dir, func(c *config.Config) { c.Plugins.Watch = true })
	require.NoError(t, err)
	r := post(t, h, "PlaceOrder", `{"order_id":"o-1","client_id":"c-1","total":1}`)
	require.Equal(t, 200, r.code, r.raw)
	projected(t, h, "o-1 projected", "/v1/projections/client_orders/c-1?min_position=1")

	row := pluginRow(t, h, "client_orders.wasm")
	require.Equal(t, "running", row["state"])
	require.Equal(t, "1.0.0", row["version"])
	oldSHA := row["sha256"].(string)
	handler := row["handlers"].([]any)[0].(map[string]any)
	require.Equal(t, "projector", handler["kind"])
	require.Equal(t, []any{"order"}, handler["categories"])
	require.Equal(t, map[string]any{"order": "client_id"}, handler["partition_keys"])
	require.Equal(t, true, handler["documents_by_key"])
	require.Equal(t, "key", handler["read_your_writes"], "a read of one client's document waits for that client's partition only")

	// SIGHUP with nothing changed (run's SIGHUP calls Reload).
	h.reloader.Reload(context.Background())
	require.Contains(t, h.logs.String(), `msg="plugins unchanged"`)

	// A new version, renamed into place.
	v2 := wasmbuild.Build(t, "./plugins/examples/client_orders", "version=1.0.1")
	tmp := wasmbuild.Copy(t, v2, dir, "client_orders.wasm.new")
	require.NoError(t, os.Rename(tmp, filepath.Join(dir, "client_orders.wasm")))
	eventually(t, h, "version 1.0.1 served", func() (bool, string) {
		row = pluginRow(t, h, "client_orders.wasm")
		return row["version"] == "1.0.1", get(t, h, "/v1/plugins").raw
	})
	newSHA := row["sha256"].(string)
	require.NotEqual(t, oldSHA, newSHA)
	// The reload applies the new set before it logs and records its
	// status, so /v1/plugins can show 1.0.1 a moment before either: wait
	// for them.
	changed := regexp.MustCompile(`msg="plugin changed" file=client_orders.wasm module=client_orders old_version=1.0.0 new_version=1.0.1 old_sha256=` + oldSHA + ` new_sha256=` + newSHA)
	reloaded := regexp.MustCompile(`msg="plugins reloaded" dir=\S+ modules=5 changed=1 took=\S+`)
	eventually(t, h, "the reload logged and recorded", func() (bool, string) {
		last, _ := get(t, h, "/v1/plugins").body["last_reload"].(map[string]any)
		logs := h.logs.String()
		return changed.MatchString(logs) && reloaded.MatchString(logs) && last["outcome"] == "applied",
			fmt.Sprintf("last_reload %v", last)
	})
	last := get(t, h, "/v1/plugins").body["last_reload"].(map[string]any)
	require.Positive(t, last["took_ms"])

	// A bad file: rejected, listed with its error though not running.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "junk.wasm"), []byte("junk"), 0o644))
	eventually(t, h, "junk.wasm listed as rejected", func() (bool, string) {
		row = pluginRow(t, h, "junk.wasm")
		return row != nil && row["state"] == "rejected", get(t, h, "/v1/plugins").raw
	})
	require.Contains(t, row["last_error"], "not a WebAssembly module")
	page := get(t, h, "/")
	require.Equal(t, 200, page.code)
	doc, err := htmltest.Parse(strings.NewReader(page.raw))
	require.NoError(t, err)
	junk := doc.All("plugin", "data-file", "junk.wasm")
	require.Len(t, junk, 1, page.raw)
	require.Equal(t, "rejected", junk[0].Cells()[4])
	require.Contains(t, junk[0].Cells()[5], "not a WebAssembly module")
	co := doc.All("plugin", "data-file", "client_orders.wasm")
	require.Len(t, co, 1)
	require.Equal(t, []string{"client_orders.wasm", "client_orders", "1.0.1", newSHA[:12], "running", ""}, co[0].Cells())
	hr := doc.All("handler", "data-handler", "client_orders")
	require.Len(t, hr, 1)
	require.Equal(t, []string{"client_orders", "projector", "client_orders.wasm", "order", "order by client_id", "OrderPlaced"}, hr[0].Cells())
	cons := doc.All("consumer", "data-group", "client_orders")
	require.Len(t, cons, 1)
	require.Equal(t, []string{"client_orders", "order", "inline", "0", "0"}, cons[0].Cells())
	require.Equal(t, "1 published", doc.All("stat", "data-status", "published")[0].AllText())
	require.Empty(t, doc.All("partition"), "no partitions on the inline broker")

	require.NoError(t, os.Remove(filepath.Join(dir, "junk.wasm")))
	eventually(t, h, "the directory valid again", func() (bool, string) {
		return strings.Contains(h.logs.String(), `msg="plugins directory valid again"`) && pluginRow(t, h, "junk.wasm") == nil, h.logs.Tail(5)
	})

}

// TestValidateAndStatusPageAgreeOnPartitionKeys: `validate` and the status
// page show each handler's categories and partition keys alike (one
// derivation, host.Set.Partitioning), a command handler's too: validate
// showed "-" for orders while the page showed "order by client_id".
func TestValidateAndStatusPageAgreeOnPartitionKeys(t *testing.T) {
	dir := wasmbuild.Examples(t)
	code, out, errs := cli(t, "validate", "--config", configFile(t, "inline"), "--plugins", dir)
	require.Equal(t, 0, code, errs)
	validated := map[string][]string{} // handler -> category, key
	cols := regexp.MustCompile(`\s{2,}`)
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := cols.Split(line, -1)
		if len(f) == 6 && f[0] != "MODULE FILE" {
			validated[f[2]] = []string{f[4], f[5]}
		}
	}
	require.Equal(t, []string{"order", "order by client_id"}, validated["orders"], out)

	h, err := startHostWith(t, "domain.toml", dir, nil)
	require.NoError(t, err)
	page := get(t, h, "/")
	require.Equal(t, 200, page.code)
	doc, err := htmltest.Parse(strings.NewReader(page.raw))
	require.NoError(t, err)
	require.Len(t, validated, 5, out)
	for handler, want := range validated {
		rows := doc.All("handler", "data-handler", handler)
		require.Len(t, rows, 1, handler)
		cells := rows[0].Cells()
		require.Equal(t, want, []string{strings.ReplaceAll(cells[3], "—", "-"), strings.ReplaceAll(cells[4], "—", "-")},
			"handler %s: validate and the status page differ", handler)
	}
}

// A deploy per tenant at the API (issue 21): in one reload tenant
// billing's payments.wasm goes bad while tenant lab's client_orders.wasm
// gets a new version. Lab's version is live; billing's row keeps its
// running version and shows the rejection, naming billing.
func TestEmbeddedOneTenantsBadDeployDoesNotHoldBackAnothers(t *testing.T) {
	examples := wasmbuild.Examples(t)
	dir := t.TempDir()
	for _, name := range []string{"payments", "client_orders"} {
		wasmbuild.Copy(t, filepath.Join(examples, name+".wasm"), dir, name+".wasm")
	}
	h, err := startHostWith(t, "domain.toml", dir, func(c *config.Config) {
		c.Tenants = map[string]config.Tenant{"billing": {Modules: []string{"payments"}}, "lab": {Modules: []string{"client_orders"}}}
	})
	require.NoError(t, err)
	payments := pluginRow(t, h, "payments.wasm")
	require.Equal(t, "billing", payments["tenant"])

	require.NoError(t, os.WriteFile(filepath.Join(dir, "payments.wasm.new"), []byte("junk"), 0o644))
	require.NoError(t, os.Rename(filepath.Join(dir, "payments.wasm.new"), filepath.Join(dir, "payments.wasm")))
	v2 := wasmbuild.Build(t, "./plugins/examples/client_orders", "version=1.0.1")
	tmp := wasmbuild.Copy(t, v2, dir, "client_orders.wasm.new")
	require.NoError(t, os.Rename(tmp, filepath.Join(dir, "client_orders.wasm")))
	out, errs := h.reloader.Reload(context.Background())
	require.Equal(t, host.Partial, out, "%v", errs)

	co := pluginRow(t, h, "client_orders.wasm")
	require.Equal(t, "1.0.1", co["version"], "lab's deploy is live")
	require.Equal(t, "lab", co["tenant"])
	require.Nil(t, co["rejected"])
	row := pluginRow(t, h, "payments.wasm")
	require.Equal(t, "running", row["state"])
	require.Equal(t, payments["sha256"], row["sha256"], "billing's running version keeps serving")
	rejected := row["rejected"].(map[string]any)
	require.Equal(t, "payments.wasm", rejected["file"])
	require.Equal(t, "billing", rejected["tenant"], "the rejection names its tenant")
	require.Contains(t, rejected["error"], "payments.wasm: not a WebAssembly module")
}

// One bad file does not hide a good edit (issue 38): while payments.wasm
// holds bytes that do not load, a new version of client_orders.wasm goes
// live; GET /v1/plugins and the status page show the rejection on the
// payments row (its running version beside it) until a version of the
// file loads again.
func TestEmbeddedBadFileDoesNotHideAGoodEdit(t *testing.T) {
	examples := wasmbuild.Examples(t)
	dir := t.TempDir()
	for _, name := range []string{"orders", "payments", "shipping", "fulfillment", "client_orders"} {
		wasmbuild.Copy(t, filepath.Join(examples, name+".wasm"), dir, name+".wasm")
	}
	h, err := startHostWith(t, "domain.toml", dir, nil)
	require.NoError(t, err)
	ctx := context.Background()
	payments := pluginRow(t, h, "payments.wasm")
	require.Nil(t, payments["rejected"])

	junk := []byte("junk")
	sum := sha256.Sum256(junk)
	junkSHA := hex.EncodeToString(sum[:])
	require.NoError(t, os.WriteFile(filepath.Join(dir, "payments.wasm.new"), junk, 0o644))
	require.NoError(t, os.Rename(filepath.Join(dir, "payments.wasm.new"), filepath.Join(dir, "payments.wasm")))
	out, _ := h.reloader.Reload(ctx)
	require.Equal(t, host.Rejected, out)

	v2 := wasmbuild.Build(t, "./plugins/examples/client_orders", "version=1.0.1")
	tmp := wasmbuild.Copy(t, v2, dir, "client_orders.wasm.new")
	require.NoError(t, os.Rename(tmp, filepath.Join(dir, "client_orders.wasm")))
	out, errs := h.reloader.Reload(ctx)
	require.Equal(t, host.Partial, out, "%v", errs)

	body := get(t, h, "/v1/plugins").body
	require.Equal(t, "partial", body["last_reload"].(map[string]any)["outcome"])
	co := pluginRow(t, h, "client_orders.wasm")
	require.Equal(t, "1.0.1", co["version"], "the edit is live")
	require.Nil(t, co["rejected"])
	row := pluginRow(t, h, "payments.wasm")
	require.Equal(t, "running", row["state"])
	require.Equal(t, payments["sha256"], row["sha256"], "the running version keeps serving")
	rejected := row["rejected"].(map[string]any)
	require.Equal(t, "payments.wasm", rejected["file"])
	require.Equal(t, junkSHA, rejected["sha256"])
	require.Contains(t, rejected["error"], "not a WebAssembly module")
	require.NotEmpty(t, rejected["at"])
	require.Equal(t, rejected["error"], row["last_error"])

	page := get(t, h, "/")
	doc, err := htmltest.Parse(strings.NewReader(page.raw))
	require.NoError(t, err)
	pr := doc.All("plugin", "data-file", "payments.wasm")
	require.Len(t, pr, 1, page.raw)
	cells := pr[0].Cells()
	require.Equal(t, "running rejected", cells[4])
	require.Contains(t, cells[5], "not a WebAssembly module")
	require.Contains(t, cells[5], "sha256 "+junkSHA[:12])

	// The file back as it runs: nothing is rejected any more.
	wasmbuild.Copy(t, filepath.Join(examples, "payments.wasm"), dir, "payments.wasm")
	out, errs = h.reloader.Reload(ctx)
	require.Equal(t, host.Unchanged, out, "%v", errs)
	require.Nil(t, pluginRow(t, h, "payments.wasm")["rejected"])
}

// Each tenant's use of the guests shows on the status page and in
// /metrics (issue 21, "visible per tenant"): its modules, calls, queue
// wait, guest time, instances, guest memory and compiled code. Tenant
// shop's command ran in its orders instance; tenant billing made no
// call, so it holds no instance and no guest memory, but its module's
// compiled code is loaded (once the start's background compiles ended).
func TestStatusPageAndMetricsShowEachTenantsUse(t *testing.T) {
	examples := wasmbuild.Examples(t)
	dir := t.TempDir()
	for _, name := range []string{"orders", "client_orders", "payments"} {
		wasmbuild.Copy(t, filepath.Join(examples, name+".wasm"), dir, name+".wasm")
	}
	h, err := startHostWith(t, "domain.toml", dir, func(c *config.Config) {
		c.Tenants = map[string]config.Tenant{"shop": {Modules: []string{"orders", "client_orders"}}, "billing": {Modules: []string{"payments"}}}
	})
	require.NoError(t, err)
	r := post(t, h, "PlaceOrder", `{"order_id":"o-1","client_id":"c-1","total":1}`)
	require.Equal(t, 200, r.code, r.raw)
	warmedUp(t, h)

	page := get(t, h, "/")
	require.Equal(t, 200, page.code)
	doc, err := htmltest.Parse(strings.NewReader(page.raw))
	require.NoError(t, err)
	shop := doc.All("tenant", "data-tenant", "shop")
	require.Len(t, shop, 1, page.raw)
	cells := shop[0].Cells()
	require.Len(t, cells, 8)
	require.Equal(t, "client_orders.wasm, orders.wasm", cells[1])
	require.NotEqual(t, "0", cells[2], "shop's calls")
	require.Regexp(t, `^p95 ≤ \d+\.\d{3}s · \d+\.\d{3}s$`, cells[3], "shop's queue wait")
	require.Regexp(t, `^\d+\.\d{3}s$`, cells[4], "shop's guest time")
	require.Regexp(t, `^[1-9]\d* / \d+$`, cells[5], "shop's instances live / idle")
	require.Regexp(t, `^\d+\.\d (KiB|MiB|GiB)$`, cells[6], "shop's guest memory")
	require.Regexp(t, `^\d+\.\d (MiB|GiB)$`, cells[7], "shop's compiled code")
	billing := doc.All("tenant", "data-tenant", "billing")
	require.Len(t, billing, 1, page.raw)
	cells = billing[0].Cells()
	require.Equal(t, []string{"billing", "payments.wasm", "0"}, cells[:3])
	require.Equal(t, []string{"0.000s", "0 / 0", "0 B"}, cells[4:7], "no call, no instance")
	require.Regexp(t, `^\d+\.\d (MiB|GiB)$`, cells[7], "billing's compiled code")

	m := get(t, h, "/metrics").raw
	nonZero := func(name, labels string) {
		t.Helper()
		line := metricLines(m, name+"{"+labels+"} ")
		require.NotEmpty(t, line, "%s{%s} in /metrics", name, labels)
		require.NotRegexp(t, ` 0$`, line)
	}
	nonZero("protean_tenant_guest_seconds_total", `tenant="shop"`)
	nonZero("protean_tenant_instances", `state="live",tenant="shop"`)
	nonZero("protean_tenant_guest_memory_bytes", `tenant="shop"`)
	nonZero("protean_tenant_compiled_code_estimated_bytes", `tenant="shop"`)
	nonZero("protean_tenant_compiled_code_estimated_bytes", `tenant="billing"`)
	nonZero("protean_module_guest_seconds_total", `module="orders.wasm"`)
	nonZero("protean_module_guest_memory_bytes", `module="orders.wasm"`)
	require.Contains(t, m, `protean_tenant_guest_memory_bytes{tenant="billing"} 0`)
	require.Contains(t, m, `protean_tenant_guest_seconds_total{tenant="billing"} 0`)
	require.Contains(t, m, `protean_tenant_core_waits_total{tenant="billing"} 0`)
	require.Contains(t, m, `protean_tenant_core_wait_seconds_total{tenant="billing"} 0`)
}
