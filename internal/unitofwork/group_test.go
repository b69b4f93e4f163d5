package unitofwork_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/idempotency"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/unitofwork"
	"github.com/proteanhq/protean-host/partition"
)

// groupRig is a unit of work on a fresh PostgreSQL database that counts
// its transactions (Options.Committed), and a second connection that can
// hold a category's lock so that commands queue behind a commit in
// flight.
type groupRig struct {
	pool *pgxpool.Pool
	p    *unitofwork.Postgres
	u    *unitofwork.UnitOfWork
	txs  atomic.Int64
}

func newGroupRig(t *testing.T, max int) *groupRig {
	t.Helper()
	cfg := testserver.PostgresPool(t).Config()
	cfg.MaxConns = 32 // the held lock, the commits in flight and their lone retries
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	r := &groupRig{pool: pool}
	r.p = unitofwork.NewPostgres(r.pool)
	r.u = unitofwork.New(r.p, unitofwork.Options{Keys: keys{"order": "client_id"}, Broker: "default", MaxRetries: 3,
		GroupCommit: max, Committed: func() { r.txs.Add(1) }})
	return r
}

// hold takes category's lock (the one an append takes) on a connection of
// its own, until the returned release is called.
func (r *groupRig) hold(t *testing.T, category string) (release func()) {
	t.Helper()
	conn, err := r.pool.Acquire(t.Context())
	require.NoError(t, err)
	_, err = conn.Exec(t.Context(), `SELECT pg_advisory_lock(message_store.hash_64($1))`, category)
	require.NoError(t, err)
	var once sync.Once
	release = func() {
		once.Do(func() {
			_, err := conn.Exec(context.Background(), `SELECT pg_advisory_unlock(message_store.hash_64($1))`, category)
			require.NoError(t, err)
			conn.Release()
		})
	}
	t.Cleanup(release)
	return release
}

// waiting returns the backends of this database waiting for an advisory
// lock: the commits in flight behind a hold.
func (r *groupRig) waiting(t *testing.T) []int32 {
	t.Helper()
	rows, err := r.pool.Query(t.Context(), `SELECT pid FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = 'advisory' ORDER BY pid`)
	require.NoError(t, err)
	var pids []int32
	for rows.Next() {
		var pid int32
		require.NoError(t, rows.Scan(&pid))
		pids = append(pids, pid)
	}
	require.NoError(t, rows.Err())
	return pids
}

// inFlight waits for one commit waiting on the hold other than those in
// not, and returns its backend.
func (r *groupRig) inFlight(t *testing.T, not ...int32) int32 {
	t.Helper()
	var pid int32
	testwait.For(t, "a commit waiting on the held category lock", func() (bool, string) {
		pids := slices.DeleteFunc(r.waiting(t), func(p int32) bool { return slices.Contains(not, p) })
		if len(pids) != 1 {
			return false, fmt.Sprintf("waiting backends %v (not %v)", pids, not)
		}
		pid = pids[0]
		return true, ""
	})
	return pid
}

func (r *groupRig) queued(t *testing.T, n int) {
	t.Helper()
	testwait.For(t, fmt.Sprintf("%d commands queued", n), func() (bool, string) {
		q := unitofwork.Queued(r.u)
		return q == n, fmt.Sprintf("%d queued", q)
	})
}

// count returns a count(*) query's answer.
func (r *groupRig) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, r.pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

type outcome struct {
	c   unitofwork.Committed
	err error
}

// start commits change under ctx on a goroutine of its own; its outcome
// comes on the channel.
func (r *groupRig) start(ctx context.Context, changes ...unitofwork.Change) <-chan outcome {
	ch := make(chan outcome, 1)
	go func() {
		c, err := r.u.Commit(ctx, changes...)
		ch <- outcome{c, err}
	}()
	return ch
}

// note is a command appending n events to its own stream, which must not
// exist yet, and writing its own record.
func note(stream string, n int) unitofwork.Change {
	e := &abi.Effects{Writes: []abi.Write{{Kind: abi.RecordAggregate, Type: "note", ID: stream, Data: json.RawMessage(`{"n":1}`)}}}
	for i := range n {
		v := int64(i) - 1 // the stream's version before this event: none, then 0...
		e.Events = append(e.Events, abi.NewEvent{Stream: stream, Type: "Noted", ExpectedVersion: &v,
			Data: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))})
	}
	return unitofwork.Change{Effects: e, Metadata: abi.Metadata{CausationID: "cmd-" + stream}}
}

