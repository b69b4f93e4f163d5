package idempotency_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/idempotency"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/testwait"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// harness is a store and a way to move its time on by d without waiting:
// the memory store's clock, or, on PostgreSQL (whose times are the
// database's clock), every stored time moved back by d.
type harness struct {
	store idempotency.Store
	age   func(t *testing.T, d time.Duration)
}

func harnesses() map[string]func(t *testing.T) harness {
	return map[string]func(t *testing.T) harness{
		"memory": func(t *testing.T) harness {
			var now atomic.Pointer[time.Time]
			t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
			now.Store(&t0)
			return harness{idempotency.NewMemory(time.Hour, func() time.Time { return *now.Load() }), func(_ *testing.T, d time.Duration) {
				later := now.Load().Add(d)
				now.Store(&later)
			}}
		},
		"postgres": func(t *testing.T) harness {
			pool := testserver.PostgresPool(t)
			return harness{idempotency.NewPostgres(pool, time.Hour), func(t *testing.T, d time.Duration) { ageKeys(t, pool, d) }}
		},
	}
}

// ageKeys moves every stored key's times back by d, as if the database's
// clock had moved on by d.
func ageKeys(t *testing.T, pool *pgxpool.Pool, d time.Duration) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `UPDATE idempotency_keys SET created_at = created_at - $1 * interval '1 microsecond',
		expires_at = expires_at - $1 * interval '1 microsecond', locked_until = locked_until - $1 * interval '1 microsecond'`, d.Microseconds())
	require.NoError(t, err)
}

func request(key, body string) idempotency.Request {
	return idempotency.Request{Scope: "PlaceOrder", Key: key, Hash: idempotency.HashBody([]byte(body))}
}

// Ten concurrent requests of one key: the first runs, the nine others
// wait for it and get its answer; none runs the command again.
func TestConcurrentRepeatsRunOnce(t *testing.T) {
	t.Parallel()
	for name, newHarness := range harnesses() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := testwait.Context(t)
			h := newHarness(t)
			r := request("k-1", `{"order_id":"o-1"}`)
			var runs, entered atomic.Int32
			answers := make(chan idempotency.Answer, 10)
			handle := func() error {
				entered.Add(1)
				stored, done, err := h.store.Begin(ctx, r)
				if err != nil {
					return err
				}
				defer done(false)
				if stored != nil {
					answers <- *stored
					return nil
				}
				n := runs.Add(1)
				// The first holds the key until the nine others have asked.
				for entered.Load() < 10 {
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-time.After(5 * time.Millisecond):
					}
				}
				a := idempotency.Answer{Status: 200, Body: json.RawMessage(fmt.Sprintf(`{"run":%d}`, n))}
				if err := h.store.Save(ctx, r, a); err != nil {
					return err
				}
				answers <- a
				return nil
			}
			var wg sync.WaitGroup
			errs := make(chan error, 10)
			for range 10 {
				wg.Go(func() { errs <- handle() })
			}
			wg.Wait()
			close(errs)
			close(answers)
			for err := range errs {
				require.NoError(t, err)
			}
			require.Equal(t, int32(1), runs.Load(), "the command ran once")
			var got []string
			for a := range answers {
				require.Equal(t, 200, a.Status)
				got = append(got, string(a.Body))
			}
			require.Len(t, got, 10)
			for _, b := range got {
				require.JSONEq(t, `{"run":1}`, b)
			}
		})
	}
}

// The same key with another body is ErrMismatch; whitespace is not
// another body; another command type is another key; an expired key is
// gone.
func TestKeyRules(t *testing.T) {
	t.Parallel()
	for name, newHarness := range harnesses() {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			h := newHarness(t)
			r := request("k-1", `{"order_id": "o-1"}`)
			stored, done, err := h.store.Begin(ctx, r)
			require.NoError(t, err)
			require.Nil(t, stored)
			require.NoError(t, h.store.Save(ctx, r, idempotency.Answer{Status: 200, Body: json.RawMessage(`{"id":"a"}`)}))
			done(false)

			stored, done, err = h.store.Begin(ctx, request("k-1", "{\n\"order_id\":\"o-1\"}"))
			require.NoError(t, err)
			require.NotNil(t, stored)
			require.JSONEq(t, `{"id":"a"}`, string(stored.Body))
			done(false)

			_, _, err = h.store.Begin(ctx, request("k-1", `{"order_id":"o-2"}`))
			require.ErrorIs(t, err, idempotency.ErrMismatch)

			other := r
			other.Scope = "CancelOrder"
			stored, done, err = h.store.Begin(ctx, other)
			require.NoError(t, err)
			require.Nil(t, stored, "a key is per command type")
			done(false)

			h.age(t, time.Hour)
			stored, done, err = h.store.Begin(ctx, r)
			require.NoError(t, err)
			require.Nil(t, stored, "an expired key is gone")
			done(false)

			_, _, err = h.store.Begin(ctx, request("", `{}`))
			require.ErrorIs(t, err, idempotency.ErrInvalid)
		})
	}
}

