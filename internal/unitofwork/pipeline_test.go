package unitofwork_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/idempotency"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/unitofwork"
	"github.com/proteanhq/protean-host/outbox"
	"github.com/proteanhq/protean-host/position"
	"github.com/proteanhq/protean-host/record"
)

// roundTrips counts what a pool sends: each query outside a batch and
// each batch is one round trip (statements already prepared). It keeps
// how each batch ended, too.
type roundTrips struct {
	n atomic.Int64

	mu        sync.Mutex
	batchErrs []error
}

// batches returns how the batches since the last call ended.
func (r *roundTrips) batches() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	errs := r.batchErrs
	r.batchErrs = nil
	return errs
}

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchEndData) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.batchErrs = append(r.batchErrs, d.Err)
}

// countingPool is a second pool on pool's database that counts round trips.
func countingPool(t *testing.T, pool *pgxpool.Pool) (*pgxpool.Pool, *roundTrips) {
	t.Helper()
	rt := &roundTrips{}
	cfg := pool.Config()
	cfg.ConnConfig.Tracer = rt
	cfg.MaxConns = 1 // one connection: its statements stay prepared between commits
	p, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p, rt
}

// countingUoW is a unit of work on a fresh database through countingPool.
func countingUoW(t *testing.T) (*unitofwork.Postgres, *unitofwork.UnitOfWork, *roundTrips) {
	t.Helper()
	pool, rt := countingPool(t, testserver.PostgresPool(t))
	p := unitofwork.NewPostgres(pool)
	return p, unitofwork.New(p, unitofwork.Options{Keys: keys{"order": "client_id"}, Broker: "default", MaxRetries: 3}), rt
}

// A unit of work on PostgreSQL (a record write, an event, its outbox row,
// with or without a fence) is one round trip, the category lock taken
// once; a run of four messages is one round trip too (group commit).
func TestPostgresCommitRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	p, u, rt := countingUoW(t)
	unit, err := p.Positions.Claim(ctx, "g", "u")
	require.NoError(t, err)
	fence := func(pos int64) *position.Fence {
		return &position.Fence{Group: "g", Unit: "u", Generation: unit.Generation, Advance: map[string]int64{"order": pos}}
	}
	// Once to prepare the statements, then counted.
	_, err = u.Commit(ctx, unitofwork.Change{Effects: placeOrder("warm", `"c-1"`)})
	require.NoError(t, err)
	_, err = u.CommitFenced(ctx, *fence(1), unitofwork.Change{Effects: placeOrder("warm-f", `"c-1"`)})
	require.NoError(t, err)

	rt.n.Store(0)
	_, err = u.Commit(ctx, unitofwork.Change{Effects: placeOrder("o-1", `"c-1"`)})
	require.NoError(t, err)
	require.Equal(t, int64(1), rt.n.Load(), "round trips of a unit of work")

	rt.n.Store(0)
	_, err = u.CommitFenced(ctx, *fence(2), unitofwork.Change{Effects: placeOrder("o-2", `"c-1"`)})
	require.NoError(t, err)
	require.Equal(t, int64(1), rt.n.Load(), "round trips of a fenced unit of work")

	// A fence alone (a message that wrote nothing) is one round trip: the
	// UPDATE and COMMIT together. Refused, it still leaves the connection
	// out of any transaction (the pool has one connection).
	_, err = u.CommitFenced(ctx, *fence(3)) // prepare
	require.NoError(t, err)
	rt.n.Store(0)
	_, err = u.CommitFenced(ctx, *fence(4))
	require.NoError(t, err)
	require.Equal(t, int64(1), rt.n.Load(), "round trips of a fence-only unit of work")
	_, err = u.CommitFenced(ctx, *fence(4))
	require.ErrorIs(t, err, position.ErrApplied)
	_, err = u.CommitFenced(ctx, *fence(5))
	require.NoError(t, err)
	row, ok, err := p.Positions.Get(ctx, "g", "u")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, map[string]int64{"order": 5}, row.Positions)

	var steps []unitofwork.Step
	for i := range 5 {
		steps = append(steps, unitofwork.Step{Fence: fence(int64(10 + i)), Changes: []unitofwork.Change{{Effects: placeOrder(fmt.Sprintf("r-%d", i), `"c-1"`)}}})
	}
	_, err = u.CommitRun(ctx, steps[:1]) // prepare the run's statements
	require.NoError(t, err)
	rt.n.Store(0)
	out, err := u.CommitRun(ctx, steps[1:])
	require.NoError(t, err)
	require.Len(t, out, 4)
	require.Equal(t, int64(1), rt.n.Load(), "round trips of a run of four")
}

