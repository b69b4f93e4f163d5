package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/config"
	"github.com/proteanhq/protean-host/internal/testlog"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// testHost is a started host and its log, which waits quote when they
// give up.
type testHost struct {
	*hostProcess
	logs *testlog.Buffer
}

// embedded starts a host on the embedded default config (memory stores,
// inline broker) over the plugins in dir, on a free port.
func embedded(t *testing.T, dir string) *testHost {
	t.Helper()
	h, err := startHost(t, "domain.toml", dir)
	require.NoError(t, err)
	return h
}

// startHost starts a host on one of the shipped configs over the plugins
// in dir, on a free port.
func startHost(t *testing.T, configName, dir string) (*testHost, error) {
	t.Helper()
	return startHostWith(t, configName, dir, nil)
}

// startHostWith is startHost with a change to the loaded config.
func startHostWith(t *testing.T, configName, dir string, change func(*config.Config)) (*testHost, error) {
	t.Helper()
	logs := &testlog.Buffer{}
	e := &env{stdout: io.Discard, stderr: logs, log: slog.New(slog.NewTextHandler(logs, nil))}
	require.NoError(t, e.parse(e.flags("run"), []string{"--config", filepath.Join(wasmbuild.Root(), "configs", configName), "--plugins", dir}))
	e.cfg.HTTP.Listen = "127.0.0.1:0"
	e.cfg.Plugins.CacheDir = wasmbuild.CacheDir(t) // shared: compile once
	e.cfg.Plugins.CacheMaxMB = 0                   // shared with other test processes (see configFile)
	// The shipped configs' guest deadlines (a call 5 s, the manifest read
	// at load 2 s, a compile 10 s per MiB) are for a production host;
	// under -race on a busy 2-core machine creating an instance or
	// compiling a Go guest can take longer. No test here is about them
	// (sandbox_test runs its own config in a child process).
	wait := int(testwait.Limit().Milliseconds())
	e.cfg.Plugins.Limits.TimeoutMS = wait
	e.cfg.Plugins.Limits.ManifestTimeoutMS = wait
	e.cfg.Plugins.Limits.CompileTimeoutMS = wait
	if change != nil {
		change(&e.cfg)
	}
	h, err := start(context.Background(), e)
	if err != nil {
		return nil, fmt.Errorf("%w\n%s", err, logs.String())
	}
	t.Cleanup(func() { require.NoError(t, h.shutdown(), "shutdown; log:\n%s", logs.Tail(20)) })
	return &testHost{hostProcess: h, logs: logs}, nil
}

type reply struct {
	code int
	body map[string]any
	raw  string
}

func (r reply) String() string { return fmt.Sprintf("%d %s", r.code, r.raw) }

// send makes one request; it is safe on any goroutine (it does not fail
// the test itself).
func send(method, url, body string) (reply, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, fmt.Errorf("%s %s: read body: %w", method, url, err)
	}
	r := reply{code: resp.StatusCode, raw: string(b)}
	_ = json.Unmarshal(b, &r.body) // not every answer is a JSON object (/metrics)
	return r, nil
}

// do is send on the test goroutine.
func do(t *testing.T, method, url, body string) reply {
	t.Helper()
	r, err := send(method, url, body)
	require.NoError(t, err)
	return r
}

func post(t *testing.T, h *testHost, typ, body string) reply {
	t.Helper()
	return do(t, "POST", "http://"+h.addr+"/v1/commands/"+typ, body)
}

func get(t *testing.T, h *testHost, path string) reply {
	t.Helper()
	return do(t, "GET", "http://"+h.addr+path, "")
}

// eventually waits until cond holds; if it never does, the failure quotes
// what cond last saw and the host's last log lines.
func eventually(t *testing.T, h *testHost, what string, cond func() (bool, string)) {
	t.Helper()
	testwait.For(t, what, func() (bool, string) {
		ok, seen := cond()
		return ok, seen + "\nhost log (last lines):\n" + h.logs.Tail(15)
	})
}

// projected waits until GET path answers 200 and returns that answer.
func projected(t *testing.T, h *testHost, what, path string) reply {
	t.Helper()
	var r reply
	eventually(t, h, what, func() (bool, string) {
		r = get(t, h, path)
		return r.code == 200, "GET " + path + ": " + r.String()
	})
	return r
}

func TestEmbeddedQuickstart(t *testing.T) {
	quickstart(t, wasmbuild.Examples(t))
}

