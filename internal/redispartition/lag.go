package redispartition

import (
	"context"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
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
// partitions this instance owns, read from Redis at each scrape in
// pipelined batches (lagBatch streams a round trip: one XINFO GROUPS per
// owned stream, then one XPENDING or XRANGE per stream with a backlog),
// bounded by lagTimeout. Register it once.
func (c *Consumer) LagCollector() prometheus.Collector { return lagCollector{c} }

// lagBatch is how many streams one pipelined round trip of the lag scrape
// reads; lagTimeout bounds the whole scrape (what was read by then is
// reported).
const (
	lagBatch   = 1000
	lagTimeout = 5 * time.Second
)

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

// lagStream is one owned stream the scrape reads, and what it read.
type lagStream struct {
	worker int    // index in the scrape's workers
	stream string // the stream's name, key without the prefix
	key    string
	b      backlog
	at     time.Time
	err    error
}

func (l lagCollector) Collect(ch chan<- prometheus.Metric) {
	c := l.c
	ctx, cancel := context.WithTimeout(context.Background(), lagTimeout)
	defer cancel()
	ws := c.workers()
	var ss []lagStream
	for i, w := range ws {
		for _, s := range c.streams(w.snapshot()) {
			ss = append(ss, lagStream{worker: i, stream: s, key: c.opts.Leases.key(s)})
		}
	}
	group := func(s *lagStream) string { return ws[s.worker].lease.Group }
	rdb := c.opts.Leases.rdb
	for i := 0; i < len(ss) && ctx.Err() == nil; i += lagBatch {
		batch := ss[i:min(i+lagBatch, len(ss))]
		readBacklogs(ctx, rdb, batch, group)
		for j := range batch {
			// Entries applied whose acks the worker holds (AckDelay)
			// are handled: pending in Redis only.
			s := &batch[j]
			s.b.pending = max(0, s.b.pending-int64(ws[s.worker].heldOn(s.stream)))
		}
		readOldest(ctx, rdb, batch, group)
	}
	groups := map[string]*groupLag{}
	units := make([]int64, len(ws))
	read := make([]bool, len(ws))
	for i := range ss {
		s := &ss[i]
		g := groups[group(s)]
		if g == nil {
			g = &groupLag{}
			groups[group(s)] = g
		}
		if s.err != nil {
			if ctx.Err() == nil {
				c.log.Warn("partition lag: reading stream", "group", group(s), "partition", ws[s.worker].lease.Unit, "stream", s.key, "error", s.err)
			}
			continue
		}
		read[s.worker] = true
		units[s.worker] += s.b.pending + s.b.lag
		if !s.at.IsZero() && (g.oldest.IsZero() || s.at.Before(g.oldest)) {
			g.oldest = s.at
		}
	}
	for i, w := range ws {
		g := groups[w.lease.Group]
		if g == nil || !read[i] {
			continue
		}
		g.total += units[i]
		g.max = max(g.max, units[i])
		if units[i] > 0 {
			g.lagging++
		}
	}
	now := c.opts.Clock.Now()
	for name, g := range groups {
		age := 0.0
		if !g.oldest.IsZero() {
			age = max(0, now.Sub(g.oldest).Seconds())
		}
		for _, m := range []struct {
			d *prometheus.Desc
			v float64
		}{{lagDesc, float64(g.total)}, {lagMaxDesc, float64(g.max)}, {laggingDesc, float64(g.lagging)}, {oldestDesc, age}} {
			ch <- prometheus.MustNewConstMetric(m.d, prometheus.GaugeValue, m.v, name)
		}
	}
}

// readBacklogs reads the backlog of each stream of ss in one pipelined
// round trip (XINFO GROUPS; a stream that does not exist has none), and
// sets each one's b or err. A group whose lag Redis cannot tell (after
// deletions) is counted by readBacklog, one stream at a time.
func readBacklogs(ctx context.Context, rdb redis.UniversalClient, ss []lagStream, group func(*lagStream) string) {
	pipe := rdb.Pipeline()
	cmds := make([]*redis.XInfoGroupsCmd, len(ss))
	for i := range ss {
		cmds[i] = pipe.XInfoGroups(ctx, ss[i].key)
	}
	_, _ = pipe.Exec(ctx) // each command's error is its own
	for i := range ss {
		s := &ss[i]
		gs, err := cmds[i].Result()
		if err != nil {
			if strings.Contains(err.Error(), "no such key") {
				continue // no stream: no backlog
			}
			s.err = err
			continue
		}
		s.b, s.err = backlogOf(gs, group(s))
		if s.err == nil && s.b.lag < 0 {
			s.b, s.err = readBacklog(ctx, rdb, s.key, group(s))
		}
	}
}

// backlogOf is a group's backlog from its stream's XINFO GROUPS; lag -1
// when Redis cannot tell it. A group not created yet has the whole
// stream to read: its lag is the stream's length, read later (-1).
func backlogOf(gs []redis.XInfoGroup, group string) (backlog, error) {
	for _, g := range gs {
		if g.Name == group {
			return backlog{pending: g.Pending, lag: g.Lag, delivered: g.LastDeliveredID}, nil
		}
	}
	return backlog{lag: -1}, nil
}

// readOldest reads, in one pipelined round trip, the ID of the oldest
// entry not handled of each stream of ss with a backlog, and sets its at.
func readOldest(ctx context.Context, rdb redis.UniversalClient, ss []lagStream, group func(*lagStream) string) {
	pipe := rdb.Pipeline()
	ids := make([]func() (string, error), len(ss))
	for i := range ss {
		s := &ss[i]
		switch {
		case s.err != nil:
		case s.b.pending > 0:
			cmd := pipe.XPending(ctx, s.key, group(s))
			ids[i] = func() (string, error) {
				p, err := cmd.Result()
				if err != nil {
					return "", err
				}
				return p.Lower, nil
			}
		case s.b.lag > 0:
			from := "-"
			if s.b.delivered != "" {
				from = "(" + s.b.delivered
			}
			cmd := pipe.XRangeN(ctx, s.key, from, "+", 1)
			ids[i] = func() (string, error) {
				es, err := cmd.Result()
				if err != nil || len(es) == 0 {
					return "", err
				}
				return es[0].ID, nil
			}
		}
	}
	if pipe.Len() == 0 {
		return
	}
	_, _ = pipe.Exec(ctx)
	for i, id := range ids {
		if id == nil {
			continue
		}
		v, err := id()
		if err == nil && v != "" {
			ss[i].at, err = entryTime(v)
		}
		ss[i].err = err
	}
}
