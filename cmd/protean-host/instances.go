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
	codeLoaded, codeReleased    *prometheus.Desc
	codeLoads                   *prometheus.Desc
}

func newInstanceCollector(set func() *host.Set) *instanceCollector {
	return &instanceCollector{set: set,
		instances: prometheus.NewDesc("protean_module_instances", "Instances of each running module by state: live (made and not thrown away), idle, max (max_instances).", []string{"module", "state"}, nil),
		created:   prometheus.NewDesc("protean_module_instances_created_total", "Instances made of each running module since it loaded.", []string{"module"}, nil),
		dropped: prometheus.NewDesc("protean_module_instances_discarded_total",
			"Instances of each running module thrown away since it loaded, by reason: failed (a call failed), memory (over recycle_above_mb), exited (the guest exited), idle (unused for instance_idle_ms).", []string{"module", "reason"}, nil),
		codeLoaded: prometheus.NewDesc("protean_module_code_loaded", "1 if the module's compiled code is in memory, 0 if it was released (code_idle_ms).", []string{"module"}, nil),
		codeReleased: prometheus.NewDesc("protean_module_code_released_total",
			"Releases of each running module's compiled code since it loaded (no instance and no call for code_idle_ms).", []string{"module"}, nil),
		codeLoads: prometheus.NewDesc("protean_module_code_loads_total",
			"Compiles of each running module's code after a release, since it loaded (from cache_dir, at the first call after the release).", []string{"module"}, nil),
	}
}

func (c *instanceCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.instances
	ch <- c.created
	ch <- c.dropped
	ch <- c.codeLoaded
	ch <- c.codeReleased
	ch <- c.codeLoads
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
		loaded := 0.0
		if st.CodeLoaded {
			loaded = 1
		}
		ch <- prometheus.MustNewConstMetric(c.codeLoaded, prometheus.GaugeValue, loaded, m.File)
		ch <- prometheus.MustNewConstMetric(c.codeReleased, prometheus.CounterValue, float64(st.CodeReleased), m.File)
		ch <- prometheus.MustNewConstMetric(c.codeLoads, prometheus.CounterValue, float64(st.CodeLoads), m.File)
	}
}
