package telemetry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/proteanhq/protean-host/abi"
)

// ScopeName is the instrumentation scope of the host's spans.
const ScopeName = "github.com/proteanhq/protean-host"

// Tracer is the host's tracer, of the global provider (a no-op one until
// Setup installs another).
func Tracer() trace.Tracer { return otel.Tracer(ScopeName) }

// Options are what Setup needs; zero values defer to the OTEL_* variables.
type Options struct {
	// Endpoint is the OTLP/HTTP traces URL
	// ("http://collector:4318/v1/traces"); "" takes
	// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT,
	// else http://localhost:4318.
	Endpoint string
	// SampleRatio traces that share of the traces the host begins (a
	// request whose traceparent says sampled is traced, one that says not
	// is not); 0 defers to OTEL_TRACES_SAMPLER (default: every trace).
	SampleRatio float64
	// ServiceName is service.name; "" takes OTEL_SERVICE_NAME, else
	// "protean-host".
	ServiceName string
	// Version is service.version, Instance service.instance.id (the
	// host's owner name).
	Version, Instance string
	// Exporter replaces the OTLP exporter (tests: an in-memory one, whose
	// spans are exported as they end).
	Exporter sdktrace.SpanExporter
}

// Setup installs a tracer provider exporting the host's spans as o says,
// and the W3C trace-context propagator, globally; shutdown flushes the
// spans not yet exported and uninstalls both. With OTEL_SDK_DISABLED=true
// it installs nothing.
func Setup(ctx context.Context, o Options) (shutdown func(context.Context) error, err error) {
	if v, _ := strconv.ParseBool(os.Getenv("OTEL_SDK_DISABLED")); v {
		return func(context.Context) error { return nil }, nil
	}
	// Later detectors override earlier ones: the defaults, then the
	// OTEL_ variables, then the config.
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName("protean-host"), semconv.ServiceVersion(o.Version)),
		resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithHost())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	if o.Instance != "" {
		if res, err = resource.Merge(res, resource.NewSchemaless(semconv.ServiceInstanceID(o.Instance))); err != nil {
			return nil, fmt.Errorf("telemetry: resource: %w", err)
		}
	}
	if o.ServiceName != "" {
		if res, err = resource.Merge(res, resource.NewSchemaless(semconv.ServiceName(o.ServiceName))); err != nil {
			return nil, fmt.Errorf("telemetry: resource: %w", err)
		}
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if o.SampleRatio > 0 {
		opts = append(opts, sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(o.SampleRatio))))
	}
	if o.Exporter != nil {
		opts = append(opts, sdktrace.WithSyncer(o.Exporter))
	} else {
		var eo []otlptracehttp.Option
		if o.Endpoint != "" {
			eo = append(eo, otlptracehttp.WithEndpointURL(o.Endpoint))
		}
		exp, err := otlptracehttp.New(ctx, eo...)
		if err != nil {
			return nil, fmt.Errorf("telemetry: OTLP exporter: %w", err)
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	was, wasProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	enabled.Store(true)
	return func(ctx context.Context) error {
		enabled.Store(false)
		otel.SetTracerProvider(was)
		otel.SetTextMapPropagator(wasProp)
		return tp.Shutdown(ctx)
	}, nil
}

// MaxTraceState bounds the tracestate a message carries: W3C's own limit
// for a propagated one is 512 characters; a longer one is dropped (the
// traceparent is kept).
const MaxTraceState = 512

// Inject writes the span context of ctx into md: its W3C traceparent and
// tracestate. A context without a valid span context leaves md as it is.
func Inject(ctx context.Context, md *abi.Metadata) {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return
	}
	c := carrier{}
	propagation.TraceContext{}.Inject(ctx, c)
	md.TraceParent = c["traceparent"]
	md.TraceState = ""
	if ts := c["tracestate"]; len(ts) <= MaxTraceState {
		md.TraceState = ts
	}
}

// SpanContext is the span context md carries (invalid: none, or one that
// does not parse).
func SpanContext(md *abi.Metadata) trace.SpanContext {
	if md == nil || md.TraceParent == "" {
		return trace.SpanContext{}
	}
	c := carrier{"traceparent": md.TraceParent}
	if md.TraceState != "" {
		c["tracestate"] = md.TraceState
	}
	return trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), c))
}

// carrier is a propagation.TextMapCarrier of one message's fields.
type carrier map[string]string

func (c carrier) Get(k string) string { return c[k] }
func (c carrier) Set(k, v string)     { c[k] = v }
func (c carrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// enabled is whether Setup installed a provider (Enabled).
var enabled atomic.Bool

// Enabled reports whether the host traces: whether Setup installed a
// provider. Work that only a recording span needs (links, attributes)
// is skipped without.
func Enabled() bool { return enabled.Load() }

// MaxErrorBytes bounds the error message a span's status carries.
const MaxErrorBytes = 512

// End ends span, marked failed with err if there is one.
func End(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		span.RecordError(err)
		span.SetStatus(codes.Error, abi.Clip(err.Error(), MaxErrorBytes))
	}
	span.End()
}

// Links are links to the creation contexts the messages' metadata
// (JSON, as stored and published) carry; nil unless the host traces.
func Links(metadata ...json.RawMessage) []trace.Link {
	if !Enabled() {
		return nil
	}
	var links []trace.Link
	for _, raw := range metadata {
		if len(raw) == 0 {
			continue
		}
		var md abi.Metadata
		if json.Unmarshal(raw, &md) != nil {
			continue
		}
		if sc := SpanContext(&md); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	return links
}
