package delivery

import (
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Outage turns a run of infrastructure failures of one component into one
// WARN line when it starts, a reminder at most every Remind while it
// lasts, and one INFO line when it ends, so that a database restart does
// not bury real errors under a line per attempt. Every failure still
// counts in Count. An Outage is safe for concurrent use; the zero value is
// not usable: use [NewOutage].
type Outage struct {
	what  string
	log   *slog.Logger
	now   func() time.Time
	count func()

	mu       sync.Mutex
	since    time.Time // zero while healthy
	reminded time.Time
	failures int
}

// Remind is how often a continuing outage is logged again.
const Remind = time.Minute

// NewOutage returns an Outage for the component what (a log value such as
// "outbox relay"); count, if not nil, is called on every failure (a
// metric); now nil is time.Now.
func NewOutage(what string, log *slog.Logger, now func() time.Time, count func()) *Outage {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if now == nil {
		now = time.Now
	}
	if count == nil {
		count = func() {}
	}
	return &Outage{what: what, log: log, now: now, count: count}
}

// Fail records one infrastructure failure; attrs are logged with it when
// it is logged.
func (o *Outage) Fail(err error, attrs ...any) {
	o.count()
	now := o.now()
	o.mu.Lock()
	o.failures++
	first := o.since.IsZero()
	remind := !first && now.Sub(o.reminded) >= Remind
	if first {
		o.since = now
	}
	if first || remind {
		o.reminded = now
	}
	since, n := o.since, o.failures
	o.mu.Unlock()
	switch {
	case first:
		o.log.Warn(o.what+": infrastructure unavailable; retrying without end, nothing is charged to the messages",
			append([]any{"error", err}, attrs...)...)
	case remind:
		o.log.Warn(o.what+": infrastructure still unavailable; retrying",
			append([]any{"error", err, "failures", n, "for", now.Sub(since).Round(time.Millisecond)}, attrs...)...)
	}
}

// OK records a success: it ends an outage in progress, logging how long
// it lasted.
func (o *Outage) OK() {
	o.mu.Lock()
	if o.since.IsZero() {
		o.mu.Unlock()
		return
	}
	since, n := o.since, o.failures
	o.since, o.failures = time.Time{}, 0
	o.mu.Unlock()
	o.log.Info(o.what+": infrastructure recovered", "failures", n, "for", o.now().Sub(since).Round(time.Millisecond))
}

// Down reports whether an outage is in progress.
func (o *Outage) Down() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return !o.since.IsZero()
}

// Metrics count infrastructure failures by component
// (protean_infrastructure_failures_total). A nil *Metrics counts nothing.
type Metrics struct{ failures *prometheus.CounterVec }

// NewMetrics creates the metrics and registers them with reg, if not nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "protean_infrastructure_failures_total",
		Help: "Attempts that failed on infrastructure (a database or broker unreachable, restarting or refusing), by component; retried without end and never charged to a message."},
		[]string{"component"})}
	if reg != nil {
		reg.MustRegister(m.failures)
	}
	return m
}

// Outage returns an Outage for component that counts its failures here.
func (m *Metrics) Outage(component string, log *slog.Logger, now func() time.Time) *Outage {
	var count func()
	if m != nil {
		c := m.failures.WithLabelValues(component)
		count = c.Inc
	}
	return NewOutage(component, log, now, count)
}