type uowHarness struct {
	uow     *unitofwork.UnitOfWork
	events  eventstore.Store
	records interface {
		Load(context.Context, record.Key) (record.Record, error)
	}
	outbox interface {
		Stats(context.Context) (outbox.Stats, error)
		Claim(ctx context.Context, broker, owner string, limit int, lockFor time.Duration) ([]outbox.Row, error)
	}
	positions interface {
		Claim(ctx context.Context, group, unit string) (position.Row, error)
		Get(ctx context.Context, group, unit string) (position.Row, bool, error)
	}
}

func uowHarnesses(t *testing.T) map[string]func(t *testing.T) uowHarness {
	opts := unitofwork.Options{Keys: keys{"order": "client_id"}, Broker: "default", MaxRetries: 3}
	return map[string]func(t *testing.T) uowHarness{
		"memory": func(t *testing.T) uowHarness {
			m := unitofwork.NewMemory()
			return uowHarness{unitofwork.New(m, opts), m.Events, m.Records, m.Outbox, m.Positions}
		},
		"postgres": func(t *testing.T) uowHarness {
			p := unitofwork.NewPostgres(testserver.PostgresPool(t))
			return uowHarness{unitofwork.New(p, opts), p.Events, p.Records, p.Outbox, p.Positions}
		},
	}
}

func (h uowHarness) version(t *testing.T, id string) int64 {
	t.Helper()
	r, err := h.records.Load(context.Background(), record.Key{Kind: "aggregate", Type: "order", ID: id})
	require.NoError(t, err)
	return r.Version
}

func (h uowHarness) pending(t *testing.T) int {
	t.Helper()
	st, err := h.outbox.Stats(context.Background())
	require.NoError(t, err)
	return st.Counts[outbox.StatusPending]
}

// The pipelined commit keeps every error's kind: a stream or record
// conflict is a *VersionError, a duplicate event id is ErrDuplicateID, and
// nothing of the unit of work stays; on memory and PostgreSQL alike.
func TestCommitErrorsKeepTheirKind(t *testing.T) {
	t.Parallel()
	for name, newHarness := range uowHarnesses(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			h := newHarness(t)
			_, err := h.events.Append(ctx, []eventstore.NewEvent{{Stream: "order-o-1", Type: "Other", Data: json.RawMessage(`{}`), ExpectedVersion: eventstore.AnyVersion}})
			require.NoError(t, err)
			_, err = h.uow.Commit(ctx, unitofwork.Change{Effects: placeOrder("o-1", `"c-1"`)})
			var ve *eventstore.VersionError
			require.ErrorAs(t, err, &ve)
			require.Equal(t, int64(0), ve.Actual)
			require.Zero(t, h.version(t, "o-1"), "the record write rolled back with the append")
			require.Zero(t, h.pending(t))

			_, err = h.uow.Commit(ctx, unitofwork.Change{Effects: placeOrder("o-2", `"c-1"`)})
			require.NoError(t, err)
			e := placeOrder("o-2", `"c-1"`)
			e.Events[0].Stream = "order-o-3"
			_, err = h.uow.Commit(ctx, unitofwork.Change{Effects: e})
			var rve *record.VersionError
			require.ErrorAs(t, err, &rve)
			require.Equal(t, int64(1), rve.Actual)
			v, err := h.events.StreamVersion(ctx, "order-o-3")
			require.NoError(t, err)
			require.Equal(t, int64(-1), v)
			require.Equal(t, 1, h.pending(t))

			c, err := h.uow.Commit(ctx, unitofwork.Change{Effects: placeOrder("o-4", `"c-1"`)})
			require.NoError(t, err)
			dup := placeOrder("o-5", `"c-1"`)
			dup.Events[0].ID = c.Events[0].ID
			_, err = h.uow.Commit(ctx, unitofwork.Change{Effects: dup})
			require.ErrorIs(t, err, eventstore.ErrDuplicateID)
			require.Zero(t, h.version(t, "o-5"))
			require.Equal(t, 2, h.pending(t))
		})
	}
}

