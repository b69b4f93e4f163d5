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

// A delivered run is a process span of its own trace, linked to its
// messages' creation contexts, with its guest call and commit under it;
// the events it commits carry it as their creation context.
func TestARunIsAProcessSpan(t *testing.T) {
	exp := traced(t)
	e, mem := partitionEngine(t)
	_, cause := otel.Tracer("test").Start(context.Background(), "cause")
	cause.End()
	var md abi.Metadata
	telemetry.Inject(trace.ContextWithSpanContext(context.Background(), cause.SpanContext()), &md)
	raw, err := json.Marshal(md)
	require.NoError(t, err)
	row, err := mem.Positions.Claim(context.Background(), "behave", "ops:u")
	require.NoError(t, err)
	b := opBatch(row.Generation, "read", "read")
	for i := range b.Messages {
		b.Messages[i].Metadata = raw
	}
	n, err := e.Handler().Handle(context.Background(), b)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	var process []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == "process ops" {
			process = append(process, s)
		}
	}
	require.Len(t, process, 1)
	p := process[0]
	require.False(t, p.Parent.IsValid())
	require.Equal(t, trace.SpanKindConsumer, p.SpanKind)
	require.Len(t, p.Links, 2, "one link per message")
	require.Equal(t, cause.SpanContext().SpanID(), p.Links[0].SpanContext.SpanID())
	require.Contains(t, p.Attributes, attribute.Int64("protean.generation", row.Generation))
	require.Contains(t, p.Attributes, attribute.String("messaging.consumer.group.name", "behave"))
	module := e.loaded.Load().set.Modules()[0].Name()
	tid := p.SpanContext.TraceID()
	require.Equal(t, p.SpanContext.SpanID(), spanNamed(t, exp.GetSpans(), tid, "handle "+module).Parent.SpanID())
	require.Equal(t, p.SpanContext.SpanID(), spanNamed(t, exp.GetSpans(), tid, "commit").Parent.SpanID())

	evs, err := mem.Events.ReadStream(context.Background(), "ops-1", 0, 0)
	require.NoError(t, err)
	require.Len(t, evs, 1)
	var got abi.Metadata
	require.NoError(t, json.Unmarshal(evs[0].Metadata, &got))
	require.Equal(t, p.SpanContext.SpanID(), telemetry.SpanContext(&got).SpanID(), "the run's events were created by its process span")
}
