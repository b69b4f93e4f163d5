package subscription_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/subscription"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/unitofwork"
)

// pgGap is a PostgreSQL harness with its pool, for transactions that
// append and commit out of order.
func pgGap(t *testing.T) (*harness, *eventstore.Postgres, func() pgx.Tx) {
	pool := testserver.PostgresPool(t)
	p := unitofwork.NewPostgres(pool)
	h := &harness{events: p.Events, positions: p.Positions, leases: subscription.NewPostgresLeases(pool),
		failures: subscription.NewPostgresFailures(pool), uow: unitofwork.New(p, unitofwork.Options{Broker: "default"}), pg: true}
	es := eventstore.NewPostgres(pool)
	begin := func() pgx.Tx {
		tx, err := pool.Begin(t.Context())
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		return tx
	}
	return h, es, begin
}

func appendIn(t *testing.T, es *eventstore.Postgres, tx pgx.Tx, stream string) int64 {
	t.Helper()
	evs, err := es.Tx(tx).Append(t.Context(), []eventstore.NewEvent{{Stream: stream, Type: "Happened", Data: []byte(`{}`), ExpectedVersion: eventstore.AnyVersion}})
	require.NoError(t, err)
	return evs[0].GlobalPosition
}

// metric reads a counter or gauge of reg with the given labels (0 if it
// has no sample yet).
func metric(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue next
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

func gaps(t *testing.T, reg *prometheus.Registry, outcome string) float64 {
	return metric(t, reg, "protean_subscription_gaps_total", map[string]string{"group": "all", "unit": "$all", "outcome": outcome})
}

// Within one category, a second append waits for the first's commit (the
// category's advisory lock is held to commit), so positions commit in
// order and a category reader never meets a hole that may still fill:
// category subscriptions need no gap hold.
func TestPostgresCategoryAppendsCommitInPositionOrder(t *testing.T) {
	t.Parallel()
	_, es, begin := pgGap(t)
	txA := begin()
	gpA := appendIn(t, es, txA, "order-a")
	type res struct {
		gp  int64
		err error
	}
	got := make(chan res, 1)
	txB := begin()
	go func() {
		evs, err := es.Tx(txB).Append(context.Background(), []eventstore.NewEvent{{Stream: "order-b", Type: "Happened", Data: []byte(`{}`), ExpectedVersion: eventstore.AnyVersion}})
		if err != nil {
			got <- res{err: err}
			return
		}
		got <- res{gp: evs[0].GlobalPosition}
	}()
	var bPID uint32 = txB.Conn().PgConn().PID()
	var aConn = txA.Conn()
	testwait.For(t, "B waits for the category lock", func() (bool, string) {
		var waiting bool
		err := aConn.QueryRow(t.Context(), `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND locktype = 'advisory' AND NOT granted)`, bPID).Scan(&waiting)
		return err == nil && waiting, fmt.Sprint(err)
	})
	select {
	case r := <-got:
		t.Fatalf("B's append returned while A held the category: %+v", r)
	default:
	}
	require.NoError(t, txA.Commit(t.Context()))
	r := testwait.Recv(t, "B's append", got)
	require.NoError(t, r.err)
	require.Greater(t, r.gp, gpA, "B's position is above A's: it was taken after A committed")
	require.NoError(t, txB.Commit(t.Context()))
}

// Across categories a later position commits first: a $all subscription
// holds at the hole, writes no position past it, and goes on once it
// fills.
func TestPostgresAllHoldsAtAGapUntilItFills(t *testing.T) {
	t.Parallel()
	h, es, begin := pgGap(t)
	reg := prometheus.NewRegistry()
	r := newRecorder(h.uow)
	first := appendEvents(t, h.events, "x", []string{"1"}, 1)
	h.consumer(t, r, consumerOpts{subs: []subscription.Subscription{{Group: "all", Category: subscription.All}},
		gapTimeout: time.Hour, metrics: subscription.NewMetrics(reg)})
	r.waitApplied(t, "all", first)

	txA, txB := begin(), begin()
	gpA := appendIn(t, es, txA, "a-1")
	gpB := appendIn(t, es, txB, "b-1")
	require.NoError(t, txB.Commit(t.Context()))
	after := appendEvents(t, h.events, "x", []string{"2"}, 1)
	testwait.For(t, "the subscription holds at A's position", func() (bool, string) {
		n := gaps(t, reg, "held")
		return n == 1, fmt.Sprint("held ", n)
	})
	require.Equal(t, first, r.positions("all"), "nothing past the hole was handled")
	row, _, err := h.positions.Get(t.Context(), "all", subscription.All)
	require.NoError(t, err)
	require.Equal(t, first[0], row.Positions[subscription.All], "no durable position past the hole")

	require.NoError(t, txA.Commit(t.Context()))
	r.waitApplied(t, "all", []int64{first[0], gpA, gpB, after[0]})
	require.Zero(t, gaps(t, reg, "abandoned"))
}

// A hole that never fills (a rolled-back append) is abandoned after the
// gap timeout, with a metric; the first read of a fresh subscription is
// not held at positions below its first event.
func TestPostgresAllAbandonsARolledBackGap(t *testing.T) {
	t.Parallel()
	h, es, begin := pgGap(t)
	reg := prometheus.NewRegistry()
	r := newRecorder(h.uow)
	tx0 := begin()
	appendIn(t, es, tx0, "z-0") // position 1, rolled back: below the first event
	require.NoError(t, tx0.Rollback(t.Context()))
	first := appendEvents(t, h.events, "x", []string{"1"}, 1)
	require.Greater(t, first[0], int64(1))
	h.consumer(t, r, consumerOpts{subs: []subscription.Subscription{{Group: "all", Category: subscription.All}},
		gapTimeout: 500 * time.Millisecond, metrics: subscription.NewMetrics(reg)})
	r.waitApplied(t, "all", first)
	require.Zero(t, gaps(t, reg, "held"), "a fresh subscription's start is not a gap")

	txA := begin()
	appendIn(t, es, txA, "a-1")
	require.NoError(t, txA.Rollback(t.Context()))
	after := appendEvents(t, h.events, "x", []string{"2"}, 1)
	r.waitApplied(t, "all", []int64{first[0], after[0]})
	require.Equal(t, 1.0, gaps(t, reg, "held"))
	require.Equal(t, 1.0, gaps(t, reg, "abandoned"))
	row, _, err := h.positions.Get(t.Context(), "all", subscription.All)
	require.NoError(t, err)
	require.Equal(t, after[0], row.Positions[subscription.All])
}