// CommitRun commits each step atomically and in order: a run whose third
// step conflicts commits the first two (effects and fence), nothing of the
// third or fourth, and returns the third's typed error; a clean run commits
// every step with its outbox rows.
func TestCommitRun(t *testing.T) {
	t.Parallel()
	for name, newHarness := range uowHarnesses(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			h := newHarness(t)
			unit, err := h.positions.Claim(ctx, "g", "u")
			require.NoError(t, err)
			step := func(id string, pos int64) unitofwork.Step {
				return unitofwork.Step{
					Fence:   &position.Fence{Group: "g", Unit: "u", Generation: unit.Generation, Advance: map[string]int64{"order": pos}},
					Changes: []unitofwork.Change{{Effects: placeOrder(id, `"c-1"`), Metadata: abi.Metadata{CausationID: id}}},
				}
			}
			_, err = h.uow.Commit(ctx, unitofwork.Change{Effects: placeOrder("taken", `"c-1"`)})
			require.NoError(t, err)

			out, err := h.uow.CommitRun(ctx, []unitofwork.Step{step("a", 1), step("b", 2), step("taken", 3), step("d", 4)})
			require.True(t, unitofwork.Conflict(err), "%v", err)
			require.Len(t, out, 2)
			require.Equal(t, "order-b", out[1].Events[0].Stream)
			require.Equal(t, int64(1), h.version(t, "a"))
			require.Equal(t, int64(1), h.version(t, "b"))
			require.Zero(t, h.version(t, "d"))
			require.Equal(t, 3, h.pending(t))
			row, _, err := h.positions.Get(ctx, "g", "u")
			require.NoError(t, err)
			require.Equal(t, int64(2), row.Positions["order"], "the fence moved with the committed steps only")

			out, err = h.uow.CommitRun(ctx, []unitofwork.Step{step("d", 4), step("e", 5), step("f", 6)})
			require.NoError(t, err)
			require.Len(t, out, 3)
			require.Equal(t, 6, h.pending(t))
			// The run's outbox rows (one insert for all on PostgreSQL) are
			// in event order, with their keys and metadata.
			rows, err := h.outbox.Claim(ctx, "default", "test", 10, time.Minute)
			require.NoError(t, err)
			require.Len(t, rows, 6)
			var want, got []string
			for _, c := range out {
				want = append(want, c.Events[0].ID)
			}
			for _, r := range rows[3:] {
				got = append(got, r.MessageID)
				require.Equal(t, "c-1", *r.PartitionKey)
				require.Equal(t, 3, r.MaxRetries)
				require.JSONEq(t, `{"order_id":"`+strings.TrimPrefix(r.Stream, "order-")+`","client_id":"c-1"}`, string(r.Data))
			}
			require.Equal(t, want, got)
			var md map[string]any
			require.NoError(t, json.Unmarshal(rows[5].Metadata, &md))
			require.Equal(t, "f", md["causation_id"])
			require.Equal(t, float64(out[2].Events[0].GlobalPosition), md["global_position"])
			row, _, err = h.positions.Get(ctx, "g", "u")
			require.NoError(t, err)
			require.Equal(t, int64(6), row.Positions["order"])

			// A redelivered step is refused by the fence, with its kind.
			_, err = h.uow.CommitRun(ctx, []unitofwork.Step{step("g", 6), step("h", 7)})
			require.ErrorIs(t, err, position.ErrApplied)
		})
	}
}