// Commands that queue behind a commit in flight on their category commit
// together, at most GroupCommit to a transaction, and each gets its own
// events, in its own stream, at its own versions. Removing the grouper
// (each command alone) makes the transaction count 1+n.
func TestPostgresGroupCommitsQueuedCommandsTogether(t *testing.T) {
	t.Parallel()
	const n = 20
	for _, tc := range []struct{ max, txs int }{{0, 1 + 1}, {8, 1 + 3}, {1, 1 + n}} {
		t.Run(fmt.Sprintf("max=%d", tc.max), func(t *testing.T) {
			t.Parallel()
			r := newGroupRig(t, tc.max)
			ctx := testwait.Context(t)
			release := r.hold(t, "note")
			first := r.start(ctx, note("note-first", 2))
			r.inFlight(t)
			outs := make([]<-chan outcome, n)
			for i := range outs {
				outs[i] = r.start(ctx, note(fmt.Sprintf("note-%d", i), 2))
			}
			if tc.max != 1 {
				r.queued(t, n)
			}
			release()
			require.NoError(t, testwait.Recv(t, "the first commit", first).err)
			for i, ch := range outs {
				o := testwait.Recv(t, "a queued commit", ch)
				require.NoError(t, o.err)
				stream := fmt.Sprintf("note-%d", i)
				require.Len(t, o.c.Events, 2, "its own events only")
				for j, ev := range o.c.Events {
					require.Equal(t, stream, ev.Stream)
					require.Equal(t, int64(j), ev.Position)
					require.JSONEq(t, fmt.Sprintf(`{"i":%d}`, j), string(ev.Data))
				}
			}
			require.Equal(t, int64(tc.txs), r.txs.Load(), "transactions committed")
			require.Equal(t, 2*(n+1), r.count(t, `SELECT count(*) FROM message_store.messages`))
			require.Equal(t, 2*(n+1), r.count(t, `SELECT count(*) FROM outbox`))
			require.Equal(t, n+1, r.count(t, `SELECT count(*) FROM records WHERE type = 'note'`))
		})
	}
}

// Many concurrent committers on one category, free-running: every one
// commits exactly its own events, whatever batches they fell into, and
// Committed is called once per transaction.
func TestPostgresGroupCommitConcurrentCommands(t *testing.T) {
	t.Parallel()
	const workers, each = 16, 8
	r := newGroupRig(t, 0)
	ctx := testwait.Context(t)
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				stream := fmt.Sprintf("note-%d_%d", w, i)
				c, err := r.u.Commit(ctx, note(stream, 1))
				if err == nil && (len(c.Events) != 1 || c.Events[0].Stream != stream || c.Events[0].Position != 0) {
					err = fmt.Errorf("%s: got %+v", stream, c.Events)
				}
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, workers*each, r.count(t, `SELECT count(DISTINCT stream_name) FROM message_store.messages`))
	require.Equal(t, workers*each, r.count(t, `SELECT count(*) FROM outbox`))
	txs := r.txs.Load()
	require.LessOrEqual(t, txs, int64(workers*each))
	t.Logf("%d commands in %d transactions", workers*each, txs)
}

// One command of a group that conflicts (a stream or a record moved) fails
// alone, with a conflict, and writes nothing; the others commit.
// Reporting the group's error to every member, or committing nothing
// after the group's refusal, fails it.
func TestPostgresGroupConflictFailsItsCommandOnly(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"stream", "record"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			r := newGroupRig(t, 0)
			ctx := testwait.Context(t)
			// note-x exists already: its stream at version 0, its record at 1.
			_, err := r.u.Commit(ctx, note("note-x", 1))
			require.NoError(t, err)
			bad := note("note-x", 1) // both expectations stale
			if kind == "stream" {
				bad.Effects.Writes[0].ExpectedVersion = 1
			} else {
				v := int64(0)
				bad.Effects.Events[0].ExpectedVersion = &v
			}
			release := r.hold(t, "note")
			first := r.start(ctx, note("note-first", 1))
			r.inFlight(t)
			outs := []<-chan outcome{r.start(ctx, note("note-a", 1)), r.start(ctx, bad), r.start(ctx, note("note-b", 1))}
			r.queued(t, 3)
			release()
			require.NoError(t, testwait.Recv(t, "the first commit", first).err)
			for i, ch := range outs {
				o := testwait.Recv(t, "a queued commit", ch)
				if i == 1 {
					require.True(t, unitofwork.Conflict(o.err), "the conflicting command's own error: %v", o.err)
					continue
				}
				require.NoError(t, o.err)
				require.Len(t, o.c.Events, 1)
			}
			require.Equal(t, 1, r.count(t, `SELECT count(*) FROM message_store.messages WHERE stream_name = 'note-x'`))
			require.Equal(t, 1, r.count(t, `SELECT count(*) FROM outbox WHERE stream_name = 'note-x'`))
			require.Equal(t, 1, r.count(t, `SELECT version FROM records WHERE type = 'note' AND id = 'note-x'`))
			require.Equal(t, 4, r.count(t, `SELECT count(*) FROM message_store.messages`))
		})
	}
}

