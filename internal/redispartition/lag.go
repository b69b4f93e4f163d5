package redispartition

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The lag metrics are per consumer group over the partitions this
// instance owns, never per partition: a label per key would be unbounded
// cardinality at 100,000 partitions. Per-partition detail is in
// `partitions list`, the API and the status page.
var (
	lagDesc = prometheus.NewDesc("protean_partition_lag",
		"Entries not yet handled (pending plus not yet delivered), summed over the partitions this instance owns, by consumer group.",
		[]string{"group"}, nil)
	lagMaxDesc = prometheus.NewDesc("protean_partition_lag_max",
		"The most entries not yet handled of one partition this instance owns, by consumer group.",
		[]string{"group"}, nil)
	laggingDesc = prometheus.NewDesc("protean_partitions_lagging",
		"Partitions this instance owns with entries not yet handled, by consumer group.",
		[]string{"group"}, nil)
	oldestDesc = prometheus.NewDesc("protean_partition_oldest_unhandled_seconds",
		"Age of the oldest entry not yet handled of the partitions this instance owns (0 if none; by its stream entry ID, Redis's clock), by consumer group.",
		[]string{"group"}, nil)
)

// LagCollector returns a Prometheus collector of the lag metrics of the
// partitions this instance owns, read from Redis at each scrape (a few
// commands per owned stream, bounded by a 2 s timeout). Register it once.
func (c *Consumer) LagCollector() prometheus.Collector { return lagCollector{c} }

type lagCollector struct{ c *Consumer }

func (l lagCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{lagDesc, lagMaxDesc, laggingDesc, oldestDesc} {
		ch <- d
	}
}

// groupLag is one group's lag over the owned partitions.
type groupLag struct {
	total, max, lagging int64
	oldest              time.Time
}

func (l lagCollector) Collect(ch chan<- prometheus.Metric) {
	c := l.c
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	groups := map[string]*groupLag{}
	defer func() {
		now := c.opts.Clock.Now()
		for group, g := range groups {
			age := 0.0
			if !g.oldest.IsZero() {
				age = max(0, now.Sub(g.oldest).Seconds())
			}
			for _, m := range []struct {
				d *prometheus.Desc
				v float64
			}{{lagDesc, float64(g.total)}, {lagMaxDesc, float64(g.max)}, {laggingDesc, float64(g.lagging)}, {oldestDesc, age}} {
				ch <- prometheus.MustNewConstMetric(m.d, prometheus.GaugeValue, m.v, group)
			}
		}
	}()
	for _, w := range c.workers() {
		g := groups[w.lease.Group]
		if g == nil {
			g = &groupLag{}
			groups[w.lease.Group] = g
		}
		var unit int64
		for _, s := range c.streams(w.snapshot()) {
			k := c.opts.Leases.key(s)
			b, err := readBacklog(ctx, c.opts.Leases.rdb, k, w.lease.Group)
			if err == nil {
				var at time.Time
				if at, err = b.oldest(ctx, c.opts.Leases.rdb, k, w.lease.Group); err == nil && !at.IsZero() &&
					(g.oldest.IsZero() || at.Before(g.oldest)) {
					g.oldest = at
				}
			}
			if err != nil {
				if ctx.Err() != nil {
					return // out of time: report what was read
				}
				c.log.Warn("partition lag: reading stream", "group", w.lease.Group, "partition", w.lease.Unit, "stream", s, "error", err)
				continue
			}
			unit += b.pending + b.lag
		}
		g.total += unit
		g.max = max(g.max, unit)
		if unit > 0 {
			g.lagging++
		}
	}
}
