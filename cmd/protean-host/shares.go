package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/proteanhq/protean-host/internal/host"
)

// shareCollector reports each tenant's share of the guest slots
// (host.ShareStats) as metrics: how long calls waited for a slot (and
// their calls_per_second), the calls granted and those that gave up
// waiting, the slots in use, and the wall time the calls ran. The
// loader, and so its scheduler, lives as long as the process: the counts
// survive reloads.
type shareCollector struct {
	sched                                                      *host.Scheduler
	wait, calls, gaveUp, slots, qd, guest, coreWaits, coreWait *prometheus.Desc
}

func newShareCollector(sched *host.Scheduler) *shareCollector {
	return &shareCollector{sched: sched,
		wait: prometheus.NewDesc("protean_tenant_queue_wait_seconds",
			"How long each tenant's guest calls waited for their share (calls_per_second, then a guest slot) before they ran.", []string{"tenant"}, nil),
		calls: prometheus.NewDesc("protean_tenant_calls_total", "Guest calls of each tenant granted a slot.", []string{"tenant"}, nil),
		gaveUp: prometheus.NewDesc("protean_tenant_queue_gave_up_total",
			"Guest calls of each tenant that reached their deadline (or were canceled) waiting for their share; they fail as calls that found no instance.", []string{"tenant"}, nil),
		slots: prometheus.NewDesc("protean_tenant_slots",
			"Guest slots by tenant and state: running (in use now), max (its max_concurrency), weight; tenant \"\" with state max is guest_concurrency.", []string{"tenant", "state"}, nil),
		qd: prometheus.NewDesc("protean_tenant_queued_calls", "Guest calls of each tenant queued for a slot now.", []string{"tenant"}, nil),
		guest: prometheus.NewDesc("protean_tenant_guest_seconds_total",
			"Wall time each tenant's guest calls ran in an instance, host functions they called included; not CPU time (Go cannot measure a goroutine's), and without the wait for a slot or an instance.", []string{"tenant"}, nil),
		coreWaits: prometheus.NewDesc("protean_tenant_core_waits_total",
			"Waits of each tenant's long guest calls (past a millisecond of guest code) and instance starts for a turn at the cores; while two tenants are active one core is kept from long calls.", []string{"tenant"}, nil),
		coreWait: prometheus.NewDesc("protean_tenant_core_wait_seconds_total",
			"Time each tenant's long guest calls and instance starts waited for a turn at the cores.", []string{"tenant"}, nil),
	}
}

func (c *shareCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.wait, c.calls, c.gaveUp, c.slots, c.qd, c.guest, c.coreWaits, c.coreWait} {
		ch <- d
	}
}

func (c *shareCollector) Collect(ch chan<- prometheus.Metric) {
	if c.sched == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(c.slots, prometheus.GaugeValue, float64(c.sched.Slots()), "", "max")
	for _, st := range c.sched.Stats() {
		buckets := make(map[float64]uint64, len(host.WaitBuckets))
		var n uint64
		for i, le := range host.WaitBuckets {
			n += uint64(st.Waits[i])
			buckets[le] = n
		}
		n += uint64(st.Waits[len(host.WaitBuckets)])
		ch <- prometheus.MustNewConstHistogram(c.wait, n, st.WaitSeconds, buckets, st.Tenant)
		ch <- prometheus.MustNewConstMetric(c.calls, prometheus.CounterValue, float64(st.Calls), st.Tenant)
		ch <- prometheus.MustNewConstMetric(c.gaveUp, prometheus.CounterValue, float64(st.GaveUp), st.Tenant)
		ch <- prometheus.MustNewConstMetric(c.guest, prometheus.CounterValue, st.GuestSeconds, st.Tenant)
		ch <- prometheus.MustNewConstMetric(c.coreWaits, prometheus.CounterValue, float64(st.CoreWaits), st.Tenant)
		ch <- prometheus.MustNewConstMetric(c.coreWait, prometheus.CounterValue, st.CoreWaitSeconds, st.Tenant)
		for state, v := range map[string]int{"running": st.Running, "max": st.MaxConcurrency, "weight": st.Weight} {
			ch <- prometheus.MustNewConstMetric(c.slots, prometheus.GaugeValue, float64(v), st.Tenant, state)
		}
		ch <- prometheus.MustNewConstMetric(c.qd, prometheus.GaugeValue, float64(st.Queued), st.Tenant)
	}
}