// A command whose partition key is rejected fails at once, even while its
// group has a commit in flight, and the others commit grouped.
func TestPostgresGroupKeyErrorFailsItsCommandOnly(t *testing.T) {
	t.Parallel()
	r := newGroupRig(t, 0)
	ctx := testwait.Context(t)
	release := r.hold(t, "order")
	first := r.start(ctx, unitofwork.Change{Effects: placeOrder("o-first", `"c-1"`)})
	r.inFlight(t)
	outs := []<-chan outcome{r.start(ctx, unitofwork.Change{Effects: placeOrder("o-1", `"c-1"`)}),
		r.start(ctx, unitofwork.Change{Effects: placeOrder("o-2", `"c-2"`)})}
	r.queued(t, 2)
	bad := testwait.Recv(t, "the rejected key's answer, while the group waits", r.start(ctx, unitofwork.Change{Effects: placeOrder("o-bad", `"a:b"`)}))
	var ke *unitofwork.KeyError
	require.ErrorAs(t, bad.err, &ke)
	require.ErrorIs(t, bad.err, partition.ErrInvalidKey)
	release()
	require.NoError(t, testwait.Recv(t, "the first commit", first).err)
	for _, ch := range outs {
		require.NoError(t, testwait.Recv(t, "a queued commit", ch).err)
	}
	require.Equal(t, int64(2), r.txs.Load(), "the first alone, the two others together")
	require.Zero(t, r.count(t, `SELECT count(*) FROM message_store.messages WHERE stream_name = 'order-o-bad'`))
	require.Zero(t, r.count(t, `SELECT count(*) FROM records WHERE id = 'o-bad'`))
	require.Equal(t, 3, r.count(t, `SELECT count(*) FROM outbox`))
}

// A group whose connection dies while its transaction holds its record
// rows and waits for its category lock commits nothing: the server's
// error proves COMMIT did not run, so each member commits alone, once
// (its idempotency key with it). Reporting the group's error to the
// members, or a member committed twice, fails it. (A lost answer to the
// group's COMMIT, where the outcome is unknown:
// TestPostgresLostGroupCommitIsNotCommittedTwice.)
func TestPostgresGroupDiesMidwayCommitsNothing(t *testing.T) {
	t.Parallel()
	for _, keyed := range []bool{false, true} {
		t.Run(fmt.Sprintf("keyed=%v", keyed), func(t *testing.T) {
			t.Parallel()
			r := newGroupRig(t, 0)
			ctx := testwait.Context(t)
			store := idempotency.NewPostgres(r.pool, time.Hour)
			release := r.hold(t, "note")
			// The first commit gives up (its caller went away), so the group
			// goes next while the lock is still held.
			fctx, cancel := context.WithCancel(ctx)
			first := r.start(fctx, note("note-first", 1))
			lone := r.inFlight(t)
			const n = 4
			outs := make([]<-chan outcome, n)
			for i := range outs {
				cctx := ctx
				if keyed {
					req := idempotency.Request{Scope: "Note", Key: fmt.Sprintf("k-%d", i), Hash: idempotency.HashBody([]byte(`{}`))}
					cctx = unitofwork.WithIdempotency(ctx, store, req, noteAnswer)
				}
				outs[i] = r.start(cctx, note(fmt.Sprintf("note-%d", i), 1))
			}
			r.queued(t, n)
			cancel()
			require.Error(t, testwait.Recv(t, "the first commit, cancelled", first).err)
			grouped := r.inFlight(t, lone)
			r.queued(t, 0)
			var ok bool
			require.NoError(t, r.pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, grouped).Scan(&ok))
			require.True(t, ok)
			testwait.For(t, "the members committing alone", func() (bool, string) {
				w := slices.DeleteFunc(r.waiting(t), func(p int32) bool { return p == lone || p == grouped })
				return len(w) == n, fmt.Sprintf("waiting %v", w)
			})
			require.Zero(t, r.count(t, `SELECT count(*) FROM message_store.messages`), "nothing of the dead group")
			require.Zero(t, r.count(t, `SELECT count(*) FROM records`))
			require.Zero(t, r.count(t, `SELECT count(*) FROM idempotency_keys`))
			release()
			for i, ch := range outs {
				o := testwait.Recv(t, "a member's lone commit", ch)
				require.NoError(t, o.err)
				require.Equal(t, fmt.Sprintf("note-%d", i), o.c.Events[0].Stream)
			}
			require.Equal(t, n, r.count(t, `SELECT count(*) FROM message_store.messages`), "each member once")
			require.Equal(t, n, r.count(t, `SELECT count(*) FROM outbox`))
			require.Equal(t, int64(n), r.txs.Load(), "each alone")
			if keyed {
				require.Equal(t, n, r.count(t, `SELECT count(*) FROM idempotency_keys WHERE state = 'done'`), "final answers: no follow-ups")
			}
		})
	}
}

