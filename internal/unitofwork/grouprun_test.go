package unitofwork_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/unitofwork"
	"github.com/proteanhq/protean-host/position"
)

// holdRow locks the positions row of group's unit on a connection of its
// own, until the returned release is called: a run of that unit waits on
// it, in flight.
func (r *groupRig) holdRow(t *testing.T, group, unit string) (release func()) {
	t.Helper()
	tx, err := r.pool.Begin(t.Context())
	require.NoError(t, err)
	_, err = tx.Exec(t.Context(), `SELECT 1 FROM consumer_positions WHERE consumer_group = $1 AND unit = $2 FOR UPDATE`, group, unit)
	require.NoError(t, err)
	done := false
	release = func() {
		if !done {
			done = true
			require.NoError(t, tx.Rollback(context.Background()))
		}
	}
	t.Cleanup(release)
	return release
}

// rowWaiting waits until a commit waits on a row lock.
func (r *groupRig) rowWaiting(t *testing.T) {
	t.Helper()
	testwait.For(t, "a run waiting on the held positions row", func() (bool, string) {
		n := r.count(t, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event IN ('transactionid', 'tuple')`)
		return n == 1, fmt.Sprintf("%d waiting", n)
	})
}

type runOutcome struct {
	c   []unitofwork.Committed
	err error
}

// run is one unit's run of one message at pos: its fence, and its
// document (a projection record keyed by the unit) at version pos.
func (r *groupRig) run(ctx context.Context, unit string, gen, pos int64) <-chan runOutcome {
	e := &abi.Effects{Writes: []abi.Write{{Kind: abi.RecordProjection, Type: "doc", ID: unit, ExpectedVersion: pos - 1,
		Data: json.RawMessage(fmt.Sprintf(`{"pos":%d}`, pos))}}}
	step := unitofwork.Step{Fence: &position.Fence{Group: "g", Unit: unit, Generation: gen, Advance: map[string]int64{unit: pos}},
		Changes: []unitofwork.Change{{Effects: e}}}
	ch := make(chan runOutcome, 1)
	go func() {
		c, err := r.u.CommitRun(ctx, []unitofwork.Step{step})
		ch <- runOutcome{c, err}
	}()
	return ch
}

// Runs of different units (each its unit's fence and document), queued
// behind a run in flight, commit in one transaction, each with its own
// outcome; a run whose unit a newer owner claimed fails alone with
// position.ErrFenced and writes nothing, and the others commit. With the
// runs committed one by one the transaction count is 1+n; reporting the
// group's refusal to every run fails it.
func TestPostgresGroupCommitsRunsOfUnitsTogether(t *testing.T) {
	t.Parallel()
	const n = 6
	r := newGroupRig(t, 0)
	ctx := testwait.Context(t)
	gens := map[string]int64{}
	for i := range n + 1 {
		unit := fmt.Sprintf("u%d", i)
		row, err := r.p.Positions.Claim(ctx, "g", unit)
		require.NoError(t, err)
		gens[unit] = row.Generation
	}
	stale := "u3"
	_, err := r.p.Positions.Claim(ctx, "g", stale) // a newer owner: u3's run is fenced out
	require.NoError(t, err)

	release := r.holdRow(t, "g", "u0")
	first := r.run(ctx, "u0", gens["u0"], 1)
	r.rowWaiting(t)
	outs := make([]<-chan runOutcome, 0, n)
	for i := 1; i <= n; i++ {
		unit := fmt.Sprintf("u%d", i)
		outs = append(outs, r.run(ctx, unit, gens[unit], 1))
	}
	r.queued(t, n)
	release()
	o := testwait.Recv(t, "the run in flight", first)
	require.NoError(t, o.err)
	for i, ch := range outs {
		unit := fmt.Sprintf("u%d", i+1)
		o := testwait.Recv(t, "a queued run", ch)
		if unit == stale {
			require.ErrorIs(t, o.err, position.ErrFenced, "the fenced-out run's own error")
			require.Empty(t, o.c)
			continue
		}
		require.NoError(t, o.err, unit)
		require.Len(t, o.c, 1, "%s: its own step", unit)
		row, ok, err := r.p.Positions.Get(ctx, "g", unit)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, map[string]int64{unit: 1}, row.Positions, unit)
	}
	require.Zero(t, r.count(t, `SELECT count(*) FROM records WHERE type = 'doc' AND id = $1`, stale), "the fenced-out run wrote nothing")
	require.Equal(t, n, r.count(t, `SELECT count(*) FROM records WHERE type = 'doc'`))
	// The first alone; the queue's group refused (u3's fence), rolled
	// back, and each of the n committed alone: 1+n-1. Without the fenced
	// run the queue is one transaction (below).
	require.Equal(t, int64(1+n-1), r.txs.Load(), "transactions committed")

	// The same without a stale fence: the queue commits in one
	// transaction.
	r.txs.Store(0)
	release = r.holdRow(t, "g", "u0")
	first = r.run(ctx, "u0", gens["u0"], 2)
	r.rowWaiting(t)
	outs = outs[:0]
	for i := 1; i <= n; i++ {
		if unit := fmt.Sprintf("u%d", i); unit != stale {
			outs = append(outs, r.run(ctx, unit, gens[unit], 2))
		}
	}
	r.queued(t, n-1)
	release()
	require.NoError(t, testwait.Recv(t, "the run in flight", first).err)
	for _, ch := range outs {
		o := testwait.Recv(t, "a queued run", ch)
		require.NoError(t, o.err)
		require.Len(t, o.c, 1)
	}
	require.Equal(t, int64(2), r.txs.Load(), "the run in flight, then the queue together")
	require.Equal(t, n, r.count(t, `SELECT count(*) FROM records WHERE type = 'doc' AND version = 2`))
}
