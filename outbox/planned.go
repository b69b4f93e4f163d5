package outbox

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// claimSetting is what the claim runs under: the planner takes no
// sequential scan of the outbox.
//
// Each connection plans the claim once and keeps the plan (the generic
// plan, see claimQuery). A relay's first claims on a fresh deployment find
// the outbox empty, or small and never analyzed, and a sequential scan of
// it is then the cheapest way to find a claim's rows by id; that plan
// stayed for the connection's life while the outbox grew with the rows it
// publishes (kept PublishedRetention), and a claim of 15 rows cost 11.6 ms
// instead of 1 (make load, 1 host: 72 % of PostgreSQL's execution time).
// Every scan of the claim is through an index (TestClaimPlanWalksIndexes),
// so forbidding the sequential scan changes no good plan.
const claimSetting = `SET LOCAL enable_seqscan = off`

// queryUnder runs sql in a transaction of its own under setting (a SET
// LOCAL), in one round trip (BEGIN, the setting, sql and COMMIT
// pipelined), and collects its rows with scan. A failure rolls the
// transaction back.
func queryUnder[T any](ctx context.Context, pool *pgxpool.Pool, setting, sql string, args []any, scan pgx.RowToFunc[T]) (_ []T, err error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	var b pgx.Batch
	b.Queue(`BEGIN`)
	b.Queue(setting)
	b.Queue(sql, args...)
	b.Queue(`COMMIT`)
	br := conn.SendBatch(ctx, &b)
	out, err := func() ([]T, error) {
		for range 2 {
			if _, err := br.Exec(); err != nil {
				return nil, err
			}
		}
		rows, _ := br.Query()
		out, err := pgx.CollectRows(rows, scan)
		if err != nil {
			return nil, err
		}
		_, err = br.Exec()
		return out, err
	}()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		// A failed statement left the transaction aborted, COMMIT skipped.
		// A failed ROLLBACK leaves the connection in a transaction, which
		// the pool destroys on Release.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = conn.Exec(rctx, `ROLLBACK`)
		return nil, err
	}
	return out, nil
}
