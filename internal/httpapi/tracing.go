package httpapi

import (
	"net/http"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
)

// traced reports whether a request of the route pattern gets a server span
// (Options.Tracing): not the health check, the status page or pprof, which
// are polled, not acted on.
func traced(pattern string) bool {
	_, path, _ := strings.Cut(pattern, " ")
	return path != "/healthz" && path != "/{$}" && !strings.HasPrefix(path, "/debug/pprof/")
}

// traceRoute serves h under a server span named by its route pattern
// ("POST /v1/commands/{type}": the route, never the path, so the name
// stays low-cardinality), a child of the request's traceparent if it has
// one, and answers that span's traceparent (and tracestate) so a client
// can find its request's trace.
func traceRoute(pattern string, h http.HandlerFunc) http.HandlerFunc {
	answer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		propagation.TraceContext{}.Inject(r.Context(), propagation.HeaderCarrier(w.Header()))
		h(w, r)
	})
	return otelhttp.NewHandler(answer, pattern,
		otelhttp.WithPropagators(propagation.TraceContext{}),
		otelhttp.WithSpanNameFormatter(func(op string, _ *http.Request) string { return op })).ServeHTTP
}
