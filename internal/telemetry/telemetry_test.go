package telemetry_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/telemetry"
)

// Inject writes a span's W3C context into metadata, and SpanContext reads
// it back: the same trace, span, flags and state.
func TestMetadataCarriesTheSpanContext(t *testing.T) {
	t.Parallel()
	ts, err := trace.ParseTraceState("vendor=x1")
	require.NoError(t, err)
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5},
		TraceFlags: trace.FlagsSampled, TraceState: ts})
	var md abi.Metadata
	telemetry.Inject(trace.ContextWithSpanContext(context.Background(), sc), &md)
	require.Equal(t, "00-01020300000000000000000000000000-0405000000000000-01", md.TraceParent)
	require.Equal(t, "vendor=x1", md.TraceState)
	got := telemetry.SpanContext(&md)
	require.True(t, got.Equal(sc.WithRemote(true)), "%v", got)

	var none abi.Metadata
	telemetry.Inject(context.Background(), &none)
	require.Equal(t, abi.Metadata{}, none, "no span, nothing written")
	require.False(t, telemetry.SpanContext(&none).IsValid())
	require.False(t, telemetry.SpanContext(nil).IsValid())
	require.False(t, telemetry.SpanContext(&abi.Metadata{TraceParent: "00-bad"}).IsValid(), "a traceparent that does not parse is none")

	long, err := trace.ParseTraceState("a=" + strings.Repeat("x", 250) + ",b=" + strings.Repeat("y", 250) + ",c=" + strings.Repeat("z", 100))
	require.NoError(t, err)
	var big abi.Metadata
	telemetry.Inject(trace.ContextWithSpanContext(context.Background(), sc.WithTraceState(long)), &big)
	require.NotEmpty(t, big.TraceParent)
	require.Empty(t, big.TraceState, "a tracestate over MaxTraceState is dropped, the traceparent kept")
}

// Setup installs a provider whose spans reach the exporter, and its
// shutdown puts the one before back; OTEL_SDK_DISABLED=true installs none.
func TestSetupInstallsAndShutdownRestores(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	was := otel.GetTracerProvider()
	stop, err := telemetry.Setup(context.Background(), telemetry.Options{Exporter: exp, Version: "v9", Instance: "host-1"})
	require.NoError(t, err)
	require.True(t, telemetry.Enabled())
	_, span := telemetry.Tracer().Start(context.Background(), "x")
	span.End()
	spans := exp.GetSpans() // (the exporter forgets them at shutdown)
	require.NoError(t, stop(context.Background()))
	require.False(t, telemetry.Enabled())
	require.Same(t, was, otel.GetTracerProvider())
	require.Len(t, spans, 1)
	attrs := map[string]string{}
	for _, kv := range spans[0].Resource.Attributes() {
		attrs[string(kv.Key)] = kv.Value.Emit()
	}
	require.Equal(t, "protean-host", attrs["service.name"])
	require.Equal(t, "v9", attrs["service.version"])
	require.Equal(t, "host-1", attrs["service.instance.id"])

	t.Setenv("OTEL_SDK_DISABLED", "true")
	stop, err = telemetry.Setup(context.Background(), telemetry.Options{Exporter: exp})
	require.NoError(t, err)
	require.False(t, telemetry.Enabled())
	require.NoError(t, stop(context.Background()))
}
