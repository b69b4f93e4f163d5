package httpapi_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/htmltest"
	"github.com/proteanhq/protean-host/internal/httpapi"
)

func parseHTML(t *testing.T, r io.Reader) *htmltest.Node {
	t.Helper()
	doc, err := htmltest.Parse(r)
	require.NoError(t, err)
	return doc
}

type fakeStatus struct{ snap httpapi.Snapshot }

func (f fakeStatus) Status(context.Context) (httpapi.Snapshot, error) { return f.snap, nil }

func TestStatusPageRendersEverySection(t *testing.T) {
	st := fakeStatus{httpapi.Snapshot{
		Reload: &host.ReloadStatus{At: time.Now(), Outcome: host.Rejected, Took: 42 * time.Millisecond,
			Problems: []host.FileProblem{{File: "junk.wasm", Error: "junk.wasm: not a WebAssembly module: bad magic number <script>"}},
			Rejected: []host.Rejection{{File: "junk.wasm", SHA256: "0123456789abcdef", At: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
				Error: "junk.wasm: not a WebAssembly module: bad magic number <script>"}}},
		Consumers: []httpapi.Consumer{{Group: "client_orders", Source: "order", Path: "inline", Lag: 3, Failures: 1}},
		Outbox: &httpapi.Outbox{Counts: map[string]int{"pending": 2, "published": 40, "abandoned": 0}, OldestPending: 1500 * time.Millisecond,
			RelayLeases: []httpapi.RelayLease{{Broker: "default", Owner: "h1:7", Left: 3200 * time.Millisecond}, {Broker: "audit", Owner: "h2:9", Left: -12 * time.Second}}},
		Partitions: &httpapi.Partitions{Owned: []httpapi.Unit{{Group: "client_orders", Unit: "order:c-1", Owner: "h1:7", Generation: 3}}, Halted: []httpapi.Unit{{Group: "fulfillment", Unit: "fulfillment:o-9", Reason: "max retries", Pending: 2, HaltGeneration: 1, Attempts: 4}}},
		Tenants: []host.TenantStats{
			{Tenant: "shop", Modules: []string{"client_orders.wasm", "orders.wasm"}, Live: 3, Idle: 2, Calls: 40, GuestSeconds: 1.25,
				GuestMemoryBytes: 48 << 20, CodeBytes: 33 << 20,
				Share: &host.ShareStats{Calls: 40, GaveUp: 2, WaitSeconds: 0.5, Waits: [len(host.WaitBuckets) + 1]int64{30, 8, 2}}},
			{Tenant: "lab", Modules: []string{"behave.wasm"}, CodeBytes: 512 << 10},
		},
	}}
	srv := httptest.NewServer(httpapi.New(&fakeEngine{}, httpapi.Options{Status: st}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "text/html; charset=utf-8", resp.Header.Get("Content-Type"))
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Contains(t, string(body), `<meta http-equiv="refresh" content="5">`)
	require.NotContains(t, string(body), "<script>", "values are escaped")
	require.NotContains(t, string(body), "<script", "no JavaScript")
	doc := parseHTML(t, strings.NewReader(string(body)))

	rows := doc.All("plugin", "data-file", "junk.wasm")
	require.Len(t, rows, 1)
	require.Equal(t, []string{"junk.wasm", "", "", "", "rejected", "junk.wasm: not a WebAssembly module: bad magic number <script> (sha256 0123456789ab since 03:04:05)"}, rows[0].Cells())
	c := doc.All("consumer", "data-group", "client_orders")
	require.Len(t, c, 1)
	require.Equal(t, []string{"client_orders", "order", "inline", "3", "1"}, c[0].Cells())
	require.Equal(t, "40 published", doc.All("stat", "data-status", "published")[0].AllText())
	require.Equal(t, "2s oldest pending", doc.All("stat", "data-status", "oldest_pending")[0].AllText())
	require.Equal(t, "Relay lease of broker default: h1:7 claims its rows (3s left unless renewed)", doc.All("lease", "data-broker", "default")[0].AllText())
	require.Equal(t, "Relay lease of broker audit: free (h2:9's lapsed 12s ago; the next relay to try takes it)", doc.All("lease", "data-broker", "audit")[0].AllText())
	halted := doc.All("partition", "data-state", "halted")
	require.Len(t, halted, 1)
	require.Equal(t, []string{"fulfillment", "fulfillment:o-9", "halted", "-", "-", "2", "0", "max retries (after 4 attempt(s), generation 1)"}, halted[0].Cells())
	shop := doc.All("tenant", "data-tenant", "shop")
	require.Len(t, shop, 1)
	require.Equal(t, []string{"shop", "client_orders.wasm, orders.wasm", "40", "p95 ≤ 0.005s · 0.500s · 2 gave up", "1.250s", "3 / 2", "48.0 MiB", "33.0 MiB"}, shop[0].Cells())
	lab := doc.All("tenant", "data-tenant", "lab")
	require.Len(t, lab, 1)
	require.Equal(t, []string{"lab", "behave.wasm", "0", "not shared", "0.000s", "0 / 0", "0 B", "512.0 KiB"}, lab[0].Cells())
	owned := doc.All("partition", "data-state", "owned")
	require.Len(t, owned, 1)
	require.Equal(t, []string{"client_orders", "order:c-1", "owned", "h1:7", "3", "0", "0", ""}, owned[0].Cells())
}

// TestStatusPageShowsVersionAndUptime: the page's header and GET
// /v1/plugins say which build runs and since when.
func TestStatusPageShowsVersionAndUptime(t *testing.T) {
	started := time.Now().Add(-90 * time.Second)
	srv := httptest.NewServer(httpapi.New(&fakeEngine{}, httpapi.Options{Version: "v1.4.0 go1.26.8", Started: started}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/")
	require.NoError(t, err)
	defer resp.Body.Close()
	doc := parseHTML(t, resp.Body)
	require.Equal(t, "version v1.4.0 go1.26.8", doc.All("version")[0].AllText())
	require.Regexp(t, `^up 1m3\ds$`, doc.All("uptime")[0].AllText())

	r, err := http.Get(srv.URL + "/v1/plugins")
	require.NoError(t, err)
	defer r.Body.Close()
	var plugins struct {
		Host struct {
			Version       string    `json:"version"`
			Started       time.Time `json:"started"`
			UptimeSeconds float64   `json:"uptime_seconds"`
		} `json:"host"`
	}
	require.NoError(t, json.NewDecoder(r.Body).Decode(&plugins))
	require.Equal(t, "v1.4.0 go1.26.8", plugins.Host.Version)
	require.True(t, plugins.Host.Started.Equal(started.UTC().Truncate(time.Nanosecond)), "%s", plugins.Host.Started)
	require.GreaterOrEqual(t, plugins.Host.UptimeSeconds, 90.0)
}