// On PostgreSQL a command's idempotency key is written in its own unit of
// work: with its effects, or not at all; a second unit of work under the
// same context (a follow-up command) does not write it again.
func TestPostgresIdempotencyKeyInTheUnitOfWork(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testserver.PostgresPool(t)
	p := unitofwork.NewPostgres(pool)
	u := unitofwork.New(p, unitofwork.Options{Keys: keys{"order": "client_id"}, Broker: "default", MaxRetries: 3})
	keys := idempotency.NewPostgres(pool, time.Hour)
	row := func(key string) (state string, status int, body string, ok bool) {
		err := pool.QueryRow(ctx, `SELECT state, coalesce(status, 0), coalesce(convert_from(body, 'UTF8'), '') FROM idempotency_keys WHERE key = $1`, key).Scan(&state, &status, &body)
		if errors.Is(err, pgx.ErrNoRows) {
			return "", 0, "", false
		}
		require.NoError(t, err)
		return state, status, body, true
	}
	// The answer the API would give, built by the caller (httpapi's).
	answer := func(id string, evs []eventstore.Event, _ bool) (idempotency.Answer, error) {
		streams := make([]string, len(evs))
		for i, ev := range evs {
			streams[i] = ev.Stream
		}
		b, err := json.Marshal(map[string]any{"id": id, "stream": streams[0], "streams": streams})
		return idempotency.Answer{Status: 200, Body: b}, err
	}
	for _, stepwise := range []bool{false, true} {
		key := fmt.Sprintf("k-%v", stepwise)
		r := idempotency.Request{Scope: "PlaceOrder", Key: key, Hash: idempotency.HashBody([]byte(`{}`))}
		kctx := unitofwork.WithIdempotency(ctx, keys, r, answer)
		if stepwise { // a refusal in the pipeline runs the work step by step
			_, err := p.Events.Append(ctx, []eventstore.NewEvent{{Stream: "order-" + key, Type: "Other", Data: json.RawMessage(`{}`), ExpectedVersion: eventstore.AnyVersion}})
			require.NoError(t, err)
			_, err = u.Commit(kctx, unitofwork.Change{Effects: placeOrder(key, `"c-1"`), Metadata: abi.Metadata{CausationID: "cmd-" + key}})
			require.True(t, unitofwork.Conflict(err))
			_, _, _, ok := row(key)
			require.False(t, ok, "a unit of work that failed wrote no key")
			kctx = unitofwork.WithIdempotency(ctx, keys, r, answer)
			e := placeOrder(key, `"c-1"`)
			e.Events[0].ExpectedVersion = nil
			e.Events[0].Stream = "order-" + key
			c, err := u.Commit(kctx, unitofwork.Change{Effects: e, Metadata: abi.Metadata{CausationID: "cmd-" + key}})
			require.NoError(t, err)
			require.Len(t, c.Events, 1)
		} else {
			_, err := u.Commit(kctx, unitofwork.Change{Effects: placeOrder(key, `"c-1"`), Metadata: abi.Metadata{CausationID: "cmd-" + key}})
			require.NoError(t, err)
		}
		state, status, body, ok := row(key)
		require.True(t, ok)
		require.Equal(t, "done", state, "no follow-up commands: the unit of work wrote the final answer, and the API saves nothing")
		require.Equal(t, 200, status)
		require.Contains(t, body, `"id":"cmd-`+key+`"`)
		require.Contains(t, body, `"stream":"order-`+key+`"`)

		// A follow-up committed under the same context leaves the key's answer.
		_, err := u.Commit(kctx, unitofwork.Change{Effects: placeOrder(key+"-f", `"c-1"`), Metadata: abi.Metadata{CausationID: "follow-up"}})
		require.NoError(t, err)
		_, _, body, _ = row(key)
		require.Contains(t, body, `"id":"cmd-`+key+`"`)
	}

	// A command that dispatches a follow-up command: its answer is not
	// final (the follow-up's outcome joins it), so the key stays under the
	// request's lease until Save writes the full answer.
	r := idempotency.Request{Scope: "PlaceOrder", Key: "k-follow-up", Hash: idempotency.HashBody([]byte(`{}`))}
	e := placeOrder("k-follow-up", `"c-1"`)
	e.Commands = []abi.NewCommand{{Type: "Notify", Data: json.RawMessage(`{}`)}}
	c, err := u.Commit(unitofwork.WithIdempotency(ctx, keys, r, answer), unitofwork.Change{Effects: e, Metadata: abi.Metadata{CausationID: "cmd-k-follow-up"}})
	require.NoError(t, err)
	require.Len(t, c.Commands, 1)
	state, _, body, ok := row("k-follow-up")
	require.True(t, ok)
	require.Equal(t, "committed", state, "Save writes the full answer")
	require.Contains(t, body, `"id":"cmd-k-follow-up"`)
}
