package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/config"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// embedded starts a host on the embedded default config (memory stores,
// inline broker) over the plugins in dir, on a free port.
func embedded(t *testing.T, dir string) *hostProcess {
	t.Helper()
	h, err := startHost(t, "domain.toml", dir)
	require.NoError(t, err)
	return h
}

// startHost starts a host on one of the shipped configs over the plugins
// in dir, on a free port.
func startHost(t *testing.T, configName, dir string) (*hostProcess, error) {
	t.Helper()
	return startHostWith(t, configName, dir, nil)
}

// startHostWith is startHost with a change to the loaded config.
func startHostWith(t *testing.T, configName, dir string, change func(*config.Config)) (*hostProcess, error) {
	t.Helper()
	var stderr bytes.Buffer
	e := &env{stdout: io.Discard, stderr: &stderr, log: slog.New(slog.NewTextHandler(&stderr, nil))}
	require.NoError(t, e.parse(e.flags("run"), []string{"--config", filepath.Join(wasmbuild.Root(), "configs", configName), "--plugins", dir}))
	e.cfg.HTTP.Listen = "127.0.0.1:0"
	e.cfg.Plugins.CacheDir = wasmbuild.CacheDir(t) // shared: compile once
	if change != nil {
		change(&e.cfg)
	}
	h, err := start(context.Background(), e)
	if err != nil {
		return nil, fmt.Errorf("%w\n%s", err, stderr.String())
	}
	t.Cleanup(func() { require.NoError(t, h.shutdown()) })
	return h, nil
}

type reply struct {
	code int
	body map[string]any
	raw  string
}

func do(t *testing.T, method, url, body string) reply {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	r := reply{code: resp.StatusCode, raw: string(b)}
	_ = json.Unmarshal(b, &r.body)
	return r
}

func post(t *testing.T, h *hostProcess, typ, body string) reply {
	return do(t, "POST", "http://"+h.addr+"/v1/commands/"+typ, body)
}

func get(t *testing.T, h *hostProcess, path string) reply {
	return do(t, "GET", "http://"+h.addr+path, "")
}

// eventually polls cond until it holds or 10 s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestEmbeddedQuickstart(t *testing.T) {
	h := embedded(t, wasmbuild.Examples(t))
	r := post(t, h, "PlaceOrder", `{"order_id":"o-1","client_id":"c-1","total":42.5}`)
	require.Equal(t, 200, r.code, r.raw)
	require.Equal(t, "order-o-1", r.body["events"].([]any)[0].(map[string]any)["stream"])

	var doc reply
	eventually(t, "the client_orders projection", func() bool {
		doc = get(t, h, "/v1/projections/client_orders/c-1")
		return doc.code == 200
	})
	require.JSONEq(t, `{"client_id":"c-1","orders":1,"total":42.5,"order_ids":["o-1"]}`, doc.raw)

	r = post(t, h, "PlaceOrder", `{"order_id":"o-2","client_id":"c-1","total":7.5}`)
	require.Equal(t, 200, r.code, r.raw)
	eventually(t, "the second order projected", func() bool {
		doc = get(t, h, "/v1/projections/client_orders/c-1")
		return doc.body["orders"] == 2.0
	})
	require.JSONEq(t, `{"client_id":"c-1","orders":2,"total":50,"order_ids":["o-1","o-2"]}`, doc.raw)

	p := get(t, h, "/v1/plugins")
	require.Equal(t, 200, p.code)
	require.Equal(t, "client_id", p.body["partition_keys"].(map[string]any)["order"])
	require.Equal(t, 200, get(t, h, "/healthz").code)
	m := get(t, h, "/metrics")
	require.Equal(t, 200, m.code)
	require.Contains(t, m.raw, `protean_http_requests_total{code="200",route="POST /v1/commands/{type}"} 2`)
	require.Contains(t, m.raw, `protean_handler_calls_total{handler="orders",module="orders",outcome="ok"} 2`)
	require.Contains(t, m.raw, `protean_outbox_rows{status="published"} 2`)
}

