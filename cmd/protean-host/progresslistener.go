package main

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proteanhq/protean-host/internal/engine"
	"github.com/proteanhq/protean-host/internal/pglisten"
	"github.com/proteanhq/protean-host/partition"
	"github.com/proteanhq/protean-host/position"
)

// progressListener hands the partition advances other hosts commit
// (position.Channel's notifications: the unit of work's positions store notifies them on
// the partition workers' path) to the engine's read-your-writes waits, so
// that a read of one's own write on a host that does not run the key's
// unit ends when that unit commits, not at its next poll of the unit's
// positions row.
type progressListener struct {
	// listener is the host's notifications connection (notifications).
	listener *pglisten.Listener
	eng      *engine.Engine
	// local is this host's partition workers: an advance of a unit one of
	// them runs is its own, which the worker marks itself (below).
	local partition.LocalUnits
	// handled is where the advances go (eng.HandledElsewhere).
	handled  func(group, category, key string, gp int64)
	backfill string
	// lanes is set when priority lanes are on: a lane's advances are not
	// told as its key's, so the waits keep their quick safety poll.
	lanes bool
	log   *slog.Logger
	// heard counts the partition streams' advances handed to the waits.
	heard prometheus.Counter

	run background
}

// newProgressListener subscribes to position.Channel on listener, and is
// registered on reg.
func newProgressListener(listener *pglisten.Listener, eng *engine.Engine, local partition.LocalUnits, backfill string, lanes bool, log *slog.Logger, reg prometheus.Registerer) *progressListener {
	l := &progressListener{listener: listener, eng: eng, local: local, handled: eng.HandledElsewhere, backfill: backfill, lanes: lanes, log: log,
		heard: prometheus.NewCounter(prometheus.CounterOpts{Name: "protean_partition_advances_heard_total",
			Help: "Partition advances committed by other hosts (or by this one, of a unit it no longer runs) that this host heard of over PostgreSQL's notifications and handed to its read-your-writes waits: a wait for an event they cover ends without reading the unit's positions row."})}
	reg.MustRegister(l.heard)
	return l
}

// start listens until stop.
func (l *progressListener) start(context.Context) error {
	l.eng.HearsEveryAdvance(!l.lanes)
	l.run.start(l.log, "positions: listener", func(ctx context.Context) error {
		return l.listener.Subscribe(ctx, position.Channel, position.Advances(l.advanced), l.eng.HearingElsewhere)
	})
	return nil
}

// stop ends the listener and waits for it, within ctx.
func (l *progressListener) stop(ctx context.Context) error { return l.run.stop(ctx) }

// advanced marks, for each advance of a partition stream (not a lane's:
// a lane's position says nothing of the key's main stream), every event
// of the stream's key up to its position as handled by the unit's group;
// but not an advance of a unit this host runs. That one's worker marks
// its events itself once its run's commit returns, after the engine has
// kept the documents it wrote (the document cache); the notification of
// the same commit often came first, and a read of one's own write that it
// woke found the cache without the document and read the database: 0.37
// records reads per order under make load with one host.
func (l *progressListener) advanced(advances []position.Advanced) {
	for _, a := range advances {
		for source, gp := range a.Positions {
			category, key, err := partition.ParseUnit(source, l.backfill)
			if err != nil || partition.StreamName(category, key) != source {
				continue
			}
			if l.local != nil {
				if _, ours := l.local.Committed(a.Group, partition.PartitionUnit(category, key)); ours {
					continue
				}
			}
			l.handled(a.Group, category, key, gp)
			l.heard.Inc()
		}
	}
}
