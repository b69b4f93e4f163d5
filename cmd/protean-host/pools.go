package main

import (
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/proteanhq/protean-host/internal/httpapi"
)

// The connection pools, PostgreSQL's (pgxpool) and the Redis client's
// (go-redis): their size and use, and how often and how long a caller
// waited for a connection. A wait while the server is idle is a pool too
// small for the work; the metrics and GET /v1/plugins show it.

// pools are the host's connection pools: nil where a store is in memory
// or the broker inline.
type pools struct {
	pg  *pgxpool.Pool
	rdb redis.UniversalClient
}

// stats reads each pool.
func (p pools) stats() []httpapi.Pool {
	var out []httpapi.Pool
	if p.pg != nil {
		s := p.pg.Stat()
		out = append(out, httpapi.Pool{Name: "postgres", Max: int64(s.MaxConns()), InUse: int64(s.AcquiredConns()), Idle: int64(s.IdleConns()),
			Acquires: s.AcquireCount(), Waits: s.EmptyAcquireCount(), WaitSeconds: s.EmptyAcquireWaitTime().Seconds()})
	}
	if p.rdb != nil {
		s := p.rdb.PoolStats()
		pl := httpapi.Pool{Name: "redis", InUse: int64(s.TotalConns) - int64(s.IdleConns), Idle: int64(s.IdleConns),
			Acquires: int64(s.Hits) + int64(s.Misses), Waits: int64(s.WaitCount), WaitSeconds: float64(s.WaitDurationNs) / 1e9,
			Timeouts: int64(s.Timeouts)}
		if o, ok := p.rdb.(interface{ Options() *redis.Options }); ok {
			pl.Max = int64(o.Options().PoolSize)
		}
		out = append(out, pl)
	}
	return out
}

// poolCollector reports pools as metrics.
type poolCollector struct {
	p                                pools
	conns, acquires, waits, waitSecs *prometheus.Desc
	timeouts                         *prometheus.Desc
}

func newPoolCollector(p pools) *poolCollector {
	l := []string{"pool"}
	return &poolCollector{p: p,
		conns:    prometheus.NewDesc("protean_pool_connections", "Connections of each pool (postgres, redis) by state: in_use, idle, max.", []string{"pool", "state"}, nil),
		acquires: prometheus.NewDesc("protean_pool_acquires_total", "Connections taken from each pool.", l, nil),
		waits:    prometheus.NewDesc("protean_pool_waits_total", "Takes that found no idle connection and waited (PostgreSQL: for one to be made or freed; Redis: for a free one).", l, nil),
		waitSecs: prometheus.NewDesc("protean_pool_wait_seconds_total", "Time spent waiting for a connection of each pool.", l, nil),
		timeouts: prometheus.NewDesc("protean_pool_timeouts_total", "Waits for a connection that timed out (Redis).", l, nil),
	}
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.conns, c.acquires, c.waits, c.waitSecs, c.timeouts} {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.p.stats() {
		for state, n := range map[string]int64{"in_use": s.InUse, "idle": s.Idle, "max": s.Max} {
			ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(n), s.Name, state)
		}
		ch <- prometheus.MustNewConstMetric(c.acquires, prometheus.CounterValue, float64(s.Acquires), s.Name)
		ch <- prometheus.MustNewConstMetric(c.waits, prometheus.CounterValue, float64(s.Waits), s.Name)
		ch <- prometheus.MustNewConstMetric(c.waitSecs, prometheus.CounterValue, s.WaitSeconds, s.Name)
		if s.Name == "redis" {
			ch <- prometheus.MustNewConstMetric(c.timeouts, prometheus.CounterValue, float64(s.Timeouts), s.Name)
		}
	}
}
