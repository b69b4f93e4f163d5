package unitofwork_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/unitofwork"
	"github.com/proteanhq/protean-host/outbox"
	"github.com/proteanhq/protean-host/position"
	"github.com/proteanhq/protean-host/record"
)

// stepOnly hides the PostgreSQL backend's pipelined commit: a unit of
// work over it commits through the Tx steps, one round trip each.
type stepOnly struct{ unitofwork.Backend }

// outboxRows reads every outbox row of pool's database as its columns,
// metadata decoded, in id order.
func outboxRows(t *testing.T, pool *pgxpool.Pool) []map[string]any {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT to_jsonb(o) FROM outbox o ORDER BY id`)
	require.NoError(t, err)
	all, err := pgx.CollectRows(rows, pgx.RowTo[map[string]any])
	require.NoError(t, err)
	return all
}

// The outbox rows of the one-round-trip commit, built in the database from
// the appended events, are the rows the step-by-step path builds in Go
// (outboxMetadata) for the same changes: every column, and the metadata
// (the event's, with its position, global_position and time in Go's
// encoding), with or without a partition key, in event order, for a unit
// of work of one event and one of three (two statement shapes).
func TestPostgresOneTripOutboxRowsMatchStepwise(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	created := time.Date(2026, 12, 1, 6, 0, 0, 123000, time.UTC)
	opts := unitofwork.Options{Keys: keys{"order": "client_id"}, Broker: "default", MaxRetries: 7}
	commit := func(stepwise bool) (*pgxpool.Pool, unitofwork.Committed) {
		pool := testserver.PostgresPool(t)
		p := unitofwork.NewPostgres(pool)
		p.Outbox = outbox.NewPostgres(pool, func() time.Time { return created })
		var b unitofwork.Backend = p
		if stepwise {
			b = stepOnly{p}
		}
		noStream := abi.NoStream
		effects := &abi.Effects{
			Writes: []abi.Write{{Kind: abi.RecordAggregate, Type: "order", ID: "o-1", Data: json.RawMessage(`{"status":"placed"}`)}},
			Events: []abi.NewEvent{
				{Stream: "order-o-1", Type: "OrderPlaced", ExpectedVersion: &noStream, ID: "7b1c4a52-6f0e-4c1e-9d1a-0c7f2f1e8a01",
					Data: json.RawMessage(`{"order_id": "o-1", "client_id": "c-1", "total": 12.50, "note": "x\u00e9"}`)},
				{Stream: "order-o-1", Type: "OrderNoted", ID: "7b1c4a52-6f0e-4c1e-9d1a-0c7f2f1e8a02",
					Data: json.RawMessage(`{"order_id": "o-1", "client_id": 42}`)},
				{Stream: "payment-p-1", Type: "PaymentRecorded", ID: "7B1C4A52-6F0E-4C1E-9D1A-0C7F2F1E8A03",
					Data: json.RawMessage(`{"payment_id": "p-1", "order_id": "o-1"}`)},
			},
		}
		u := unitofwork.New(b, opts)
		// One event (its own statement shape), then three.
		first, err := u.Commit(ctx, unitofwork.Change{Effects: &abi.Effects{Events: []abi.NewEvent{{Stream: "order-o-0", Type: "OrderPlaced",
			ID: "7b1c4a52-6f0e-4c1e-9d1a-0c7f2f1e8a00", Data: json.RawMessage(`{"order_id": "o-0", "client_id": "c-0"}`)}}},
			Metadata: abi.Metadata{CorrelationID: "corr-0"}})
		require.NoError(t, err)
		c, err := u.Commit(ctx, unitofwork.Change{Effects: effects, Priority: 5,
			Metadata: abi.Metadata{CorrelationID: "corr-1", CausationID: "cmd-1", Tenant: "shop",
				Module: &abi.ModuleRef{Name: "orders", Version: "1.0.0", SHA256: "abc"}, CascadeDepth: 2}})
		require.NoError(t, err)
		c.Events = append(first.Events, c.Events...)
		return pool, c
	}
	onePool, one := commit(false)
	stepPool, step := commit(true)
	oneRows, stepRows := outboxRows(t, onePool), outboxRows(t, stepPool)
	require.Len(t, oneRows, 4)
	require.Len(t, stepRows, 4)
	for i := range oneRows {
		// The events' times are their transactions' (two databases): each
		// row carries its own event's, in Go's encoding.
		for _, c := range []struct {
			row map[string]any
			ev  eventstore.Event
		}{{oneRows[i], one.Events[i]}, {stepRows[i], step.Events[i]}} {
			md := c.row["metadata"].(map[string]any)
			want, err := json.Marshal(c.ev.Time)
			require.NoError(t, err)
			require.Equal(t, string(want), `"`+md["time"].(string)+`"`, "row %d: time", i)
			delete(md, "time")
		}
		require.Equal(t, stepRows[i], oneRows[i], "row %d", i)
	}
	require.Equal(t, "c-0", oneRows[0]["partition_key"])
	require.Equal(t, map[string]any{"correlation_id": "corr-0", "position": float64(0), "global_position": float64(1)}, oneRows[0]["metadata"])
	require.Equal(t, "c-1", oneRows[1]["partition_key"])
	require.Equal(t, "42", oneRows[2]["partition_key"], "a non-string key is its JSON text")
	require.Nil(t, oneRows[3]["partition_key"], "payment is not partitioned")
	require.Equal(t, map[string]any{"correlation_id": "corr-1", "causation_id": "cmd-1", "tenant": "shop",
		"module": map[string]any{"name": "orders", "version": "1.0.0", "sha256": "abc"}, "cascade_depth": float64(2),
		"position": float64(1), "global_position": float64(3)}, oneRows[2]["metadata"])
	require.Equal(t, "7b1c4a52-6f0e-4c1e-9d1a-0c7f2f1e8a03", oneRows[3]["message_id"], "ids as the event store keeps them")
	require.Equal(t, float64(5), oneRows[1]["priority"])
	for i := range one.Events {
		require.Equal(t, step.Events[i].Position, one.Events[i].Position)
		require.Equal(t, step.Events[i].GlobalPosition, one.Events[i].GlobalPosition)
	}
}

// A refusal inside the one-round-trip commit raises there, so its COMMIT
// never runs: a record version that does not hold (an update, a first
// write of a record that exists, an update of one that does not), a
// stream not at its expected version, a duplicate event id, a duplicate
// outbox row, a stale fence. The pipeline fails with the database's error,
// nothing of the unit of work is committed, the caller gets the typed
// error (from the step-by-step rerun), and the pool's one connection is
// usable for the next unit of work.
func TestPostgresOneTripRefusalsCommitNothing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	p, u, trace := countingUoW(t)

	// What exists before the refused units of work.
	taken, err := u.Commit(ctx, unitofwork.Change{Effects: placeOrder("taken", `"c-1"`)}) // record v1, stream at 0
	require.NoError(t, err)
	foreign := eventstore.NewID()
	require.NoError(t, p.Outbox.Add(ctx, []outbox.Row{{MessageID: foreign, Stream: "order-x", Type: "Other", TargetBroker: "default"}}))
	claimed, err := p.Positions.Claim(ctx, "g", "u")
	require.NoError(t, err)
	_, err = p.Positions.Claim(ctx, "g", "u") // a newer owner: claimed's generation is stale
	require.NoError(t, err)

	fresh := func(id string) *abi.Effects { return placeOrder(id, `"c-1"`) }
	cases := []struct {
		name   string
		change func() *abi.Effects
		fence  *position.Fence
		want   func(t *testing.T, err error)
	}{
		{"record update at a stale version", func() *abi.Effects {
			e := fresh("n-1")
			e.Writes = append(e.Writes, abi.Write{Kind: abi.RecordAggregate, Type: "order", ID: "taken", ExpectedVersion: 2, Data: json.RawMessage(`{}`)})
			return e
		}, nil, func(t *testing.T, err error) {
			var ve *record.VersionError
			require.ErrorAs(t, err, &ve)
			require.Equal(t, int64(1), ve.Actual)
		}},
		{"record update of a record that does not exist", func() *abi.Effects {
			e := fresh("n-2")
			e.Writes[0].ExpectedVersion = 1
			return e
		}, nil, func(t *testing.T, err error) {
			var ve *record.VersionError
			require.ErrorAs(t, err, &ve)
			require.Equal(t, int64(0), ve.Actual)
		}},
		{"first write of a record that exists", func() *abi.Effects {
			e := fresh("n-3")
			e.Writes = append(e.Writes, abi.Write{Kind: abi.RecordAggregate, Type: "order", ID: "taken", Data: json.RawMessage(`{}`)})
			return e
		}, nil, func(t *testing.T, err error) {
			var ve *record.VersionError
			require.ErrorAs(t, err, &ve)
		}},
		{"stream not at its expected version", func() *abi.Effects {
			e := fresh("n-4")
			e.Events = append(e.Events, fresh("taken").Events[0])
			return e
		}, nil, func(t *testing.T, err error) {
			var ve *eventstore.VersionError
			require.ErrorAs(t, err, &ve)
			require.Equal(t, int64(0), ve.Actual)
		}},
		{"duplicate event id", func() *abi.Effects {
			e := fresh("n-5")
			e.Events[0].ID = taken.Events[0].ID
			return e
		}, nil, func(t *testing.T, err error) {
			require.ErrorIs(t, err, eventstore.ErrDuplicateID)
		}},
		{"duplicate outbox row", func() *abi.Effects {
			e := fresh("n-6")
			e.Events[0].ID = foreign
			return e
		}, nil, func(t *testing.T, err error) {
			require.ErrorIs(t, err, outbox.ErrDuplicate)
		}},
		{"stale fence", func() *abi.Effects { return fresh("n-7") },
			&position.Fence{Group: "g", Unit: "u", Generation: claimed.Generation, Advance: map[string]int64{"order": 1}},
			func(t *testing.T, err error) {
				require.ErrorIs(t, err, position.ErrFenced)
			}},
	}
	stats := func() (events, rows int) {
		evs, err := p.Events.ReadAll(ctx, 0, 1000)
		require.NoError(t, err)
		s, err := p.Outbox.Stats(ctx)
		require.NoError(t, err)
		for _, n := range s.Counts {
			rows += n
		}
		return len(evs), rows
	}
	for _, c := range cases {
		events, rows := stats()
		trace.batches()
		change := unitofwork.Change{Effects: c.change()}
		if c.fence != nil {
			_, err = u.CommitFenced(ctx, *c.fence, change)
		} else {
			_, err = u.Commit(ctx, change)
		}
		c.want(t, err)

		errs := trace.batches()
		require.NotEmpty(t, errs, "%s: no pipeline", c.name)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(errs[0], &pgErr), "%s: the one-trip pipeline raised: %v", c.name, errs[0])

		id := change.Effects.Writes[0].ID
		r, err := p.Records.Load(ctx, record.Key{Kind: record.KindAggregate, Type: "order", ID: id})
		require.NoError(t, err)
		require.Zero(t, r.Version, "%s: record written", c.name)
		r, err = p.Records.Load(ctx, record.Key{Kind: record.KindAggregate, Type: "order", ID: "taken"})
		require.NoError(t, err)
		require.Equal(t, int64(1), r.Version, "%s: record written", c.name)
		e, o := stats()
		require.Equal(t, events, e, "%s: events appended", c.name)
		require.Equal(t, rows, o, "%s: outbox rows added", c.name)
	}
	// The one connection is usable.
	_, err = u.Commit(ctx, unitofwork.Change{Effects: fresh("after")})
	require.NoError(t, err)
	row, _, err := p.Positions.Get(ctx, "g", "u")
	require.NoError(t, err)
	require.Empty(t, row.Positions, "the stale fence moved nothing")
}

// A unit of work with several events appends them in one statement:
// expected versions chain within it as Append chains them (each event
// checked against its stream's version counting the earlier ones, across
// streams that interleave), and one that does not hold raises there, so
// nothing of the unit is committed, with the typed error; the same holds
// for a run (CommitRun) whose steps append to one stream.
func TestPostgresOneTripBatchAppendChainsVersions(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	p, u, trace := countingUoW(t)
	_, err := p.Events.Append(ctx, []eventstore.NewEvent{{Stream: "order-b", Type: "Old", Data: json.RawMessage(`{}`), ExpectedVersion: eventstore.AnyVersion}})
	require.NoError(t, err)
	trace.batches()
	at := func(v int64) *int64 { return &v }
	ev := func(stream string, expected *int64) abi.NewEvent {
		return abi.NewEvent{Stream: stream, Type: "E", ExpectedVersion: expected, Data: json.RawMessage(`{"client_id":"c-1"}`)}
	}
	events := func(t *testing.T) int {
		evs, err := p.Events.ReadAll(ctx, 0, 1000)
		require.NoError(t, err)
		return len(evs)
	}

	c, err := u.Commit(ctx, unitofwork.Change{Effects: &abi.Effects{Events: []abi.NewEvent{
		ev("order-a", at(abi.NoStream)), ev("order-b", at(0)), ev("order-a", at(0)), ev("order-b", nil), ev("order-a", at(1)),
	}}})
	require.NoError(t, err)
	var got []int64
	for _, e := range c.Events {
		got = append(got, e.Position)
	}
	require.Equal(t, []int64{0, 1, 1, 2, 2}, got)
	for i := 1; i < len(c.Events); i++ {
		require.Greater(t, c.Events[i].GlobalPosition, c.Events[i-1].GlobalPosition, "global positions in event order")
	}
	require.Equal(t, []error{nil}, trace.batches(), "one pipeline, not refused")
	s, err := p.Outbox.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, 5, s.Counts[outbox.StatusPending])

	before := events(t)
	trace.batches()
	_, err = u.Commit(ctx, unitofwork.Change{Effects: &abi.Effects{Events: []abi.NewEvent{
		ev("order-a", at(2)), ev("order-c", at(abi.NoStream)), ev("order-a", at(2)), // the third expects 2, the stream is at 3
	}}})
	var ve *eventstore.VersionError
	require.ErrorAs(t, err, &ve)
	require.Equal(t, int64(3), ve.Actual)
	require.Error(t, trace.batches()[0], "the pipeline raised")
	require.Equal(t, before, events(t), "nothing of the unit appended")
	v, err := p.Events.StreamVersion(ctx, "order-c")
	require.NoError(t, err)
	require.Equal(t, int64(-1), v)

	// A run: each step appends to order-r, the third at a stale version.
	step := func(expected int64) unitofwork.Step {
		return unitofwork.Step{Changes: []unitofwork.Change{{Effects: &abi.Effects{Events: []abi.NewEvent{ev("order-r", at(expected))}}}}}
	}
	trace.batches()
	out, err := u.CommitRun(ctx, []unitofwork.Step{step(abi.NoStream), step(0), step(0), step(2)})
	require.ErrorAs(t, err, &ve)
	require.Len(t, out, 2, "the steps before the stale one commit")
	require.Error(t, trace.batches()[0], "the run's pipeline raised")
	v, err = p.Events.StreamVersion(ctx, "order-r")
	require.NoError(t, err)
	require.Equal(t, int64(1), v)
}
