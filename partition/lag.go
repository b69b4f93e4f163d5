package partition

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// lagDesc is the per-partition backlog of the partitions this instance
// owns: entries published and not yet handled (delivered but unacked, plus
// not yet delivered), summed over the unit's streams and lanes.
var lagDesc = prometheus.NewDesc("protean_partition_lag",
	"Entries of an owned partition not yet handled (pending plus not yet delivered), by consumer group and partition.",
	[]string{"group", "partition"}, nil)

// LagCollector returns a Prometheus collector of protean_partition_lag for
// the partitions this instance owns, read from Redis at each scrape (a few
// commands per owned stream, bounded by a 2 s timeout). Register it once.
func (c *Consumer) LagCollector() prometheus.Collector { return lagCollector{c} }

type lagCollector struct{ c *Consumer }

func (l lagCollector) Describe(ch chan<- *prometheus.Desc) { ch <- lagDesc }

func (l lagCollector) Collect(ch chan<- prometheus.Metric) {
	c := l.c
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, w := range c.workers() {
		var total int64
		for _, s := range c.streams(w.snapshot()) {
			pending, lag, err := streamCounts(ctx, c.opts.Leases.rdb, c.opts.Leases.key(s), w.lease.Group)
			if err != nil {
				if ctx.Err() != nil {
					return // out of time: report what was read
				}
				c.log.Warn("partition lag: reading stream", "group", w.lease.Group, "partition", w.lease.Unit, "stream", s, "error", err)
				continue
			}
			total += pending + lag
		}
		ch <- prometheus.MustNewConstMetric(lagDesc, prometheus.GaugeValue, float64(total), w.lease.Group, w.lease.Unit)
	}
}