// A request that died after its unit of work committed the key (before
// its full answer was saved) holds the key until its lease lapses; then a
// repeat gets the committed answer, and never runs the command again. A
// request that died before committing anything loses the key at the lease
// too, and the repeat runs.
func TestPostgresDeadRequestLease(t *testing.T) {
	t.Parallel()
	pool := testserver.PostgresPool(t)
	s := idempotency.NewPostgres(pool, time.Hour)
	ctx := testwait.Context(t)

	committed, died := request("k-committed", `{}`), request("k-died", `{}`)
	for _, r := range []idempotency.Request{committed, died} {
		// The request dies: its context ends (its lease is no longer
		// renewed) and it never calls done (nothing releases its key).
		reqCtx, die := context.WithCancel(ctx)
		stored, _, err := s.Begin(reqCtx, r)
		require.NoError(t, err)
		require.Nil(t, stored)
		die()
	}
	var b pgx.Batch
	s.QueueInsert(&b, committed, idempotency.Answer{Status: 200, Body: json.RawMessage(`{"id":"first"}`)}, false)
	require.NoError(t, pool.SendBatch(ctx, &b).Close())

	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, _, err := s.Begin(short, committed)
	require.ErrorIs(t, err, context.DeadlineExceeded, "within the lease a repeat waits for the full answer")

	ageKeys(t, pool, idempotency.Lease)
	stored, done, err := s.Begin(ctx, committed)
	require.NoError(t, err)
	require.NotNil(t, stored, "after the lease the committed answer is the answer")
	require.JSONEq(t, `{"id":"first"}`, string(stored.Body))
	done(false)

	stored, done, err = s.Begin(ctx, died)
	require.NoError(t, err)
	require.Nil(t, stored, "a claim that committed nothing lapses: the repeat runs")
	done(false)
}

// A command that runs longer than the lease keeps its key: the request
// renews its lease while it runs, so a repeat sent meanwhile waits for it
// (it does not take the key over and run the command again) and gets the
// first answer. The memory store holds the key for the request's life.
func TestLongRequestKeepsItsKey(t *testing.T) {
	t.Parallel()
	// The heartbeat renews every third of the lease: a lease of 5 s leaves
	// it more than 3 s of slack on a busy machine before the key could
	// lapse, and two leases of running is past the first lapse it prevents.
	const lease = 5 * time.Second
	stores := map[string]func(t *testing.T) idempotency.Store{
		"memory": func(t *testing.T) idempotency.Store { return idempotency.NewMemory(time.Hour, nil) },
		"postgres": func(t *testing.T) idempotency.Store {
			return idempotency.NewPostgres(testserver.PostgresPool(t), time.Hour).WithLease(lease)
		},
	}
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := testwait.Context(t)
			s := newStore(t)
			r := request("k-slow", `{"order_id":"o-1"}`)
			var runs atomic.Int32
			// run is one request: a stored answer, or the command run
			// (the first one holds the key for hold) and its answer saved.
			run := func(hold <-chan struct{}) (idempotency.Answer, error) {
				stored, done, err := s.Begin(ctx, r)
				if err != nil {
					return idempotency.Answer{}, err
				}
				defer done(false)
				if stored != nil {
					return *stored, nil
				}
				n := runs.Add(1)
				select {
				case <-hold:
				case <-ctx.Done():
					return idempotency.Answer{}, ctx.Err()
				}
				a := idempotency.Answer{Status: 200, Body: json.RawMessage(fmt.Sprintf(`{"run":%d}`, n))}
				return a, s.Save(ctx, r, a)
			}
			release := make(chan struct{})
			type outcome struct {
				a   idempotency.Answer
				err error
			}
			first, repeat := make(chan outcome, 1), make(chan outcome, 1)
			go func() {
				a, err := run(release)
				first <- outcome{a, err}
			}()
			testwait.For(t, "the first request runs the command", func() (bool, string) {
				return runs.Load() == 1, fmt.Sprintf("runs %d", runs.Load())
			})
			go func() {
				now := make(chan struct{})
				close(now) // a second run of the command would answer at once
				a, err := run(now)
				repeat <- outcome{a, err}
			}()
			// The command runs for two leases while the repeat waits.
			select {
			case o := <-repeat:
				t.Fatalf("the repeat returned while the first request ran: %+v (runs %d)", o, runs.Load())
			case <-time.After(2 * lease):
			}
			close(release)
			f, rep := <-first, <-repeat
			require.NoError(t, f.err)
			require.NoError(t, rep.err)
			require.Equal(t, int32(1), runs.Load(), "the command ran once")
			require.JSONEq(t, `{"run":1}`, string(f.a.Body))
			require.JSONEq(t, `{"run":1}`, string(rep.a.Body), "the repeat got the first answer")
		})
	}
}

