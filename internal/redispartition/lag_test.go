package redispartition_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/partition"
)

// The lag metrics are per consumer group, never per partition (a label per
// key is unbounded cardinality at 100,000 partitions): entries not handled
// summed over the owned partitions, the most of one, how many partitions
// lag, and the age of the oldest entry not handled. With key a's batch
// stalled (8 entries pending, 2 more not delivered) and key b handled,
// they read 10, 10, 1 and an age from the stream entry IDs; once a is
// released, 0, 0, 0, 0.
func TestLagMetricsArePerGroup(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	h := newEffects(r.store)
	stall, stalled, release := stallGate(t)
	h.gate = func(ctx context.Context, b delivery.Batch) {
		if b.Unit == partition.PartitionUnit("order", "a") {
			stall(ctx)
		}
	}
	r.pub.publish("order", "a", 10)
	r.pub.publish("order", "b", 3)
	c := r.consumer("host-a", h, time.Minute)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c.LagCollector())
	start(t, c)
	testwait.Recv(t, "key a's batch stalled", stalled)
	read := func() (string, error) {
		var b strings.Builder
		mfs, err := reg.Gather()
		if err != nil {
			return "", err
		}
		n := 0
		for _, mf := range mfs {
			n += len(mf.GetMetric())
		}
		fmt.Fprintf(&b, "%d series\n", n)
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				var labels []string
				for _, l := range m.GetLabel() {
					labels = append(labels, l.GetName()+"="+l.GetValue())
				}
				fmt.Fprintf(&b, "%s{%s} %g\n", mf.GetName(), strings.Join(labels, ","), m.GetGauge().GetValue())
			}
		}
		return b.String(), nil
	}
	value := func(out, name string) float64 {
		for _, line := range strings.Split(out, "\n") {
			if rest, ok := strings.CutPrefix(line, name+"{group=proj} "); ok {
				var v float64
				fmt.Sscan(rest, &v)
				return v
			}
		}
		return -1
	}
	testwait.For(t, "the lag of key a's stalled run, key b handled", func() (bool, string) {
		out, err := read()
		if err != nil {
			return false, err.Error()
		}
		return strings.HasPrefix(out, "4 series\n") && value(out, "protean_partition_lag") == 10 &&
			value(out, "protean_partition_lag_max") == 10 && value(out, "protean_partitions_lagging") == 1 &&
			value(out, "protean_partition_oldest_unhandled_seconds") > 0, out
	})
	release()
	r.waitApplied(h)
	testwait.For(t, "no lag once key a is handled", func() (bool, string) {
		out, err := read()
		if err != nil {
			return false, err.Error()
		}
		return value(out, "protean_partition_lag") == 0 && value(out, "protean_partition_lag_max") == 0 &&
			value(out, "protean_partitions_lagging") == 0 && value(out, "protean_partition_oldest_unhandled_seconds") == 0, out
	})
}