// The examples as built before ABI v2 (ABI v1: JSON through Extism
// memory) still load and pass the quickstart.
func TestEmbeddedQuickstartABIv1(t *testing.T) {
	quickstart(t, wasmbuild.Examples(t, wasmbuild.ABIv1))
}

// The C client_orders and orders (plugins/c: ABI v2 without the Go kit)
// in place of the Go ones pass the quickstart.
func TestEmbeddedQuickstartC(t *testing.T) {
	dir := wasmbuild.Examples(t)
	wasmbuild.Copy(t, wasmbuild.BuildC(t, "plugins/c/client_orders.c"), dir, "client_orders.wasm")
	wasmbuild.Copy(t, wasmbuild.BuildC(t, "plugins/c/orders.c"), dir, "orders.wasm")
	quickstart(t, dir)
}

func quickstart(t *testing.T, dir string) {
	h := embedded(t, dir)
	r := post(t, h, "PlaceOrder", `{"order_id":"o-1","client_id":"c-1","total":42.5}`)
	require.Equal(t, 200, r.code, r.raw)
	require.Equal(t, "order-o-1", r.body["events"].([]any)[0].(map[string]any)["stream"])

	doc := projected(t, h, "the client_orders projection", "/v1/projections/client_orders/c-1")
	require.JSONEq(t, `{"client_id":"c-1","orders":1,"total":42.5,"order_ids":["o-1"]}`, doc.raw)

	r = post(t, h, "PlaceOrder", `{"order_id":"o-2","client_id":"c-1","total":7.5}`)
	require.Equal(t, 200, r.code, r.raw)
	eventually(t, h, "the second order projected", func() (bool, string) {
		doc = get(t, h, "/v1/projections/client_orders/c-1")
		return doc.body["orders"] == 2.0, doc.String()
	})
	require.JSONEq(t, `{"client_id":"c-1","orders":2,"total":50,"order_ids":["o-1","o-2"]}`, doc.raw)

	p := get(t, h, "/v1/plugins")
	require.Equal(t, 200, p.code)
	require.Equal(t, "client_id", p.body["partition_keys"].(map[string]any)["order"])
	require.Equal(t, 200, get(t, h, "/healthz").code)
	// The counters and the outbox gauge move after the answer is sent and
	// the event projected (the relay marks a row published after the
	// broker took it): wait for them.
	eventually(t, h, "the metrics of two commands", func() (bool, string) {
		m := get(t, h, "/metrics")
		return m.code == 200 &&
				strings.Contains(m.raw, `protean_http_requests_total{code="200",route="POST /v1/commands/{type}"} 2`) &&
				strings.Contains(m.raw, `protean_handler_calls_total{handler="orders",module="orders",outcome="ok"} 2`) &&
				strings.Contains(m.raw, `protean_outbox_rows{status="published"} 2`),
			fmt.Sprintf("%d\n%s\n%s\n%s", m.code, metricLines(m.raw, "protean_http_requests_total"),
				metricLines(m.raw, "protean_handler_calls_total"), metricLines(m.raw, "protean_outbox_rows"))
	})
}

