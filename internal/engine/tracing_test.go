package engine

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/telemetry"
)

// traced installs tracing to an in-memory exporter for the test (not
// parallel: the provider is global).
func traced(t *testing.T) *tracetest.InMemoryExporter {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	stop, err := telemetry.Setup(context.Background(), telemetry.Options{Exporter: exp})
	require.NoError(t, err)
	t.Cleanup(func() { _ = stop(context.Background()) })
	return exp
}

// spanNamed is the one span of the trace named name.
func spanNamed(t *testing.T, spans tracetest.SpanStubs, tid trace.TraceID, name string) tracetest.SpanStub {
	t.Helper()
	var found []tracetest.SpanStub
	for _, s := range spans {
		if s.SpanContext.TraceID() == tid && s.Name == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		var names []string
		for _, s := range spans {
			names = append(names, s.Name)
		}
		require.Len(t, found, 1, "spans named %q in the trace, of %q", name, names)
	}
	return found[0]
}

// A traced command is a dispatch span under its caller's, with the guest
// call and the commit under it, and its events carry the dispatch span as
// their creation context.
func TestACommandsTraceReachesItsEvents(t *testing.T) {
	exp := traced(t)
	e, _ := newEngine(t)
	ctx, root := otel.Tracer("test").Start(context.Background(), "request")
	_, err := e.Dispatch(ctx, "Increment", json.RawMessage(`{"id":"traced"}`), abi.Metadata{})
	require.NoError(t, err)
	root.End()
	tid := root.SpanContext().TraceID()
	spans := exp.GetSpans()
	dispatch := spanNamed(t, spans, tid, "dispatch Increment")
	require.Equal(t, root.SpanContext().SpanID(), dispatch.Parent.SpanID())
	module := e.loaded.Load().set.Modules()[0].Name()
	handle := spanNamed(t, spans, tid, "handle "+module)
	require.Equal(t, dispatch.SpanContext.SpanID(), handle.Parent.SpanID())
	require.Contains(t, handle.Attributes, attribute.String("protean.handler", "counter"))
	commit := spanNamed(t, spans, tid, "commit")
	require.Equal(t, dispatch.SpanContext.SpanID(), commit.Parent.SpanID())

	evs, err := e.opts.Events.ReadStream(context.Background(), "counter-traced", 0, 0)
	require.NoError(t, err)
	require.Len(t, evs, 1)
	var md abi.Metadata
	require.NoError(t, json.Unmarshal(evs[0].Metadata, &md))
	sc := telemetry.SpanContext(&md)
	require.Equal(t, tid, sc.TraceID())
	require.Equal(t, dispatch.SpanContext.SpanID(), sc.SpanID(), "the event's creation context is its command's dispatch")

	// A delivered message's call is the root of its trace, a consumer
	// span linked to the message's creation context.
	l := e.loaded.Load()
	route := l.set.Subscribers("Op")[0]
	env := abi.Envelope{ID: "1", Type: "Op", Data: json.RawMessage(`{"op":"ok","id":"x"}`), Metadata: &md}
	_, err = e.call(context.Background(), l, route, []abi.Envelope{env})
	require.NoError(t, err)
	var delivered []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == "handle "+module && len(s.Links) > 0 {
			delivered = append(delivered, s)
		}
	}
	require.Len(t, delivered, 1)
	require.False(t, delivered[0].Parent.IsValid(), "no parent")
	require.Equal(t, trace.SpanKindConsumer, delivered[0].SpanKind)
	require.Equal(t, dispatch.SpanContext.SpanID(), delivered[0].Links[0].SpanContext.SpanID())

	// A command whose metadata carries a trace (a follow-up of a delivered
	// message) and no caller's span stays in that trace.
	_, err = e.Dispatch(context.Background(), "Increment", json.RawMessage(`{"id":"follow"}`), md)
	require.NoError(t, err)
	var follows int
	for _, s := range exp.GetSpans() {
		if s.Name == "dispatch Increment" && s.SpanContext.TraceID() == tid && s.Parent.SpanID() == dispatch.SpanContext.SpanID() {
			follows++
			require.True(t, s.Parent.IsRemote())
		}
	}
	require.Equal(t, 1, follows, "the follow-up's dispatch is a child of its cause's creation context")
}

// Off (no provider installed), a command writes no trace context.
func TestUntracedCommandsCarryNoTraceContext(t *testing.T) {
	e, _ := newEngine(t)
	require.False(t, telemetry.Enabled())
	_, err := e.Dispatch(context.Background(), "Increment", json.RawMessage(`{"id":"plain"}`), abi.Metadata{})
	require.NoError(t, err)
	evs, err := e.opts.Events.ReadStream(context.Background(), "counter-plain", 0, 0)
	require.NoError(t, err)
	require.Len(t, evs, 1)
	require.NotContains(t, string(evs[0].Metadata), "traceparent")
}
