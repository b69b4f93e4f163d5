package unitofwork_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/unitofwork"
	"github.com/proteanhq/protean-host/outbox"
	"github.com/proteanhq/protean-host/position"
	"github.com/proteanhq/protean-host/record"
)

// fencedHarness is a unit of work on one backend, and its stores read
// from outside any unit of work.
type fencedHarness struct {
	uow       *unitofwork.UnitOfWork
	records   record.Store
	events    eventstore.Store
	outbox    outbox.Store
	positions position.Store
}

func TestMemoryCommitFenced(t *testing.T) {
	t.Parallel()
	runFencedSuite(t, func(t *testing.T) fencedHarness {
		m := unitofwork.NewMemory()
		return fencedHarness{uow: unitofwork.New(m, unitofwork.Options{Keys: keys{"order": "client_id"}, Broker: "default", MaxRetries: 3}),
			records: m.Records, events: m.Events, outbox: m.Outbox, positions: m.Positions}
	})
}

func TestPostgresCommitFenced(t *testing.T) {
	t.Parallel()
	runFencedSuite(t, func(t *testing.T) fencedHarness {
		p := unitofwork.NewPostgres(testserver.PostgresPool(t))
		return fencedHarness{uow: unitofwork.New(p, unitofwork.Options{Keys: keys{"order": "client_id"}, Broker: "default", MaxRetries: 3}),
			records: p.Records, events: p.Events, outbox: p.Outbox, positions: p.Positions}
	})
}

func runFencedSuite(t *testing.T, newHarness func(t *testing.T) fencedHarness) {
	for name, fn := range map[string]func(t *testing.T, h fencedHarness){
		"AppliesEffectsAndAdvances":       testFencedCommit,
		"StaleGenerationRollsBackEffects": testFencedStale,
		"AppliedRollsBackEffects":         testFencedApplied,
		"FenceOnlyCommitAdvances":         testFenceOnly,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, newHarness(t))
		})
	}
}

const (
	group = "order-projector"
	unit  = "order:c-1"
)

func orderFence(gen, pos int64) position.Fence {
	return position.Fence{Group: group, Unit: unit, Generation: gen, Advance: map[string]int64{"order:c-1": pos}}
}

// effectsOf counts what is committed for order id: the record's version,
// the events of its stream and the outbox rows.
func effectsOf(t *testing.T, h fencedHarness, id string) (version int64, events, rows int) {
	t.Helper()
	ctx := t.Context()
	r, err := h.records.Load(ctx, record.Key{Kind: record.KindAggregate, Type: "order", ID: id})
	require.NoError(t, err)
	evs, err := h.events.ReadStream(ctx, "order-"+id, 0, 100)
	require.NoError(t, err)
	s, err := h.outbox.Stats(ctx)
	require.NoError(t, err)
	for _, n := range s.Counts {
		rows += n
	}
	return r.Version, len(evs), rows
}

func positionsOf(t *testing.T, h fencedHarness) position.Row {
	t.Helper()
	r, ok, err := h.positions.Get(t.Context(), group, unit)
	require.NoError(t, err)
	require.True(t, ok)
	return r
}

func testFencedCommit(t *testing.T, h fencedHarness) {
	ctx := t.Context()
	row, err := h.positions.Claim(ctx, group, unit)
	require.NoError(t, err)
	c, err := h.uow.CommitFenced(ctx, orderFence(row.Generation, 11), unitofwork.Change{Effects: placeOrder("o-1", `"c-1"`)})
	require.NoError(t, err)
	require.Len(t, c.Events, 1)
	v, evs, rows := effectsOf(t, h, "o-1")
	require.Equal(t, []any{int64(1), 1, 1}, []any{v, evs, rows})
	require.Equal(t, map[string]int64{"order:c-1": 11}, positionsOf(t, h).Positions)
}

func testFencedStale(t *testing.T, h fencedHarness) {
	ctx := t.Context()
	old, err := h.positions.Claim(ctx, group, unit)
	require.NoError(t, err)
	_, err = h.positions.Claim(ctx, group, unit) // a newer owner
	require.NoError(t, err)
	_, err = h.uow.CommitFenced(ctx, orderFence(old.Generation, 11), unitofwork.Change{Effects: placeOrder("o-1", `"c-1"`)})
	require.ErrorIs(t, err, position.ErrFenced)
	var fe *position.FenceError
	require.ErrorAs(t, err, &fe)
	require.Equal(t, int64(2), fe.Have)
	require.False(t, unitofwork.Conflict(err))
	v, evs, rows := effectsOf(t, h, "o-1")
	require.Equal(t, []any{int64(0), 0, 0}, []any{v, evs, rows}, "no record, no event, no outbox row")
	require.Empty(t, positionsOf(t, h).Positions)
}

func testFencedApplied(t *testing.T, h fencedHarness) {
	ctx := t.Context()
	row, err := h.positions.Claim(ctx, group, unit)
	require.NoError(t, err)
	_, err = h.uow.CommitFenced(ctx, orderFence(row.Generation, 11), unitofwork.Change{Effects: placeOrder("o-1", `"c-1"`)})
	require.NoError(t, err)
	// The same message again, say redelivered after a crash between commit
	// and ack: its effects would conflict here, but a handler of another
	// kind would not notice; the fence does.
	_, err = h.uow.CommitFenced(ctx, orderFence(row.Generation, 11), unitofwork.Change{Effects: placeOrder("o-2", `"c-1"`)})
	require.ErrorIs(t, err, position.ErrApplied)
	require.True(t, position.Applied(err))
	v, evs, rows := effectsOf(t, h, "o-2")
	require.Equal(t, []any{int64(0), 0, 1}, []any{v, evs, rows}, "o-2 wrote nothing; the one outbox row is o-1's")
	require.Equal(t, map[string]int64{"order:c-1": 11}, positionsOf(t, h).Positions)
}

func testFenceOnly(t *testing.T, h fencedHarness) {
	ctx := t.Context()
	row, err := h.positions.Claim(ctx, group, unit)
	require.NoError(t, err)
	for _, c := range [][]unitofwork.Change{
		nil,
		{{Effects: nil}},
		{{Effects: &abi.Effects{Commands: []abi.NewCommand{{Type: "ShipOrder"}}}}},
	} {
		_, err = h.uow.CommitFenced(ctx, orderFence(row.Generation, positionsOf(t, h).Positions["order:c-1"]+1), c...)
		require.NoError(t, err)
	}
	require.Equal(t, map[string]int64{"order:c-1": 3}, positionsOf(t, h).Positions, "a handler that wrote nothing has handled its message")
	_, err = h.uow.CommitFenced(ctx, orderFence(row.Generation, 3))
	require.ErrorIs(t, err, position.ErrApplied)
	_, err = h.uow.CommitFenced(ctx, orderFence(row.Generation+1, 4))
	require.ErrorIs(t, err, position.ErrFenced)
	require.Equal(t, map[string]int64{"order:c-1": 3}, positionsOf(t, h).Positions, "a refused fence moves nothing")
}
