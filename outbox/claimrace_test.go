package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/outbox"
)

// A claim racing a relay's mark must not take back the row being marked,
// nor hand out the rows behind it on its key while the mark may leave it
// waiting for a retry. The race is driven, not hoped for, on real
// PostgreSQL: relay A claimed row 1 of a key and its lock has expired by
// relay B's clock; a third transaction holds row 1's lock, A's mark queues
// behind it, then B's claim runs; the lock is released, and the mark lands
// first. A claim that picked its rows from a snapshot and updated them
// without re-checking under the lock (as the claim once did) re-took row 1
// after the mark: published twice, or claimed past its last retry, with
// row 2 out of order.
func TestPostgresClaimRacingMark(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name       string
		maxRetries int
		mark       func(ctx context.Context, a *outbox.Postgres, id int64) error
		want       outbox.Status
	}{
		{"published", 5, func(ctx context.Context, a *outbox.Postgres, id int64) error {
			return a.MarkPublished(ctx, id, "A")
		}, outbox.StatusPublished},
		{"failed, retry ahead", 5, func(ctx context.Context, a *outbox.Postgres, id int64) error {
			return a.MarkFailed(ctx, id, "A", "down", t0.Add(time.Hour))
		}, outbox.StatusFailed},
		{"failed past its retries", 1, func(ctx context.Context, a *outbox.Postgres, id int64) error {
			return a.MarkFailed(ctx, id, "A", "down", t0.Add(time.Hour))
		}, outbox.StatusAbandoned},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := testwait.Context(t)
			pool := testserver.PostgresPool(t)
			a := outbox.NewPostgres(pool, func() time.Time { return t0 })
			b := outbox.NewPostgres(pool, func() time.Time { return t0.Add(time.Minute) })
			r1, r2 := row("00000000-0000-4000-8000-000000000001", "order-1", nil, 0), row("00000000-0000-4000-8000-000000000002", "order-1", nil, 0)
			r1.MaxRetries, r2.MaxRetries = tc.maxRetries, tc.maxRetries
			require.NoError(t, a.Add(ctx, []outbox.Row{r1, r2}))
			held, err := a.Claim(ctx, "default", "A", 1, time.Second)
			require.NoError(t, err)
			require.Len(t, held, 1)
			id := held[0].ID

			lock, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer lock.Rollback(context.Background()) //nolint:errcheck // a no-op after Commit
			_, err = lock.Exec(ctx, `SELECT id FROM outbox WHERE id = $1 FOR UPDATE`, id)
			require.NoError(t, err)

			marked := make(chan error, 1)
			go func() { marked <- tc.mark(ctx, a, id) }()
			waitForLockWait(t, pool, "UPDATE outbox SET%")

			type claim struct {
				rows []outbox.Row
				err  error
			}
			claimed := make(chan claim, 1)
			go func() {
				rows, err := b.Claim(ctx, "default", "B", 10, time.Minute)
				claimed <- claim{rows, err}
			}()
			// B's claim either returns at once (it skips the locked row)
			// or queues behind A's mark for the row lock.
			var got *claim
			testwait.For(t, "B's claim to return or wait for the row lock", func() (bool, string) {
				select {
				case c := <-claimed:
					got = &c
					return true, ""
				default:
				}
				n := lockWaiters(t, pool, "WITH %")
				return n > 0, fmt.Sprintf("%d claims waiting", n)
			})
			require.NoError(t, lock.Commit(ctx))
			require.NoError(t, testwait.Recv(t, "A's mark", marked))
			if got == nil {
				c := testwait.Recv(t, "B's claim", claimed)
				got = &c
			}
			require.NoError(t, got.err)
			for _, r := range got.rows {
				require.NotEqual(t, id, r.ID, "B took back the row A marked %s", tc.want)
				if tc.want == outbox.StatusFailed {
					require.NotEqual(t, r2.MessageID, r.MessageID, "B claimed row 2 while row 1 of its key waits for a retry")
				}
			}
			after, err := a.Get(ctx, id)
			require.NoError(t, err)
			require.Equal(t, tc.want, after.Status)
			require.Empty(t, after.LockedBy)
		})
	}
}

// waitForLockWait waits until a session of pool's database waits for a
// lock in a statement whose text is like pattern.
func waitForLockWait(t *testing.T, pool *pgxpool.Pool, pattern string) {
	t.Helper()
	testwait.For(t, "a statement like "+pattern+" waiting for a lock", func() (bool, string) {
		n := lockWaiters(t, pool, pattern)
		return n > 0, fmt.Sprintf("%d waiting", n)
	})
}

func lockWaiters(t *testing.T, pool *pgxpool.Pool, pattern string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE $1`, pattern).Scan(&n))
	return n
}
