package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/internal/config"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/httpapi"
	"github.com/proteanhq/protean-host/internal/redispartition"
	"github.com/proteanhq/protean-host/internal/redisstream"
	"github.com/proteanhq/protean-host/internal/routes"
	"github.com/proteanhq/protean-host/position"
)

// hostStatus is the running host's httpapi.Status: the status page and
// GET /v1/plugins read it. Each part comes from where /metrics and the
// CLI read it: the reloader, the broker's inspector (inline and stream
// consumer groups), the partitions' Admin (as `partitions list`), the
// positions table and failure records (event-store subscriptions), the
// outbox's stats (as `outbox` and the outbox collector), the tenants'
// use of the guests (as the instance and share collectors).
type hostStatus struct {
	st        *stores
	routes    *routes.Routes
	reloader  func() *host.ReloadStatus
	inspector broker.Inspector      // nil: the broker cannot tell
	admin     *redispartition.Admin // nil: partitions are off
	fromStore bool
	pools     pools
	now       func() time.Time
	// set and sched are the running set and the guest slots' scheduler
	// (nil: no sharing), for the tenants' use; set nil: not shown.
	set   func() *host.Set
	sched *host.Scheduler
}

// newHostStatus builds the status of a host over its stores, broker,
// routes and reloader.
func newHostStatus(cfg config.Config, st *stores, br *openedBroker, rt *routes.Routes, r *host.Reloader, fromStore bool) (*hostStatus, error) {
	s := &hostStatus{st: st, routes: rt, reloader: r.Status, fromStore: fromStore, pools: pools{pg: st.pool, rdb: br.redis}, now: time.Now}
	s.inspector, _ = br.source.(broker.Inspector)
	if br.redis != nil {
		ps, _ := st.positions.(position.Store)
		adm, err := redispartition.NewAdmin(redispartition.AdminOptions{Redis: br.redis, Prefix: br.prefix, Positions: ps,
			BackfillSuffix: cfg.Server.PriorityLanes.BackfillSuffix, Decode: redisstream.Decode})
		if err != nil {
			return nil, err
		}
		s.admin = adm
	}
	return s, nil
}

func (s *hostStatus) Status(ctx context.Context) (httpapi.Snapshot, error) {
	var snap httpapi.Snapshot
	problem := func(what string, err error) {
		snap.Problems = append(snap.Problems, fmt.Sprintf("%s: %v", what, err))
	}
	if s.reloader != nil {
		snap.Reload = s.reloader()
	}
	snap.Pools = s.pools.stats()
	if s.set != nil {
		snap.Tenants = host.Tenants(s.set().Modules(), s.sched)
	}
	if stats, err := s.st.outbox.Stats(ctx); err != nil {
		problem("outbox", err)
	} else {
		ob := &httpapi.Outbox{Counts: map[string]int{}}
		for st, n := range stats.Counts {
			ob.Counts[string(st)] = n
		}
		if stats.OldestPending != nil {
			ob.OldestPending = s.now().Sub(*stats.OldestPending)
		}
		for _, l := range stats.RelayLeases {
			ob.RelayLeases = append(ob.RelayLeases, httpapi.RelayLease{Broker: l.Broker, Owner: l.Owner, Left: l.Expires.Sub(s.now())})
		}
		snap.Outbox = ob
	}
	pairs := s.routes.Subscriptions() // every (handler, category) pair
	switch {
	case s.fromStore:
		for _, sub := range pairs {
			c := httpapi.Consumer{Group: sub.Group, Source: sub.Category, Path: "event_store"}
			if row, _, err := s.st.positions.Get(ctx, sub.Group, sub.Category); err != nil {
				problem("positions "+sub.Group, err)
			} else if s.st.head != nil {
				if head, err := s.st.head(ctx, sub.Category); err != nil {
					problem("head "+sub.Category, err)
				} else {
					c.Lag = max(0, head-row.Positions[sub.Category])
				}
			}
			if s.st.failures != nil {
				open, err := s.st.failures.List(ctx, sub.Group, sub.Category, true)
				if err != nil {
					problem("failures "+sub.Group, err)
				}
				c.Failures = int64(len(open))
			}
			snap.Consumers = append(snap.Consumers, c)
		}
	default:
		for _, sub := range pairs {
			if sub.Partitioned && s.admin != nil {
				continue // the partitions' rows below
			}
			c := httpapi.Consumer{Group: sub.Group, Source: sub.Category, Path: "inline"}
			if s.admin != nil {
				c.Path = "stream"
			}
			if s.inspector != nil {
				st, err := s.inspector.Stats(ctx, sub.Category, sub.Group)
				if err != nil {
					problem("broker "+sub.Group, err)
				}
				c.Lag, c.Failures = int64(st.Depth+st.InFlight), int64(st.DeadLetters)
			}
			snap.Consumers = append(snap.Consumers, c)
		}
	}
	if s.admin != nil && !s.fromStore {
		s.partitions(ctx, &snap, problem)
	}
	sort.SliceStable(snap.Consumers, func(i, j int) bool {
		a, b := snap.Consumers[i], snap.Consumers[j]
		if a.Group != b.Group {
			return a.Group < b.Group
		}
		return a.Source < b.Source
	})
	return snap, nil
}

// partitions adds the partition workers' consumers (per group: lag summed
// over its units, failures = halted units) and the owned and halted units,
// as `partitions list` shows them.
func (s *hostStatus) partitions(ctx context.Context, snap *httpapi.Snapshot, problem func(string, error)) {
	subs := s.routes.Partitions()
	units, err := s.admin.List(ctx, subs)
	if err != nil {
		problem("partitions", err)
		return
	}
	snap.Partitions = &httpapi.Partitions{Owned: []httpapi.Unit{}, Halted: []httpapi.Unit{}}
	byGroup := map[string]*httpapi.Consumer{}
	for _, sub := range subs {
		c := &httpapi.Consumer{Group: sub.Group, Path: "partitions", Source: strings.Join(sub.Categories, ", ")}
		byGroup[sub.Group] = c
	}
	for _, u := range units {
		row := httpapi.Unit{Group: u.Group, Unit: u.Unit, Owner: u.Owner, Generation: u.Generation, Pending: u.Pending, Lag: u.Lag}
		if c := byGroup[u.Group]; c != nil {
			c.Lag += u.Lag
		}
		switch u.State() {
		case "halted":
			row.Reason, row.HaltGeneration, row.Attempts = u.Halt.Reason, u.Halt.Generation, u.Halt.Attempts
			snap.Partitions.Halted = append(snap.Partitions.Halted, row)
			if c := byGroup[u.Group]; c != nil {
				c.Failures++
			}
		case "owned":
			snap.Partitions.Owned = append(snap.Partitions.Owned, row)
		}
	}
	for _, sub := range subs {
		snap.Consumers = append(snap.Consumers, *byGroup[sub.Group])
	}
}