func TestEmbeddedRejectsBadInput(t *testing.T) {
	h := embedded(t, wasmbuild.Examples(t))
	for _, tc := range []struct{ client, reason string }{
		{`"a:b"`, "partition key contains a colon"},
		{`"dlq"`, "reserved lane/DLQ token"},
		{`"backfill"`, "reserved lane/DLQ token"},
		{`"__x__"`, "reserved '__name__' sentinel form"},
		{`""`, "partition key is null or empty"},
	} {
		r := post(t, h, "PlaceOrder", `{"order_id":"bad","client_id":`+tc.client+`,"total":1}`)
		require.Equal(t, 422, r.code, r.raw)
		require.Contains(t, r.body["error"], tc.reason)
		require.Contains(t, r.body["error"], "invalid sequential_by key on order (field client_id of OrderPlaced)")
	}
	// Nothing was stored: the same order id still places (no aggregate),
	// and the only event and outbox row are that order's.
	r := post(t, h, "PlaceOrder", `{"order_id":"bad","client_id":"c-9","total":1}`)
	require.Equal(t, 200, r.code, r.raw)
	require.Equal(t, 0.0, r.body["events"].([]any)[0].(map[string]any)["position"], "the stream was empty")
	require.Equal(t, 1.0, r.body["events"].([]any)[0].(map[string]any)["global_position"], "no earlier event exists")
	eventually(t, "one published row", func() bool {
		return strings.Contains(get(t, h, "/metrics").raw, `protean_outbox_rows{status="published"} 1`)
	})

	for _, tc := range []struct {
		name, typ, body string
		code            int
		want            string
	}{
		{"malformed body", "PlaceOrder", `{"order_id":`, 400, "request body must be a JSON object"},
		{"array body", "PlaceOrder", `[1,2]`, 400, "request body must be a JSON object"},
		{"unknown command", "Frobnicate", `{}`, 404, "unknown command type: Frobnicate"},
		{"handler failure", "PlaceOrder", `{"order_id":"o-x","client_id":"c-1","total":"lots"}`, 500, "decode PlaceOrder"},
		{"handler rejection", "CancelOrder", `{"order_id":"nope"}`, 422, "order nope does not exist"},
		{"duplicate", "PlaceOrder", `{"order_id":"bad","client_id":"c-9","total":1}`, 422, "order bad already exists"},
	} {
		r := post(t, h, tc.typ, tc.body)
		require.Equal(t, tc.code, r.code, "%s: %s", tc.name, r.raw)
		require.Contains(t, r.body["error"], tc.want, tc.name)
	}
	require.Equal(t, 404, get(t, h, "/v1/projections/nope/x").code)
	require.Equal(t, 404, get(t, h, "/v1/projections/client_orders/nobody").code)
	big := `{"order_id":"` + strings.Repeat("x", 2<<20) + `"}`
	require.Equal(t, 413, post(t, h, "PlaceOrder", big).code)
	require.Equal(t, 200, get(t, h, "/healthz").code, "the host stays up")
}

func TestEmbeddedFulfillmentEitherOrder(t *testing.T) {
	h := embedded(t, wasmbuild.Examples(t))
	status := func(order string) string {
		r := get(t, h, "/v1/projections/fulfillment/"+order)
		if r.code != 200 {
			return ""
		}
		return r.body["status"].(string)
	}
	// Paid first, then shipped.
	require.Equal(t, 200, post(t, h, "RecordPayment", `{"payment_id":"p-1","order_id":"o-1","amount":10}`).code)
	eventually(t, "o-1 paid", func() bool { return status("o-1") == "paid" })
	require.Equal(t, 200, post(t, h, "ShipOrder", `{"shipment_id":"s-1","order_id":"o-1"}`).code)
	eventually(t, "o-1 fulfilled", func() bool { return status("o-1") == "fulfilled" })
	// Shipped first, then paid.
	require.Equal(t, 200, post(t, h, "ShipOrder", `{"shipment_id":"s-2","order_id":"o-2"}`).code)
	eventually(t, "o-2 shipped", func() bool { return status("o-2") == "shipped" })
	require.Equal(t, 200, post(t, h, "RecordPayment", `{"payment_id":"p-2","order_id":"o-2","amount":10}`).code)
	eventually(t, "o-2 fulfilled", func() bool { return status("o-2") == "fulfilled" })
	// One of the two alone does not fulfil.
	require.Equal(t, 200, post(t, h, "RecordPayment", `{"payment_id":"p-3","order_id":"o-3","amount":10}`).code)
	require.Equal(t, 200, post(t, h, "PlaceOrder", `{"order_id":"o-3","client_id":"c-3","total":1}`).code)
	eventually(t, "o-3 paid", func() bool { return status("o-3") == "paid" })
	eventually(t, "c-3 projected (everything before it was delivered)", func() bool {
		return get(t, h, "/v1/projections/client_orders/c-3").code == 200
	})
	require.Equal(t, "paid", status("o-3"))
}

func TestEmbeddedConcurrentCommands(t *testing.T) {
	dir := wasmbuild.Examples(t)
	wasmbuild.Copy(t, wasmbuild.Build(t, "./host/testdata/plugins/behave"), dir, "behave.wasm")
	h := embedded(t, dir)

	// Exactly one of N racing PlaceOrders for one order wins; the others
	// conflict (409) or, having read the winner's write, are rejected (422).
	const n = 16
	codes := make(chan int, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes <- post(t, h, "PlaceOrder", fmt.Sprintf(`{"order_id":"race","client_id":"c-%d","total":1}`, i)).code
		}()
	}
	wg.Wait()
	close(codes)
	count := map[int]int{}
	for c := range codes {
		count[c]++
	}
	require.Equal(t, 1, count[200], "%v", count)
	require.Equal(t, n-1, count[409]+count[422], "%v", count)

	// No lost update: racing increments, each retried on 409 until it
	// lands, add up exactly.
	const workers, each = 8, 10
	var conflicts sync.Map
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				for {
					r := post(t, h, "Increment", `{"id":"hits"}`)
					if r.code == 200 {
						break
					}
					if r.code != 409 {
						t.Errorf("increment: %d %s", r.code, r.raw)
						return
					}
					conflicts.Store(w, true)
				}
			}
		}()
	}
	wg.Wait()
	last := post(t, h, "Increment", `{"id":"hits"}`)
	require.Equal(t, 200, last.code)
	require.Equal(t, float64(workers*each), last.body["events"].([]any)[0].(map[string]any)["position"],
		"the counter stream holds one event per increment, none lost")
}

func TestMain(m *testing.M) {
	code := m.Run()
	wasmbuild.Cleanup()
	testserver.Stop()
	os.Exit(code)
}
