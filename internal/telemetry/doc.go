// Package telemetry is the host's OpenTelemetry tracing: Setup installs
// a tracer provider that exports spans over OTLP/HTTP ([telemetry] in the
// config, and the standard OTEL_* variables), and Inject and Extract carry
// a span's W3C trace context in a message's metadata (abi.Metadata
// TraceParent and TraceState), so that what a command causes, in the
// event store and through the broker, stays in its trace.
//
// Tracing is off by default. Off, no provider is installed: the spans the
// host starts (Tracer) are OpenTelemetry's no-op ones, which record
// nothing, and no trace context is written into metadata (a no-op span
// has none unless a caller passed one in). The span names and attributes
// follow the OpenTelemetry messaging conventions where they apply
// (docs/tracing.md).
package telemetry
