package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/proteanhq/protean-host/internal/host"
)

// instanceCollector reports each running module's instances
// (host.InstanceStats) and use of the host (host.Usage) as metrics, and
// the same summed per tenant (host.Tenants). The module counters are the
// module's since it loaded: a reload that replaces a module starts its
// counts again, as a restart does. The tenant metrics here are gauges,
// true of the running set now; a tenant's counters (calls, guest time)
// are its share's (shareCollector), which survive reloads.
type instanceCollector struct {
	set                         func() *host.Set
	instances, created, dropped *prometheus.Desc
	codeLoaded, codeReleased    *prometheus.Desc
	codeLoads                   *prometheus.Desc
	guest, memory, code         *prometheus.Desc
	tenantInstances             *prometheus.Desc
	tenantMemory, tenantCode    *prometheus.Desc
}

// codeEstimate says how the compiled-code metrics are estimated (see
// host's codeFactor).
const codeEstimate = "Estimate: the module file's size x 4, the ratio of wazero's compiled code to the file measured on Go guests; 0 while the code is released (code_idle_ms)."

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
		guest: prometheus.NewDesc("protean_module_guest_seconds_total",
			"Wall time each running module's guest calls ran in an instance since it loaded, host functions they called included; not CPU time.", []string{"module"}, nil),
		memory: prometheus.NewDesc("protean_module_guest_memory_bytes",
			"Bytes the linear memories of each running module's live instances hold now (busy and idle, Extism kernel memory included).", []string{"module"}, nil),
		code: prometheus.NewDesc("protean_module_compiled_code_estimated_bytes",
			"Each running module's compiled code in memory. "+codeEstimate, []string{"module"}, nil),
		tenantInstances: prometheus.NewDesc("protean_tenant_instances",
			"Instances of each tenant's running modules by state: live (made and not thrown away), idle.", []string{"tenant", "state"}, nil),
		tenantMemory: prometheus.NewDesc("protean_tenant_guest_memory_bytes",
			"Bytes the linear memories of each tenant's live instances hold now (protean_module_guest_memory_bytes summed by tenant).", []string{"tenant"}, nil),
		tenantCode: prometheus.NewDesc("protean_tenant_compiled_code_estimated_bytes",
			"Each tenant's running modules' compiled code in memory. "+codeEstimate, []string{"tenant"}, nil),
	}
}

func (c *instanceCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.instances, c.created, c.dropped, c.codeLoaded, c.codeReleased, c.codeLoads,
		c.guest, c.memory, c.code, c.tenantInstances, c.tenantMemory, c.tenantCode} {
		ch <- d
	}
}

func (c *instanceCollector) Collect(ch chan<- prometheus.Metric) {
	mods := c.set().Modules()
	for _, m := range mods {
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
		u := m.Usage()
		ch <- prometheus.MustNewConstMetric(c.guest, prometheus.CounterValue, u.GuestSeconds, m.File)
		ch <- prometheus.MustNewConstMetric(c.memory, prometheus.GaugeValue, float64(u.GuestMemoryBytes), m.File)
		ch <- prometheus.MustNewConstMetric(c.code, prometheus.GaugeValue, float64(u.CodeBytes), m.File)
	}
	for _, t := range host.Tenants(mods, nil) {
		ch <- prometheus.MustNewConstMetric(c.tenantInstances, prometheus.GaugeValue, float64(t.Live), t.Tenant, "live")
		ch <- prometheus.MustNewConstMetric(c.tenantInstances, prometheus.GaugeValue, float64(t.Idle), t.Tenant, "idle")
		ch <- prometheus.MustNewConstMetric(c.tenantMemory, prometheus.GaugeValue, float64(t.GuestMemoryBytes), t.Tenant)
		ch <- prometheus.MustNewConstMetric(c.tenantCode, prometheus.GaugeValue, float64(t.CodeBytes), t.Tenant)
	}
}
