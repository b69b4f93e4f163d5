package unitofwork_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/unitofwork"
	"github.com/proteanhq/protean-host/outbox"
	"github.com/proteanhq/protean-host/record"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// backendHarness is one backend under test and its stores, read from
// outside any unit of work.
type backendHarness struct {
	backend unitofwork.Backend
	records record.Store
	events  eventstore.Store
	outbox  outbox.Store
}

func TestMemoryBackendAtomicity(t *testing.T) {
	t.Parallel()
	runBackendSuite(t, func(t *testing.T) backendHarness {
		m := unitofwork.NewMemory()
		return backendHarness{backend: m, records: m.Records, events: m.Events, outbox: m.Outbox}
	})
}

func TestPostgresBackendAtomicity(t *testing.T) {
	t.Parallel()
	runBackendSuite(t, func(t *testing.T) backendHarness {
		p := unitofwork.NewPostgres(testserver.PostgresPool(t))
		return backendHarness{backend: p, records: p.Records, events: p.Events, outbox: p.Outbox}
	})
}

// runBackendSuite pins what the unit of work relies on from a backend:
// record writes, appends and outbox rows commit or roll back together, and
// a failed step leaves nothing of itself while the transaction goes on.
func runBackendSuite(t *testing.T, newHarness func(t *testing.T) backendHarness) {
	for name, fn := range map[string]func(t *testing.T, h backendHarness){
		"CommitLandsAllThree":                         testCommitLandsAll,
		"RollbackLeavesNone":                          testRollbackLeavesNone,
		"ConflictingAppendAfterRecordWriteLeavesNone": testConflictAfterWrite,
		"ConflictingWriteAfterAppendLeavesNone":       testWriteConflictAfterAppend,
		"FailedStepsLeaveNothingAndTxGoesOn":          testFailedStepsTxGoesOn,
		"CommitAfterRollbackFails":                    testCommitAfterRollback,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, newHarness(t))
		})
	}
}

var orderKey = record.Key{Kind: record.KindAggregate, Type: "order", ID: "o-1"}

func begin(t *testing.T, h backendHarness) unitofwork.Tx {
	t.Helper()
	tx, err := h.backend.Begin(t.Context())
	require.NoError(t, err)
	return tx
}

// stageAll stages one record write, one append and one outbox row.
func stageAll(t *testing.T, tx unitofwork.Tx) {
	t.Helper()
	ctx := t.Context()
	require.NoError(t, tx.Write(ctx, []record.Write{{Key: orderKey, ExpectedVersion: 0, Data: json.RawMessage(`{"status":"placed"}`)}}))
	evs, err := tx.Append(ctx, []eventstore.NewEvent{{Stream: "order-o-1", Type: "OrderPlaced", Data: json.RawMessage(`{}`), ExpectedVersion: eventstore.NoStream}})
	require.NoError(t, err)
	require.NoError(t, tx.Add(ctx, []outbox.Row{{MessageID: evs[0].ID, Stream: "order-o-1", Type: "OrderPlaced", TargetBroker: "default"}}))
}

// requireState checks what is committed: the record's version, the
// stream's event count and the outbox's row count.
func requireState(t *testing.T, h backendHarness, version int64, events, rows int) {
	t.Helper()
	ctx := t.Context()
	r, err := h.records.Load(ctx, orderKey)
	require.NoError(t, err)
	require.Equal(t, version, r.Version, "record version")
	evs, err := h.events.ReadAll(ctx, 0, 0)
	require.NoError(t, err)
	require.Len(t, evs, events, "events")
	s, err := h.outbox.Stats(ctx)
	require.NoError(t, err)
	total := 0
	for _, n := range s.Counts {
		total += n
	}
	require.Equal(t, rows, total, "outbox rows")
}

func testCommitLandsAll(t *testing.T, h backendHarness) {
	ctx := t.Context()
	tx := begin(t, h)
	stageAll(t, tx)
	r, err := tx.Load(ctx, orderKey)
	require.NoError(t, err)
	require.Equal(t, int64(1), r.Version, "the transaction reads its own write")
	requireState(t, h, 0, 0, 0) // nothing visible before commit
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, tx.Commit(ctx), "commit twice is a no-op")
	require.NoError(t, tx.Rollback(ctx), "rollback after commit is a no-op")
	requireState(t, h, 1, 1, 1)
}

func testRollbackLeavesNone(t *testing.T, h backendHarness) {
	ctx := t.Context()
	tx := begin(t, h)
	stageAll(t, tx)
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, tx.Rollback(ctx))
	requireState(t, h, 0, 0, 0)
}

