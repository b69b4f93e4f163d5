package subscription_test

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/subscription"
	"github.com/proteanhq/protean-host/internal/testwait"
)

// A worker fenced out of its unit (a newer owner claimed it: the lease
// lapsed while the worker stalled, and another host took it) counts as a
// lost lease, as the metric's help says ("renewal failed or fenced"); only
// a failed renewal counted.
func TestFencedWorkerCountsALostLease(t *testing.T) {
	t.Parallel()
	h := memoryHarness(t)
	pos := appendEvents(t, h.events, "order", []string{"a"}, 3)
	r := newRecorder(h.uow)
	claimed := false
	r.setFail(func(_ string, m delivery.Message) error {
		if m.GlobalPosition == pos[1] && !claimed {
			claimed = true // the handler runs on the worker's goroutine only
			if _, err := h.positions.Claim(t.Context(), "proj", "order"); err != nil {
				return err
			}
		}
		return nil
	})
	reg := prometheus.NewRegistry()
	h.consumer(t, r, consumerOpts{subs: []subscription.Subscription{{Group: "proj", Category: "order"}}, batch: 1,
		metrics: subscription.NewMetrics(reg)})
	testwait.For(t, "the fenced worker counts a lost lease", func() (bool, string) {
		n := leases(t, reg, "lost")
		return n == 1, fmt.Sprint("lost ", n)
	})
	r.waitApplied(t, "proj", pos) // the next worker, after the fence, handles the rest once
	require.Equal(t, 1.0, leases(t, reg, "lost"))
}

func leases(t *testing.T, reg *prometheus.Registry, event string) float64 {
	return metric(t, reg, "protean_subscription_leases_total", map[string]string{"group": "proj", "event": event})
}
