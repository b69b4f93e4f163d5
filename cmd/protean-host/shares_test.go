package main

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/config"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// The tenants' shares reach /metrics: a granted call counts and waits in
// the histogram, a call that gave up counts, the slot in use shows.
func TestShareCollector(t *testing.T) {
	s := host.NewScheduler(host.SchedulerOptions{Slots: 1})
	a := s.Tenant("a")
	require.NoError(t, a.Take(context.Background()))
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	require.ErrorIs(t, s.Tenant("b").Take(ctx), host.ErrNoInstance)
	reg := prometheus.NewRegistry()
	reg.MustRegister(newShareCollector(s))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				key += "," + l.GetName() + "=" + l.GetValue()
			}
			switch {
			case m.GetHistogram() != nil:
				got[key] = float64(m.GetHistogram().GetSampleCount())
			case m.GetCounter() != nil:
				got[key] = m.GetCounter().GetValue()
			default:
				got[key] = m.GetGauge().GetValue()
			}
		}
	}
	require.Equal(t, 1.0, got["protean_tenant_calls_total,tenant=a"])
	require.Equal(t, 1.0, got["protean_tenant_queue_wait_seconds,tenant=a"])
	require.Equal(t, 1.0, got["protean_tenant_queue_gave_up_total,tenant=b"])
	require.Equal(t, 1.0, got["protean_tenant_slots,state=running,tenant=a"])
	require.Equal(t, 1.0, got["protean_tenant_slots,state=max,tenant="])
	require.Equal(t, 0.0, got["protean_tenant_queued_calls,tenant=b"])
	a.Done()
}

// A running host reports its tenants' shares: a command's guest call
// counts for tenant default. A host whose config names no tenant shares
// nothing (config.GuestSlots) unless guest_concurrency is set, and then
// reports no shares.
func TestHostReportsTenantShares(t *testing.T) {
	plain := embedded(t, wasmbuild.Examples(t))
	require.Equal(t, 200, post(t, plain, "PlaceOrder", `{"order_id":"o-1","client_id":"c-1","total":1}`).code)
	require.NotContains(t, get(t, plain, "/metrics").raw, "protean_tenant_calls_total")

	h, err := startHostWith(t, "domain.toml", wasmbuild.Examples(t), func(c *config.Config) { c.Plugins.GuestConcurrency = 4 })
	require.NoError(t, err)
	require.Equal(t, 200, post(t, h, "PlaceOrder", `{"order_id":"o-1","client_id":"c-1","total":1}`).code)
	m := get(t, h, "/metrics").raw
	for _, want := range []string{`protean_tenant_calls_total{tenant="default"}`, `protean_tenant_queue_wait_seconds_count{tenant="default"}`,
		`protean_tenant_slots{state="max",tenant=""} 4`, `protean_tenant_queue_gave_up_total{tenant="default"} 0`} {
		require.Contains(t, m, want)
	}
}