func testConflictAfterWrite(t *testing.T, h backendHarness) {
	ctx := t.Context()
	_, err := h.events.Append(ctx, []eventstore.NewEvent{{Stream: "order-o-1", Type: "Seeded", ExpectedVersion: eventstore.NoStream}})
	require.NoError(t, err)

	tx := begin(t, h)
	require.NoError(t, tx.Write(ctx, []record.Write{{Key: orderKey, ExpectedVersion: 0, Data: json.RawMessage(`{}`)}}))
	_, err = tx.Append(ctx, []eventstore.NewEvent{{Stream: "order-o-1", Type: "OrderPlaced", ExpectedVersion: eventstore.NoStream}})
	require.ErrorIs(t, err, eventstore.ErrExpectedVersion)
	// The unit of work gives up on the first error.
	require.NoError(t, tx.Rollback(ctx))
	requireState(t, h, 0, 1, 0)
}

func testWriteConflictAfterAppend(t *testing.T, h backendHarness) {
	ctx := t.Context()
	tx := begin(t, h)
	_, err := tx.Append(ctx, []eventstore.NewEvent{{Stream: "order-o-1", Type: "OrderPlaced", ExpectedVersion: eventstore.NoStream}})
	require.NoError(t, err)
	require.NoError(t, tx.Add(ctx, []outbox.Row{{MessageID: "m-1", Stream: "order-o-1", Type: "OrderPlaced", TargetBroker: "default"}}))
	err = tx.Write(ctx, []record.Write{{Key: orderKey, ExpectedVersion: 3, Data: json.RawMessage(`{}`)}})
	require.ErrorIs(t, err, record.ErrExpectedVersion)
	require.NoError(t, tx.Rollback(ctx))
	requireState(t, h, 0, 0, 0)
}

func testFailedStepsTxGoesOn(t *testing.T, h backendHarness) {
	ctx := t.Context()
	require.NoError(t, h.records.Commit(ctx, []record.Write{{Key: orderKey, ExpectedVersion: 0, Data: json.RawMessage(`{}`)}}))
	tx := begin(t, h)
	other := record.Key{Kind: record.KindAggregate, Type: "order", ID: "o-2"}
	err := tx.Write(ctx, []record.Write{
		{Key: other, ExpectedVersion: 0, Data: json.RawMessage(`{}`)},
		{Key: orderKey, ExpectedVersion: 0, Data: json.RawMessage(`{}`)}, // stale
	})
	require.ErrorIs(t, err, record.ErrExpectedVersion)
	_, err = tx.Append(ctx, []eventstore.NewEvent{
		{Stream: "order-o-2", Type: "OrderPlaced", ExpectedVersion: eventstore.NoStream},
		{Stream: "order-o-1", Type: "OrderPlaced", ExpectedVersion: 4}, // stale
	})
	require.ErrorIs(t, err, eventstore.ErrExpectedVersion)
	require.NoError(t, tx.Add(ctx, []outbox.Row{{MessageID: "m-1", Stream: "order-o-1", Type: "OrderPlaced", TargetBroker: "default"}}))
	err = tx.Add(ctx, []outbox.Row{
		{MessageID: "m-2", Stream: "order-o-2", Type: "OrderPlaced", TargetBroker: "default"},
		{MessageID: "m-1", Stream: "order-o-1", Type: "OrderPlaced", TargetBroker: "default"}, // duplicate
	})
	require.ErrorIs(t, err, outbox.ErrDuplicate)

	require.NoError(t, tx.Write(ctx, []record.Write{{Key: orderKey, ExpectedVersion: 1, Data: json.RawMessage(`{}`)}}))
	_, err = tx.Append(ctx, []eventstore.NewEvent{{Stream: "order-o-1", Type: "OrderPlaced", ExpectedVersion: eventstore.NoStream}})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	requireState(t, h, 2, 1, 1)
	r, err := h.records.Load(ctx, other)
	require.NoError(t, err)
	require.Zero(t, r.Version, "the failed write left nothing")
	v, err := h.events.StreamVersion(ctx, "order-o-2")
	require.NoError(t, err)
	require.Equal(t, eventstore.NoStream, v, "the failed append left nothing")
}

func testCommitAfterRollback(t *testing.T, h backendHarness) {
	ctx := t.Context()
	tx := begin(t, h)
	stageAll(t, tx)
	require.NoError(t, tx.Rollback(ctx))
	require.ErrorIs(t, tx.Commit(ctx), record.ErrTxDone)
	requireState(t, h, 0, 0, 0)
}
