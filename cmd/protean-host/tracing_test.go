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
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/protobuf/proto"

	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// otlpSpan is what the receiver keeps of a span it was sent.
type otlpSpan struct {
	name, trace, id, parent, service, instance string
	links                                      []string // span ids
	attrs                                      map[string]string
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
		var service, instance string
		for _, kv := range rs.Resource.GetAttributes() {
			switch kv.Key {
			case "service.name":
				service = kv.Value.GetStringValue()
			case "service.instance.id":
				instance = kv.Value.GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				sp := otlpSpan{name: s.Name, trace: hex.EncodeToString(s.TraceId), id: hex.EncodeToString(s.SpanId),
					parent: hex.EncodeToString(s.ParentSpanId), service: service, instance: instance, attrs: map[string]string{}}
				for _, kv := range s.Attributes {
					v := kv.Value.GetStringValue()
					if _, ok := kv.Value.GetValue().(*commonpb.AnyValue_IntValue); ok {
						v = fmt.Sprint(kv.Value.GetIntValue())
					}
					sp.attrs[kv.Key] = v
				}
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

// placeTraced places an order for client on the host at addr, in the
// trace tid (a traceparent whose parent span is 00f067aa0ba902b7), and
// returns the answer's traceparent.
func placeTraced(t *testing.T, addr, tid, client string) string {
	t.Helper()
	var resp *http.Response
	testwait.For(t, "the order placed (a module still compiling answers 503)", func() (bool, string) {
		req, err := http.NewRequest("POST", "http://"+addr+"/v1/commands/PlaceOrder",
			strings.NewReader(fmt.Sprintf(`{"order_id":"o-%s","client_id":%q,"total":5}`, client, client)))
		require.NoError(t, err)
		req.Header.Set("traceparent", "00-"+tid+"-00f067aa0ba902b7-01")
		resp, err = http.DefaultClient.Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode != http.StatusServiceUnavailable, string(body)
	})
	require.Equal(t, 200, resp.StatusCode)
	return resp.Header.Get("traceparent")
}

// committedDispatch waits for the commit of a command in the trace tid at
// the receiver, and returns its dispatch span (alone in the slice).
func committedDispatch(t *testing.T, recv *otlpReceiver, tid string, tail func() string) []otlpSpan {
	t.Helper()
	var dispatch []otlpSpan
	testwait.For(t, "the command's commit and dispatch at the receiver", func() (bool, string) {
		for _, c := range recv.find(func(s otlpSpan) bool { return s.trace == tid && s.name == "commit" }) {
			dispatch = recv.find(func(s otlpSpan) bool { return s.id == c.parent && s.name == "dispatch PlaceOrder" })
		}
		return len(dispatch) == 1, recv.names() + "\n" + tail()
	})
	return dispatch
}

// TestTracesReachAnOTLPReceiver runs the real host with [telemetry]
// tracing on, exporting to an OTLP/HTTP receiver the test runs on
// loopback: a command sent with a traceparent is one trace from its HTTP
// request to its commit, answered with its span's traceparent; the relay
// that publishes its event and the projector's delivery of it link to the
// command's span, and the projector's call and commit are the delivery's.
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
	answered := placeTraced(t, p.addr, tid, "c-1")
	require.True(t, strings.HasPrefix(answered, "00-"+tid+"-"), answered)

	// The command that committed (an earlier attempt answered 503 while
	// its module compiled has spans of its own, and no commit): commit,
	// under its dispatch, under the request's server span.
	dispatch := committedDispatch(t, recv, tid, p.Tail)
	server := recv.find(func(s otlpSpan) bool { return s.id == dispatch[0].parent })
	require.Len(t, server, 1)
	require.Equal(t, "POST /v1/commands/{type}", server[0].name)
	require.Equal(t, "00f067aa0ba902b7", server[0].parent)
	require.Equal(t, "protean-host", server[0].service)
	require.Equal(t, "00-"+tid+"-"+server[0].id+"-01", answered)
	handle := recv.find(func(s otlpSpan) bool {
		return s.trace == tid && s.name == "handle orders" && s.parent == dispatch[0].id
	})
	require.Len(t, handle, 1)

	// The relay's publish and the projector's delivery link to the
	// command's dispatch, the events' creation context; the projector's
	// guest call and commit are its delivery's children.
	linked := func(name string) func(otlpSpan) bool {
		return func(s otlpSpan) bool { return s.name == name && len(s.links) == 1 && s.links[0] == dispatch[0].id }
	}
	testwait.For(t, "the relay's and the projector's spans", func() (bool, string) {
		return len(recv.find(linked("publish order"))) == 1 && len(recv.find(linked("process order"))) == 1,
			recv.names() + "\n" + p.Tail()
	})
	process := recv.find(linked("process order"))[0]
	require.Empty(t, process.parent, "a delivery begins a trace of its own")
	require.NotEqual(t, tid, process.trace)
	in := func(name string) []otlpSpan {
		return recv.find(func(s otlpSpan) bool { return s.trace == process.trace && s.name == name && s.parent == process.id })
	}
	testwait.For(t, "the projector's call and commit under its delivery", func() (bool, string) {
		return len(in("handle client_orders")) == 1 && len(in("commit")) == 1, recv.names()
	})
}

// TestTracesAcrossHostsOnRedis runs two real hosts on PostgreSQL and
// Redis, both tracing to one OTLP receiver: a command sent to one is
// published by a relay and handled by the partition worker that owns its
// key, on either host. The publish and the worker's process span link to
// the command's dispatch; the process span names the partition's unit,
// key and lease generation, and the host it ran on; the projector's call
// and commit are its children. A process manager's delivery of the same
// event links to the dispatch as well, and the command it dispatches is
// its child, handled and committed under that command's dispatch.
func TestTracesAcrossHostsOnRedis(t *testing.T) {
	d := newRedisDeployment(t)
	recv, url, _ := tracedOrders(t)
	dir := wasmbuild.Examples(t)
	// A process manager that follows each placed order up with a command.
	wasmbuild.Copy(t, wasmbuild.Build(t, "./internal/host/testdata/plugins/followup"), dir, "followup.wasm")
	telemetry := fmt.Sprintf("[telemetry]\ntracing = true\nendpoint = %q\n", url)
	hosts := []*process{d.startProcess(t, dir, telemetry), d.startProcess(t, dir, telemetry)}
	const tid = "5bf92f3577b34da6a3ce929d0e0e4736"
	placeTraced(t, hosts[0].addr, tid, "c-t")
	dispatch := committedDispatch(t, recv, tid, hosts[0].Tail)
	linked := func(name string) []otlpSpan {
		return recv.find(func(s otlpSpan) bool {
			return s.name == name && len(s.links) == 1 && s.links[0] == dispatch[0].id
		})
	}
	// (The process manager's delivery of the event is a process span as
	// well: this one is the client_orders worker's, for key c-t. The event
	// goes to two streams, the orders partition's and the correlated
	// process manager's, as two outbox rows: one relay pass or two, so one
	// publish span or two, each linked to the dispatch.)
	var process otlpSpan
	testwait.For(t, "the publish and the client_orders worker's span", func() (bool, string) {
		for _, s := range linked("process order") {
			if s.attrs["protean.partition.key"] == "c-t" && s.attrs["messaging.consumer.group.name"] == "client_orders" {
				process = s
			}
		}
		return len(linked("publish order")) >= 1 && process.id != "", fmt.Sprintf("%v\n%s\n%s", linked("process order"), recv.names(), hosts[0].Tail())
	})
	require.NotEmpty(t, process.attrs["protean.unit"])
	require.NotEqual(t, "", process.attrs["protean.generation"])
	require.NotEqual(t, "0", process.attrs["protean.generation"])
	require.NotEmpty(t, process.instance, "the host it ran on")
	t.Logf("command on %s, key c-t handled on %s (generation %s)", dispatch[0].instance, process.instance, process.attrs["protean.generation"])
	testwait.For(t, "the projector's call and commit under its delivery", func() (bool, string) {
		in := func(name string) int {
			return len(recv.find(func(s otlpSpan) bool { return s.trace == process.trace && s.name == name && s.parent == process.id }))
		}
		return in("handle client_orders") == 1 && in("commit") == 1, recv.names()
	})

	// The process manager's delivery links to the command's dispatch too,
	// and the command it follows the order up with is its child, in its
	// trace, handled and committed under its own dispatch.
	var pm, note otlpSpan
	testwait.For(t, "the process manager's follow-up command", func() (bool, string) {
		for _, s := range linked("process order") {
			if s.attrs["messaging.consumer.group.name"] == "followup" {
				pm = s
			}
		}
		notes := recv.find(func(s otlpSpan) bool { return s.name == "dispatch Note" && pm.id != "" && s.parent == pm.id })
		if len(notes) == 1 {
			note = notes[0]
		}
		return note.id != "", recv.names()
	})
	require.Equal(t, pm.trace, note.trace)
	testwait.For(t, "the follow-up's call and commit under its dispatch", func() (bool, string) {
		under := func(name string) int {
			return len(recv.find(func(s otlpSpan) bool { return s.trace == note.trace && s.name == name && s.parent == note.id }))
		}
		return under("handle followup") == 1 && under("commit") == 1, recv.names()
	})
}
