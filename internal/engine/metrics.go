package engine

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/unitofwork"
)

// Metrics are the engine's Prometheus collectors.
type Metrics struct {
	calls    *prometheus.CounterVec
	messages *prometheus.CounterVec
	duration *prometheus.HistogramVec
	commits  *prometheus.CounterVec
	// inFlight is the calls into each handler now running: a call that
	// outlives a stop, or a stuck guest, shows here.
	inFlight *prometheus.GaugeVec
	// refusals counts scope refusals by module, its tenant and the
	// tenant whose data it reached for (what a guest or client is never
	// told).
	refusals *prometheus.CounterVec
}

// NewMetrics creates the collectors and registers them with reg (nil: not
// registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "protean_handler_calls_total",
			Help: "Calls into handler modules, by outcome (ok, timeout, trap, failed, output, canceled, no_instance, host_limit, guest_memory, error)."}, []string{"module", "handler", "outcome"}),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "protean_handler_messages_total",
			Help: "Messages passed to handler modules."}, []string{"module", "handler"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "protean_handler_call_seconds",
			Help: "Duration of one call into a handler module.", Buckets: prometheus.ExponentialBuckets(0.0001, 4, 9)}, []string{"module", "handler"}),
		commits: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "protean_unit_of_work_commits_total",
			Help: "Unit-of-work commits, by outcome (ok, conflict, key_rejected, error)."}, []string{"handler", "outcome"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "protean_handler_calls_in_flight",
			Help: "Calls into handler modules now running."}, []string{"module", "handler"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "protean_scope_refusals_total",
			Help: "Host functions and effects refused as outside the module's scope, by module file, its tenant, and the tenant whose data or command it reached for (owner; empty for none)."},
			[]string{"module", "tenant", "owner"}),
	}
	if reg != nil {
		reg.MustRegister(m.calls, m.messages, m.duration, m.commits, m.inFlight, m.refusals)
	}
	return m
}

// begin counts a call in flight; the function it returns ends it.
func (m *Metrics) begin(r host.Route) func() {
	g := m.inFlight.WithLabelValues(r.Module.Manifest.Module.Name, r.Handler.Name)
	g.Inc()
	return g.Dec
}

func (m *Metrics) call(r host.Route, d time.Duration, n int, err error) {
	mod, h := r.Module.Manifest.Module.Name, r.Handler.Name
	outcome := "ok"
	switch {
	case err == nil:
	case errors.Is(err, host.ErrTimeout):
		outcome = "timeout"
	case errors.Is(err, host.ErrTrap):
		outcome = "trap"
	case errors.Is(err, host.ErrFailed):
		outcome = "failed"
	case errors.Is(err, host.ErrOutput):
		outcome = "output"
	case errors.Is(err, host.ErrCanceled):
		outcome = "canceled"
	case errors.Is(err, host.ErrNoInstance):
		outcome = "no_instance"
	case errors.Is(err, host.ErrHostLimit):
		outcome = "host_limit"
	case errors.Is(err, host.ErrGuestMemory):
		outcome = "guest_memory"
	default:
		outcome = "error"
	}
	m.calls.WithLabelValues(mod, h, outcome).Inc()
	m.messages.WithLabelValues(mod, h).Add(float64(n))
	m.duration.WithLabelValues(mod, h).Observe(d.Seconds())
}

func (m *Metrics) commit(r host.Route, err error) {
	outcome := "ok"
	var ke *unitofwork.KeyError
	switch {
	case err == nil:
	case unitofwork.Conflict(err):
		outcome = "conflict"
	case errors.As(err, &ke):
		outcome = "key_rejected"
	default:
		outcome = "error"
	}
	m.commits.WithLabelValues(r.Handler.Name, outcome).Inc()
}
