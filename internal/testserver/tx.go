package testserver

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// PgxTx ends a pgx transaction as the storetest suites' Tx interfaces
// expect: Commit after Rollback returns Done (the store's ErrTxDone), a
// second Commit or a Rollback after either is a no-op. Embed it beside a
// store's PostgresTx view to make a suite Tx.
type PgxTx struct {
	Tx   pgx.Tx
	Done error
}

// Commit commits the transaction.
func (t PgxTx) Commit(ctx context.Context) error {
	if err := t.Tx.Commit(ctx); err != nil {
		if errors.Is(err, pgx.ErrTxClosed) {
			return t.Done
		}
		return err
	}
	return nil
}

// Rollback rolls the transaction back.
func (t PgxTx) Rollback(ctx context.Context) error {
	if err := t.Tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return err
	}
	return nil
}