func TestEmbeddedRejectsBadInput(t *testing.T) {
	h := embedded(t, wasmbuild.Examples(t))
	for _, tc := range []struct{ client, reason string }{
		{`"a:b"`, "partition key contains a colon"},
		{`"dlq"`, "reserved lane/DLQ token"},
		{`"backfill"`, "reserved lane/DLQ token"},
		{`"__x__"`, "reserved '__name__' sentinel form"},
		{`""`, "partition key is null or empty"},
		{`"a\nb"`, "partition key contains a control character"},
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
	eventually(t, h, "one published row", func() (bool, string) {
		m := get(t, h, "/metrics").raw
		return strings.Contains(m, `protean_outbox_rows{status="published"} 1`), metricLines(m, "protean_outbox_rows")
	})

	for _, tc := range []struct {
		name, typ, body string
		code            int
		want            string
	}{
		{"malformed body", "PlaceOrder", `{"order_id":`, 400, "request body must be a JSON object"},
		{"array body", "PlaceOrder", `[1,2]`, 400, "request body must be a JSON object"},
		{"unknown command", "Frobnicate", `{}`, 404, "unknown command type: Frobnicate"},
		{"wrong type", "PlaceOrder", `{"order_id":"o-x","client_id":"c-1","total":"lots"}`, 422, "total: want a number, got string"},
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
	waitStatus := func(order, want string) {
		t.Helper()
		eventually(t, h, order+" "+want, func() (bool, string) {
			r := get(t, h, "/v1/projections/fulfillment/"+order)
			return r.code == 200 && r.body["status"] == want, r.String()
		})
	}
	// Paid first, then shipped.
	require.Equal(t, 200, post(t, h, "RecordPayment", `{"payment_id":"p-1","order_id":"o-1","amount":10}`).code)
	waitStatus("o-1", "paid")
	require.Equal(t, 200, post(t, h, "ShipOrder", `{"shipment_id":"s-1","order_id":"o-1"}`).code)
	waitStatus("o-1", "fulfilled")
	// Shipped first, then paid.
	require.Equal(t, 200, post(t, h, "ShipOrder", `{"shipment_id":"s-2","order_id":"o-2"}`).code)
	waitStatus("o-2", "shipped")
	require.Equal(t, 200, post(t, h, "RecordPayment", `{"payment_id":"p-2","order_id":"o-2","amount":10}`).code)
	waitStatus("o-2", "fulfilled")
	// One of the two alone does not fulfil.
	require.Equal(t, 200, post(t, h, "RecordPayment", `{"payment_id":"p-3","order_id":"o-3","amount":10}`).code)
	require.Equal(t, 200, post(t, h, "PlaceOrder", `{"order_id":"o-3","client_id":"c-3","total":1}`).code)
	waitStatus("o-3", "paid")
	projected(t, h, "c-3 projected (everything before it was delivered)", "/v1/projections/client_orders/c-3")
	require.Equal(t, "paid", status("o-3"))
}

func TestEmbeddedConcurrentCommands(t *testing.T) {
	dir := wasmbuild.Examples(t)
	wasmbuild.Copy(t, wasmbuild.Build(t, "./internal/host/testdata/plugins/behave"), dir, "behave.wasm")
	h := embedded(t, dir)
	url := "http://" + h.addr + "/v1/commands/"

	// Exactly one of N racing PlaceOrders for one order wins; the others
	// conflict (409) or, having read the winner's write, are rejected (422).
	const n = 16
	type answer struct {
		r   reply
		err error
	}
	answers := make(chan answer, n)
	for i := 0; i < n; i++ {
		go func() {
			r, err := send("POST", url+"PlaceOrder", fmt.Sprintf(`{"order_id":"race","client_id":"c-%d","total":1}`, i))
			answers <- answer{r, err}
		}()
	}
	count := map[int]int{}
	for range n {
		a := testwait.Recv(t, "a racing PlaceOrder's answer", answers)
		require.NoError(t, a.err)
		count[a.r.code]++
	}
	require.Equal(t, 1, count[200], "%v", count)
	require.Equal(t, n-1, count[409]+count[422], "%v", count)

	// No lost update: racing increments, each retried on 409 until it
	// lands, add up exactly. A round in which no increment conflicted raced nothing and proves
	// nothing, so rounds repeat until one saw a conflict.
	const workers, each = 8, 10
	total := 0
	rounds := 0
	testwait.For(t, "a round of racing increments with a conflict", func() (bool, string) {
		rounds++
		conflicts := make(chan int, workers)
		for range workers {
			go func() {
				c := 0
				defer func() { conflicts <- c }()
				for range each {
					for {
						r, err := send("POST", url+"Increment", `{"id":"hits"}`)
						if err != nil {
							t.Errorf("increment: %v", err)
							return
						}
						if r.code == 200 {
							break
						}
						if r.code != 409 {
							t.Errorf("increment: %s", r)
							return
						}
						c++
					}
				}
			}()
		}
		seen := 0
		for range workers {
			seen += testwait.Recv(t, "an incrementing worker to finish", conflicts)
		}
		require.False(t, t.Failed(), "a worker failed")
		total += workers * each
		return seen > 0, fmt.Sprintf("%d rounds without a conflict", rounds)
	})
	last := post(t, h, "Increment", `{"id":"hits"}`)
	require.Equal(t, 200, last.code, last.raw)
	ev := last.body["events"].([]any)[0].(map[string]any)
	require.Equal(t, float64(total), ev["position"], "the counter stream holds one event per increment, none lost")
}

// metricLines returns the lines of a /metrics answer for one metric.
func metricLines(metrics, name string) string {
	var out []string
	for _, l := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(l, name) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestMain(m *testing.M) { testserver.Main(m, wasmbuild.Cleanup, removeHostBinary) }
