package subscription

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the subscriptions' Prometheus metrics, by consumer group and
// unit: lag (the head's global position minus the committed one), gaps
// held and abandoned, messages by outcome, leases acquired and lost. A nil
// registry keeps them unregistered.
type Metrics struct {
	lag       *prometheus.GaugeVec
	position  *prometheus.GaugeVec
	gaps      *prometheus.CounterVec
	messages  *prometheus.CounterVec
	leases    *prometheus.CounterVec
	owned     prometheus.Gauge
	openFails *prometheus.GaugeVec
}

// NewMetrics creates the metrics and registers them with reg, if not nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "protean_subscription_lag",
			Help: "Event-store subscription lag: the head global position of its category (or $all) minus the position it committed."}, []string{"group", "unit"}),
		position: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "protean_subscription_position",
			Help: "Global position an event-store subscription committed last."}, []string{"group", "unit"}),
		gaps: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "protean_subscription_gaps_total",
			Help: "Gaps in global positions a $all subscription met: held (it waited at one), abandoned (it passed one after the gap timeout)."}, []string{"group", "unit", "outcome"}),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "protean_subscription_messages_total",
			Help: "Event-store subscription messages by outcome: ok (effects committed), retried (an attempt failed), failed (recorded and skipped past its retries), held (parked behind a halted key), replayed (an operator's retry committed)."}, []string{"group", "unit", "outcome"}),
		leases: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "protean_subscription_leases_total",
			Help: "Event-store subscription leases by event: acquired, lost (renewal failed or fenced)."}, []string{"group", "event"}),
		owned: prometheus.NewGauge(prometheus.GaugeOpts{Name: "protean_subscriptions_owned",
			Help: "Event-store subscriptions this host holds the lease of."}),
		openFails: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "protean_subscription_failures_open",
			Help: "Open failure records (failed, held, retry) of an event-store subscription, as its owner last saw them."}, []string{"group", "unit"}),
	}
	if reg != nil {
		reg.MustRegister(m.lag, m.position, m.gaps, m.messages, m.leases, m.owned, m.openFails)
	}
	return m
}

func (m *Metrics) message(s Subscription, outcome string, n int) {
	if n > 0 {
		m.messages.WithLabelValues(s.Group, s.Unit(), outcome).Add(float64(n))
	}
}

func (m *Metrics) gap(s Subscription, outcome string) {
	m.gaps.WithLabelValues(s.Group, s.Unit(), outcome).Inc()
}

func (m *Metrics) lease(group, event string) { m.leases.WithLabelValues(group, event).Inc() }
