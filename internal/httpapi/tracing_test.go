package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/engine"
	"github.com/proteanhq/protean-host/internal/httpapi"
	"github.com/proteanhq/protean-host/internal/telemetry"
)

// spanEngine is fakeEngine that keeps the span context a command came
// with.
type spanEngine struct {
	fakeEngine
	sc trace.SpanContext
}

func (s *spanEngine) Dispatch(ctx context.Context, typ string, data json.RawMessage, md abi.Metadata) (*engine.CommandResult, error) {
	s.sc = trace.SpanContextFromContext(ctx)
	return s.fakeEngine.Dispatch(ctx, typ, data, md)
}

// With tracing on, a command's request is a server span named by its
// route, a child of the request's traceparent, which the engine's work
// runs under and the answer names; the health check is not traced.
// Without it, nothing is.
func TestTracingHonoursTraceparent(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	stop, err := telemetry.Setup(context.Background(), telemetry.Options{Exporter: exp})
	require.NoError(t, err)
	defer stop(context.Background())
	f := &spanEngine{}
	srv := httptest.NewServer(httpapi.New(f, httpapi.Options{Tracing: true}))
	defer srv.Close()
	const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	req, err := http.NewRequest("POST", srv.URL+"/v1/commands/PlaceOrder", strings.NewReader(`{"a":1}`))
	require.NoError(t, err)
	req.Header.Set("traceparent", parent)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)

	require.Equal(t, "0af7651916cd43dd8448eb211c80319c", f.sc.TraceID().String(), "the command runs in the caller's trace")
	answer := resp.Header.Get("traceparent")
	require.Equal(t, "00-0af7651916cd43dd8448eb211c80319c-"+f.sc.SpanID().String()+"-01", answer, "the answer names the request's span")
	var server []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.SpanContext.SpanID() == f.sc.SpanID() {
			server = append(server, s)
		}
	}
	require.Len(t, server, 1)
	require.Equal(t, "POST /v1/commands/{type}", server[0].Name, "named by the route, not the path")
	require.Equal(t, trace.SpanKindServer, server[0].SpanKind)
	require.Equal(t, "b7ad6b7169203331", server[0].Parent.SpanID().String())

	n := len(exp.GetSpans())
	resp, err = http.Get(srv.URL + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Empty(t, resp.Header.Get("traceparent"))
	require.Len(t, exp.GetSpans(), n, "the health check is not traced")

	plain := &spanEngine{}
	off := httptest.NewServer(httpapi.New(plain, httpapi.Options{}))
	defer off.Close()
	req, err = http.NewRequest("POST", off.URL+"/v1/commands/PlaceOrder", strings.NewReader(`{"a":1}`))
	require.NoError(t, err)
	req.Header.Set("traceparent", parent)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Empty(t, resp.Header.Get("traceparent"))
	require.False(t, plain.sc.IsValid(), "without Tracing the request's traceparent is not taken")
}
