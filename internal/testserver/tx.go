package testserver

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/proteanhq/protean-host/internal/txdone"
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
		if txdone.Closed(err) {
			return t.Done
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