// noteAnswer is the answer a command's key stores: its id and its events'
// streams.
func noteAnswer(id string, evs []eventstore.Event, _ bool) (idempotency.Answer, error) {
	streams := make([]string, len(evs))
	for i, ev := range evs {
		streams[i] = ev.Stream
	}
	b, err := json.Marshal(map[string]any{"id": id, "streams": streams})
	return idempotency.Answer{Status: 200, Body: b}, err
}

// Two keyed commands committed in one group each write their own key with
// their own answer, in the group's transaction; a retry of one with its
// key replays that answer and runs nothing again.
func TestPostgresGroupIdempotencyKeys(t *testing.T) {
	t.Parallel()
	r := newGroupRig(t, 0)
	ctx := testwait.Context(t)
	store := idempotency.NewPostgres(r.pool, time.Hour)
	req := func(k string) idempotency.Request {
		return idempotency.Request{Scope: "Note", Key: k, Hash: idempotency.HashBody([]byte(k))}
	}
	release := r.hold(t, "note")
	first := r.start(ctx, note("note-first", 1))
	r.inFlight(t)
	var outs []<-chan outcome
	for _, k := range []string{"k-a", "k-b"} {
		stored, done, err := store.Begin(ctx, req(k))
		require.NoError(t, err)
		require.Nil(t, stored)
		t.Cleanup(func() { done(false) })
		outs = append(outs, r.start(unitofwork.WithIdempotency(ctx, store, req(k), noteAnswer), note("note-"+k, 1)))
	}
	r.queued(t, 2)
	release()
	require.NoError(t, testwait.Recv(t, "the first commit", first).err)
	for _, ch := range outs {
		require.NoError(t, testwait.Recv(t, "a keyed commit", ch).err)
	}
	require.Equal(t, int64(2), r.txs.Load(), "the two keyed commands in one transaction")
	for _, k := range []string{"k-a", "k-b"} {
		var body string
		require.NoError(t, r.pool.QueryRow(ctx, `SELECT convert_from(body, 'UTF8') FROM idempotency_keys WHERE key = $1 AND state = 'done'`, k).Scan(&body))
		require.JSONEq(t, fmt.Sprintf(`{"id":"cmd-note-%s","streams":["note-%s"]}`, k, k), body, "its own answer")
	}
	// The API saves the full answer; a retry with the key replays it.
	require.NoError(t, store.Save(ctx, req("k-a"), idempotency.Answer{Status: 201, Body: []byte(`{"full":true}`)}))
	stored, done, err := store.Begin(ctx, req("k-a"))
	require.NoError(t, err)
	done(false)
	require.NotNil(t, stored, "replayed, not run again")
	require.Equal(t, 201, stored.Status)
	require.Equal(t, 1, r.count(t, `SELECT count(*) FROM message_store.messages WHERE stream_name = 'note-k-a'`))
}

// A queued command whose context ends leaves the queue and returns the
// context's error at once, without committing; the others commit.
func TestPostgresGroupCancelWhileQueued(t *testing.T) {
	t.Parallel()
	r := newGroupRig(t, 0)
	ctx := testwait.Context(t)
	release := r.hold(t, "note")
	first := r.start(ctx, note("note-first", 1))
	r.inFlight(t)
	cctx, cancel := context.WithCancel(ctx)
	gone := r.start(cctx, note("note-gone", 1))
	r.queued(t, 1)
	kept := r.start(ctx, note("note-kept", 1))
	r.queued(t, 2)
	cancel()
	require.ErrorIs(t, testwait.Recv(t, "the cancelled command, while the commit in flight waits", gone).err, context.Canceled)
	r.queued(t, 1)
	release()
	require.NoError(t, testwait.Recv(t, "the first commit", first).err)
	require.NoError(t, testwait.Recv(t, "the kept command", kept).err)
	require.Zero(t, r.count(t, `SELECT count(*) FROM message_store.messages WHERE stream_name = 'note-gone'`))
	require.Zero(t, r.count(t, `SELECT count(*) FROM records WHERE id = 'note-gone'`))
	require.Equal(t, 2, r.count(t, `SELECT count(*) FROM message_store.messages`))
}

// The memory backend does not group: each command is its own transaction.
func TestMemoryCommitsCommandsAlone(t *testing.T) {
	t.Parallel()
	var txs atomic.Int64
	u := unitofwork.New(unitofwork.NewMemory(), unitofwork.Options{Broker: "default", Committed: func() { txs.Add(1) }})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			_, err := u.Commit(t.Context(), note(fmt.Sprintf("note-%d", i), 1))
			require.NoError(t, err)
		})
	}
	wg.Wait()
	require.Equal(t, int64(8), txs.Load())
	require.Zero(t, unitofwork.Queued(u))
}