// A key's times on PostgreSQL are the database's clock, never a host's
// (hosts' clocks differ: a host ahead by more than the lease would take a
// key another host's request holds). A key written in a transaction (the
// command's unit of work) starts at that transaction's now(), to the
// microsecond; a claim's lease and expiry are measured from its own
// now(), and a lease lapses when the database's clock passes it.
func TestPostgresTimesAreTheDatabases(t *testing.T) {
	t.Parallel()
	pool := testserver.PostgresPool(t)
	const lease = 90 * time.Second
	s := idempotency.NewPostgres(pool, time.Hour).WithLease(lease)
	ctx := testwait.Context(t)

	committed := request("k-in-tx", `{}`)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var b pgx.Batch
	s.QueueInsert(&b, committed, idempotency.Answer{Status: 200, Body: json.RawMessage(`{}`)}, false)
	b.Queue(`SELECT created_at = now(), expires_at = now() + interval '1 hour', locked_until = now() + interval '90 seconds',
		created_at - now() FROM idempotency_keys WHERE key = $1`, committed.Key)
	br := tx.SendBatch(ctx, &b)
	_, err = br.Exec()
	require.NoError(t, err)
	var created, expires, locked bool
	var off time.Duration
	require.NoError(t, br.QueryRow().Scan(&created, &expires, &locked, &off))
	require.NoError(t, br.Close())
	require.True(t, created && expires && locked, "created_at off the transaction's now() by %s; expiry %v, lease %v", off, expires, locked)
	require.NoError(t, tx.Commit(ctx))

	// A claim (autocommit) starts at its statement's now(): seen here as
	// the xact_start of the claim while it waits for a row lock of ours
	// on a lapsed key.
	claimed := request("k-claimed", `{}`)
	_, err = pool.Exec(ctx, `INSERT INTO idempotency_keys (scope, key, request_hash, state, owner, locked_until, created_at, expires_at)
		VALUES ($1, $2, $3, 'pending', 'gone', now() - interval '1 second', now() - interval '1 minute', now() + interval '1 hour')`,
		claimed.Scope, claimed.Key, claimed.Hash)
	require.NoError(t, err)
	lock, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(ctx) }()
	_, err = lock.Exec(ctx, `SELECT 1 FROM idempotency_keys WHERE key = $1 FOR UPDATE`, claimed.Key)
	require.NoError(t, err)
	reqCtx, die := context.WithCancel(ctx)
	type begun struct {
		stored *idempotency.Answer
		err    error
	}
	claim := make(chan begun, 1)
	go func() {
		stored, _, err := s.Begin(reqCtx, claimed)
		claim <- begun{stored, err}
	}()
	var claimStart time.Time
	testwait.For(t, "the claim waits for our row lock", func() (bool, string) {
		err := pool.QueryRow(ctx, `SELECT xact_start FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO idempotency_keys%'`).Scan(&claimStart)
		return err == nil, fmt.Sprint(err)
	})
	require.NoError(t, lock.Rollback(ctx))
	c := <-claim
	require.NoError(t, c.err)
	require.Nil(t, c.stored)
	die() // the request dies holding its key
	var createdAt time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT created_at FROM idempotency_keys WHERE key = $1`, claimed.Key).Scan(&createdAt))
	require.True(t, createdAt.Equal(claimStart), "claim's created_at %s, its transaction's start %s", createdAt, claimStart)
	var leaseLeft, ttlLeft time.Duration
	require.NoError(t, pool.QueryRow(ctx, `SELECT locked_until - created_at, expires_at - created_at FROM idempotency_keys WHERE key = $1`,
		claimed.Key).Scan(&leaseLeft, &ttlLeft))
	require.Equal(t, [2]time.Duration{lease, time.Hour}, [2]time.Duration{leaseLeft, ttlLeft})

	// A lease live by the database's clock: a repeat waits; once that
	// clock has passed it, the repeat takes the key.
	_, err = pool.Exec(ctx, `UPDATE idempotency_keys SET locked_until = clock_timestamp() + interval '1 hour' WHERE key = $1`, claimed.Key)
	require.NoError(t, err)
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, _, err = s.Begin(short, claimed)
	require.ErrorIs(t, err, context.DeadlineExceeded, "a live lease by the database's clock is not taken")
	ageKeys(t, pool, time.Hour)
	stored, done, err := s.Begin(ctx, claimed)
	require.NoError(t, err)
	require.Nil(t, stored, "a lapsed lease is taken")
	done(false)
}

// A request whose unit of work stored its final answer says so to done,
// which then sends nothing: the key is done, and done(false) would have
// been a DELETE that matched no row. A request that stored nothing
// releases its claim, so the next request of the key runs it.
func TestPostgresAnsweredRequestReleasesNothing(t *testing.T) {
	t.Parallel()
	pool := testserver.PostgresPool(t)
	s := idempotency.NewPostgres(pool, time.Hour)
	ctx := testwait.Context(t)
	state := func(key string) string {
		var st string
		err := pool.QueryRow(ctx, `SELECT state FROM idempotency_keys WHERE key = $1`, key).Scan(&st)
		if errors.Is(err, pgx.ErrNoRows) {
			return "gone"
		}
		require.NoError(t, err)
		return st
	}

	final := request("k-final", `{}`)
	stored, done, err := s.Begin(ctx, final)
	require.NoError(t, err)
	require.Nil(t, stored)
	var b pgx.Batch
	s.QueueInsert(&b, final, idempotency.Answer{Status: 200, Body: json.RawMessage(`{"id":"final"}`)}, true)
	require.NoError(t, pool.SendBatch(ctx, &b).Close())
	require.Equal(t, "done", state(final.Key), "a final answer is stored done")
	done(true)
	stored, done, err = s.Begin(ctx, final)
	require.NoError(t, err)
	require.Equal(t, &idempotency.Answer{Status: 200, Body: json.RawMessage(`{"id":"final"}`)}, stored, "a repeat gets it at once")
	done(false)

	// done(true) sends nothing: a claim it was wrongly told about stays.
	held := request("k-held", `{}`)
	_, done, err = s.Begin(ctx, held)
	require.NoError(t, err)
	done(true)
	require.Equal(t, "pending", state(held.Key), "done(true) released nothing")
	_, err = pool.Exec(ctx, `DELETE FROM idempotency_keys WHERE key = $1`, held.Key)
	require.NoError(t, err)

	unanswered := request("k-unanswered", `{}`)
	_, done, err = s.Begin(ctx, unanswered)
	require.NoError(t, err)
	require.Equal(t, "pending", state(unanswered.Key))
	done(false)
	require.Equal(t, "gone", state(unanswered.Key), "an unanswered request releases its claim")
}

// Each claim purges up to 100 expired keys in its own round trip, so the
// table does not grow without end and no sweeper is needed.
func TestPostgresClaimPurgesExpiredKeys(t *testing.T) {
	t.Parallel()
	pool := testserver.PostgresPool(t)
	s := idempotency.NewPostgres(pool, time.Hour)
	ctx := testwait.Context(t)
	_, err := pool.Exec(ctx, `INSERT INTO idempotency_keys (scope, key, request_hash, state, status, body, created_at, expires_at)
		SELECT 'Purge', 'old-' || i, '\x00', 'done', 200, '{}', now() - interval '2 days', now() - interval '1 day'
		FROM generate_series(1, 150) AS i`)
	require.NoError(t, err)
	expired := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE scope = 'Purge'`).Scan(&n))
		return n
	}
	for i, left := range []int{50, 0} {
		_, done, err := s.Begin(ctx, request(fmt.Sprintf("k-purge-%d", i), `{}`))
		require.NoError(t, err)
		done(false)
		require.Equal(t, left, expired(), "claim %d purged at most 100", i+1)
	}
}
