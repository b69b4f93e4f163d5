package idempotency_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/idempotency"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/testwait"
)

func TestMain(m *testing.M) { testserver.Main(m) }

type harness struct{ store idempotency.Store }

func harnesses(clock func() time.Time) map[string]func(t *testing.T) harness {
	return map[string]func(t *testing.T) harness{
		"memory": func(t *testing.T) harness { return harness{idempotency.NewMemory(time.Hour, clock)} },
		"postgres": func(t *testing.T) harness {
			return harness{idempotency.NewPostgres(testserver.PostgresPool(t), time.Hour, clock)}
		},
	}
}

func request(key, body string) idempotency.Request {
	return idempotency.Request{Scope: "PlaceOrder", Key: key, Hash: idempotency.HashBody([]byte(body))}
}

// Ten concurrent requests of one key: the first runs, the nine others
// wait for it and get its answer; none runs the command again.
func TestConcurrentRepeatsRunOnce(t *testing.T) {
	t.Parallel()
	for name, newHarness := range harnesses(nil) {
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
				defer done()
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
	var now atomic.Pointer[time.Time]
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	now.Store(&t0)
	clock := func() time.Time { return *now.Load() }
	for name, newHarness := range harnesses(clock) {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			h := newHarness(t)
			r := request("k-1", `{"order_id": "o-1"}`)
			stored, done, err := h.store.Begin(ctx, r)
			require.NoError(t, err)
			require.Nil(t, stored)
			require.NoError(t, h.store.Save(ctx, r, idempotency.Answer{Status: 200, Body: json.RawMessage(`{"id":"a"}`)}))
			done()

			stored, done, err = h.store.Begin(ctx, request("k-1", "{\n\"order_id\":\"o-1\"}"))
			require.NoError(t, err)
			require.NotNil(t, stored)
			require.JSONEq(t, `{"id":"a"}`, string(stored.Body))
			done()

			_, _, err = h.store.Begin(ctx, request("k-1", `{"order_id":"o-2"}`))
			require.ErrorIs(t, err, idempotency.ErrMismatch)

			other := r
			other.Scope = "CancelOrder"
			stored, done, err = h.store.Begin(ctx, other)
			require.NoError(t, err)
			require.Nil(t, stored, "a key is per command type")
			done()

			later := t0.Add(time.Hour)
			now.Store(&later)
			stored, done, err = h.store.Begin(ctx, r)
			require.NoError(t, err)
			require.Nil(t, stored, "an expired key is gone")
			done()
			now.Store(&t0)

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
	var now atomic.Pointer[time.Time]
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	now.Store(&t0)
	s := idempotency.NewPostgres(pool, time.Hour, func() time.Time { return *now.Load() })
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
	s.QueueInsert(&b, committed, idempotency.Answer{Status: 200, Body: json.RawMessage(`{"id":"first"}`)})
	require.NoError(t, pool.SendBatch(ctx, &b).Close())

	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, _, err := s.Begin(short, committed)
	require.ErrorIs(t, err, context.DeadlineExceeded, "within the lease a repeat waits for the full answer")

	later := t0.Add(idempotency.Lease)
	now.Store(&later)
	stored, done, err := s.Begin(ctx, committed)
	require.NoError(t, err)
	require.NotNil(t, stored, "after the lease the committed answer is the answer")
	require.JSONEq(t, `{"id":"first"}`, string(stored.Body))
	done()

	stored, done, err = s.Begin(ctx, died)
	require.NoError(t, err)
	require.Nil(t, stored, "a claim that committed nothing lapses: the repeat runs")
	done()
}

// A command that runs longer than the lease keeps its key: the request
// renews its lease while it runs, so a repeat sent meanwhile waits for it
// (it does not take the key over and run the command again) and gets the
// first answer. The memory store holds the key for the request's life.
func TestLongRequestKeepsItsKey(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second
	stores := map[string]func(t *testing.T) idempotency.Store{
		"memory": func(t *testing.T) idempotency.Store { return idempotency.NewMemory(time.Hour, nil) },
		"postgres": func(t *testing.T) idempotency.Store {
			return idempotency.NewPostgres(testserver.PostgresPool(t), time.Hour, nil).WithLease(lease)
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
				defer done()
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
			// The command runs for three leases while the repeat waits.
			select {
			case o := <-repeat:
				t.Fatalf("the repeat returned while the first request ran: %+v (runs %d)", o, runs.Load())
			case <-time.After(3 * lease):
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
