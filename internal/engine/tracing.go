package engine

import (
	"cmp"
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/telemetry"
)

// The engine's spans (docs/tracing.md), of telemetry.Tracer: no-op ones,
// which record nothing, unless the host traces.
//
//   - dispatch {command type}: a command, from its check to its commit and
//     its follow-up commands (each a dispatch span of its own, a child). Its
//     span context is the creation context of the events it commits: they
//     carry it in their metadata (traceparent).
//   - process {category}: a delivery's run (handleRun), the root of a
//     trace of its own, linked to the creation context of each message
//     it handles; the creation context of the events the run commits.
//   - handle {module}: one guest call, a batch of messages for one
//     handler, under its dispatch or its run's process span.
//   - commit: the unit of work of a command, or a run's group commit.

// startDispatch starts the span of the command typ (md its metadata, id
// its message id).
func (e *Engine) startDispatch(ctx context.Context, typ, id string, md *abi.Metadata) (context.Context, trace.Span) {
	ctx, span := e.tracer.Start(ctx, "dispatch "+typ)
	if span.IsRecording() {
		span.SetAttributes(
			attribute.String("messaging.operation.name", "dispatch"),
			attribute.String("messaging.message.id", id),
			attribute.String("messaging.message.conversation_id", md.CorrelationID),
			attribute.String("protean.command.type", typ),
			attribute.Int("protean.cascade_depth", md.CascadeDepth),
			attribute.String("protean.tenant", md.Tenant))
	}
	return ctx, span
}

// startProcess starts the span of a delivery's run b (envs: the
// envelopes of its messages the handler handles): process {category}, a
// consumer span with no parent, linked to each message's creation
// context. Its guest call, commit and follow-up commands are its
// children, and it is the creation context of the events the run commits.
func (e *Engine) startProcess(ctx context.Context, b delivery.Batch, envs []abi.Envelope) (context.Context, trace.Span) {
	if !telemetry.Enabled() || len(b.Messages) == 0 {
		return ctx, trace.SpanFromContext(context.Background()) // records nothing
	}
	m := b.Messages[0]
	cat := cmp.Or(m.Category, eventstore.Category(m.EventStream), b.Source)
	links := make([]trace.Link, 0, len(envs))
	for _, env := range envs {
		if sc := telemetry.SpanContext(env.Metadata); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	ctx, span := e.tracer.Start(trace.ContextWithSpanContext(ctx, trace.SpanContext{}), "process "+cat,
		trace.WithSpanKind(trace.SpanKindConsumer), trace.WithLinks(links...))
	if span.IsRecording() {
		attrs := []attribute.KeyValue{
			attribute.String("messaging.operation.name", "process"),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.destination.name", b.Source),
			attribute.String("messaging.consumer.group.name", b.Group),
			attribute.Int("messaging.batch.message_count", len(b.Messages)),
			attribute.String("messaging.message.id", m.ID),
		}
		if b.Unit != "" {
			attrs = append(attrs, attribute.String("protean.unit", b.Unit), attribute.Int64("protean.generation", b.Generation))
		}
		if m.PartitionKey != "" {
			attrs = append(attrs, attribute.String("protean.partition.key", m.PartitionKey))
		}
		if env := envs; len(env) > 0 && env[0].Metadata != nil {
			attrs = append(attrs, attribute.String("messaging.message.conversation_id", env[0].Metadata.CorrelationID))
		}
		span.SetAttributes(attrs...)
	}
	return ctx, span
}

// startHandle starts the span of a guest call of route with envs.
func (e *Engine) startHandle(ctx context.Context, route host.Route, envs []abi.Envelope) (context.Context, trace.Span) {
	m := route.Module
	ctx, span := e.tracer.Start(ctx, "handle "+m.Name())
	if span.IsRecording() {
		attrs := []attribute.KeyValue{
			attribute.String("protean.handler", route.Handler.Name),
			attribute.String("protean.module.name", m.Name()),
			attribute.String("protean.module.sha256", m.SHA256),
			attribute.String("protean.tenant", m.Tenant),
			attribute.Int("messaging.batch.message_count", len(envs)),
			attribute.String("messaging.message.id", envs[0].ID),
			attribute.String("protean.message.type", envs[0].Type),
		}
		if m.Manifest != nil {
			attrs = append(attrs, attribute.String("protean.module.version", m.Manifest.Module.Version))
		}
		span.SetAttributes(attrs...)
	}
	return ctx, span
}

// failedResults marks span failed with the first error of rs, a call's
// results.
func failedResults(span trace.Span, rs []result) {
	if !span.IsRecording() {
		return
	}
	for _, r := range rs {
		if r.err != nil {
			span.SetStatus(codes.Error, abi.Clip(r.err.Error(), telemetry.MaxErrorBytes))
			return
		}
	}
}
