package groups

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the groups' Prometheus collectors.
type Metrics struct {
	delivered *prometheus.CounterVec
}

// NewMetrics creates the collectors and registers them with reg (nil: not
// registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		delivered: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "protean_deliveries_total",
			Help: "Broker deliveries to event handlers, projectors and process managers, by outcome (ack, nack, reject, skip, release)."}, []string{"handler", "outcome"}),
	}
	if reg != nil {
		reg.MustRegister(m.delivered)
	}
	return m
}

func (m *Metrics) delivery(handler, outcome string) {
	m.delivered.WithLabelValues(handler, outcome).Inc()
}
