package main

import (
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// otlpSpan is what the receiver keeps of a span it was sent.
type otlpSpan struct {
	name, trace, id, parent, service string
	links                            []string // span ids
}

// otlpReceiver is an OTLP/HTTP traces endpoint (protobuf) on loopback.
type otlpReceiver struct {
	mu    sync.Mutex
	spans []otlpSpan
}

func (o *otlpReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	var req coltrace.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(b, &req)
	}
	if err != nil || r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, fmt.Sprint("bad export: ", err, " ", r.URL.Path), http.StatusBadRequest)
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		var service string
		for _, kv := range rs.Resource.GetAttributes() {
			if kv.Key == "service.name" {
				service = kv.Value.GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				sp := otlpSpan{name: s.Name, trace: hex.EncodeToString(s.TraceId), id: hex.EncodeToString(s.SpanId),
					parent: hex.EncodeToString(s.ParentSpanId), service: service}
				for _, l := range s.Links {
					sp.links = append(sp.links, hex.EncodeToString(l.SpanId))
				}
				o.spans = append(o.spans, sp)
			}
		}
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	_, _ = w.Write(out)
}

// find returns the spans match accepts.
func (o *otlpReceiver) find(match func(otlpSpan) bool) []otlpSpan {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []otlpSpan
	for _, s := range o.spans {
		if match(s) {
			out = append(out, s)
		}
	}
	return out
}

func (o *otlpReceiver) names() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var n []string
	for _, s := range o.spans {
		n = append(n, s.name)
	}
	return strings.Join(n, ", ")
}

// tracedOrders starts an OTLP receiver on loopback for the test, and
// returns it, its traces URL, and a plugins directory of the orders and
// client_orders examples.
func tracedOrders(tb testing.TB) (*otlpReceiver, string, string) {
	tb.Helper()
	recv := &otlpReceiver{}
	srv := httptest.NewServer(recv)
	tb.Cleanup(srv.Close)
	dir := tb.TempDir()
	examples := wasmbuild.Examples(tb)
	for _, m := range []string{"orders.wasm", "client_orders.wasm"} {
		wasmbuild.Copy(tb, filepath.Join(examples, m), dir, m)
	}
	return recv, srv.URL + "/v1/traces", dir
}

// TestTracesReachAnOTLPReceiver runs the real host with [telemetry]
// tracing on, exporting to an OTLP/HTTP receiver the test runs on
// loopback: a command sent with a traceparent is one trace from its HTTP
// request to its commit, answered with its span's traceparent, and the
// projector that handles its event links to the command's span.
func TestTracesReachAnOTLPReceiver(t *testing.T) {
	recv, url, dir := tracedOrders(t)
	p := runHostEnv(t, fmt.Sprintf(`
[plugins]
dir = %q
cache_dir = %q
cache_max_mb = 0
[telemetry]
tracing = true
endpoint = %q
`, dir, wasmbuild.CacheDir(t), url), "5s", "OTEL_BSP_SCHEDULE_DELAY=50")
	const tid = "4bf92f3577b34da6a3ce929d0e0e4736"
	req, err := http.NewRequest("POST", "http://"+p.addr+"/v1/commands/PlaceOrder", strings.NewReader(`{"order_id":"o-1","client_id":"c-1","total":5}`))
	require.NoError(t, err)
	req.Header.Set("traceparent", "00-"+tid+"-00f067aa0ba902b7-01")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	answered := resp.Header.Get("traceparent")
	require.True(t, strings.HasPrefix(answered, "00-"+tid+"-"), answered)

	named := func(name string) func(otlpSpan) bool {
		return func(s otlpSpan) bool { return s.trace == tid && s.name == name }
	}
	testwait.For(t, "the command's spans at the receiver", func() (bool, string) {
		return len(recv.find(named("commit"))) == 1, recv.names() + "\n" + p.Tail()
	})
	server := recv.find(named("POST /v1/commands/{type}"))
	require.Len(t, server, 1)
	require.Equal(t, "00f067aa0ba902b7", server[0].parent)
	require.Equal(t, "protean-host", server[0].service)
	require.Equal(t, "00-"+tid+"-"+server[0].id+"-01", answered)
	dispatch := recv.find(named("dispatch PlaceOrder"))
	require.Len(t, dispatch, 1)
	require.Equal(t, server[0].id, dispatch[0].parent)
	handle := recv.find(named("handle orders"))
	require.Len(t, handle, 1)
	require.Equal(t, dispatch[0].id, handle[0].parent)
	require.Equal(t, dispatch[0].id, recv.find(named("commit"))[0].parent)

	testwait.For(t, "the projector's span, linked to the command's", func() (bool, string) {
		return len(recv.find(func(s otlpSpan) bool {
			return s.name == "handle client_orders" && len(s.links) == 1 && s.links[0] == dispatch[0].id
		})) == 1, recv.names() + "\n" + p.Tail()
	})
}
