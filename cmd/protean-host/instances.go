package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/proteanhq/protean-host/internal/host"
)

// instanceCollector reports each running module's instances
// (host.InstanceStats) as metrics. The counters are the module's since
// it loaded: a reload that replaces a module starts its counts again, as
// a restart does.
type instanceCollector struct {
	set                         func() *host.Set
	instances, created, dropped *prometheus.Desc
}

func newInstanceCollector(set func() *host.Set) *instanceCollector {
	return &instanceCollector{set: set,
		instances: prometheus.NewDesc("protean_module_instances", "Instances of each running module by state: live (made and not thrown away), idle, max (max_instances).", []string{"module", "state"}, nil),
		created:   prometheus.NewDesc("protean_module_instances_created_total", "Instances made of each running module since it loaded.", []string{"module"}, nil),
		dropped: prometheus.NewDesc("protean_module_instances_discarded_total",
			"Instances of each running module thrown away since it loaded, by reason: failed (a call failed), memory (over recycle_above_mb), exited (the guest exited), idle (unused for instance_idle_ms).", []string{"module", "reason"}, nil),
	}
}

func (c *instanceCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.instances
	ch <- c.created
	ch <- c.dropped
}

func (c *instanceCollector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c.set().Modules() {
		st := m.Instances()
		for state, n := range map[string]int{"live": st.Live, "idle": st.Idle, "max": st.Max} {
			ch <- prometheus.MustNewConstMetric(c.instances, prometheus.GaugeValue, float64(n), m.File, state)
		}
		ch <- prometheus.MustNewConstMetric(c.created, prometheus.CounterValue, float64(st.Created), m.File)
		for reason, n := range st.Discarded {
			ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(n), m.File, reason)
		}
	}
}
