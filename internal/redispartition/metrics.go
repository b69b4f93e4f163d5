package redispartition

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the partitioned consumer's Prometheus metrics, by consumer
// group: owned and halted partitions, lease acquisitions and losses,
// messages handled by outcome, and batch latency. A nil registry keeps
// them unregistered.
type Metrics struct {
	owned        *prometheus.GaugeVec
	halted       *prometheus.GaugeVec
	acquisitions *prometheus.CounterVec
	losses       *prometheus.CounterVec
	handovers    *prometheus.CounterVec
	messages     *prometheus.CounterVec
	latency      *prometheus.HistogramVec
}

// NewMetrics creates the metrics and registers them with reg, if not nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		owned: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "protean_partitions_owned",
			Help: "Partitions this instance holds a lease on, by consumer group."}, []string{"group"}),
		halted: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "protean_partitions_halted",
			Help: "Partitions halted on a poison message (seen by the last whole walk of the indexes), by consumer group."}, []string{"group"}),
		acquisitions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "protean_partition_lease_acquisitions_total",
			Help: "Partition leases this instance acquired, by consumer group."}, []string{"group"}),
		losses: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "protean_partition_lease_losses_total",
			Help: "Partition leases this instance lost before releasing them (expired, or fenced by a newer owner)."}, []string{"group"}),
		handovers: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "protean_partition_handovers_total",
			Help: "Partitions this instance released for another host to take, holding more than its fair share."}, []string{"group"}),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "protean_partition_messages_total",
			Help: "Partitioned messages by outcome: ok (effects committed), duplicate (applied before, acked without handling), failed (an attempt failed on the message's own), gap (a message that follows lost ones)."}, []string{"group", "outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "protean_partition_batch_seconds",
			Help: "Time to handle and commit one batch of a partition.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"group"}),
	}
	if reg != nil {
		reg.MustRegister(m.owned, m.halted, m.acquisitions, m.losses, m.handovers, m.messages, m.latency)
	}
	return m
}

func (m *Metrics) setOwned(group string, n int)  { m.owned.WithLabelValues(group).Set(float64(n)) }
func (m *Metrics) setHalted(group string, n int) { m.halted.WithLabelValues(group).Set(float64(n)) }
func (m *Metrics) acquired(group string)         { m.acquisitions.WithLabelValues(group).Inc() }
func (m *Metrics) lost(group string)             { m.losses.WithLabelValues(group).Inc() }
func (m *Metrics) handedOver(group string, n int) {
	m.handovers.WithLabelValues(group).Add(float64(n))
}
func (m *Metrics) handled(group, outcome string, n int) {
	m.messages.WithLabelValues(group, outcome).Add(float64(n))
}
func (m *Metrics) batch(group string, d time.Duration) {
	m.latency.WithLabelValues(group).Observe(d.Seconds())
}
