package testserver

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/proteanhq/protean-host/internal/txdone"
)

// Main is the TestMain body of every package whose tests use real servers
// or start goroutines: it runs the tests, then cleanups (such as
// wasmbuild.Cleanup), stops the servers, and, when the tests passed, fails
// the run if any goroutine is left (goleak): every goroutine the package's
// code starts must have an owner that ends it by the time its test does.
//
//	func TestMain(m *testing.M) { testserver.Main(m) }
func Main(m *testing.M, cleanups ...func()) {
	code := m.Run()
	for _, c := range cleanups {
		c()
	}
	Stop()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// PgxTx ends a pgx transaction as the storetest suites' Tx interfaces
// expect: Commit after Rollback returns txdone.Err (every store's
// ErrTxDone), a second Commit or a Rollback after either is a no-op. Embed
// it beside a store's PostgresTx view to make a suite Tx.
type PgxTx struct {
	Tx pgx.Tx
}

// Begin starts a READ COMMITTED transaction on pool, the level the stores
// run at, and returns it with its ending for a suite Tx.
func Begin(ctx context.Context, pool *pgxpool.Pool) (pgx.Tx, PgxTx, error) {
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return nil, PgxTx{}, err
	}
	return tx, PgxTx{Tx: tx}, nil
}

// BeginWith is a suite harness's Begin over pool: a READ COMMITTED
// transaction, made a suite Tx by wrap (the store's view of it beside its
// PgxTx ending).
func BeginWith[T any](pool *pgxpool.Pool, wrap func(tx pgx.Tx, end PgxTx) T) func(context.Context) (T, error) {
	return func(ctx context.Context) (T, error) {
		tx, end, err := Begin(ctx, pool)
		if err != nil {
			var zero T
			return zero, err
		}
		return wrap(tx, end), nil
	}
}

// Commit commits the transaction.
func (t PgxTx) Commit(ctx context.Context) error {
	if err := t.Tx.Commit(ctx); err != nil {
		if txdone.Closed(err) {
			return txdone.Err
		}
		return err
	}
	return nil
}

// Rollback rolls the transaction back.
func (t PgxTx) Rollback(ctx context.Context) error {
	if err := t.Tx.Rollback(ctx); err != nil && !txdone.Closed(err) {
		return err
	}
	return nil
}
