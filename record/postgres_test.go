package record_test

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/record"
	"github.com/proteanhq/protean-host/record/storetest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testserver.Stop()
	os.Exit(code)
}

// postgresTx adapts a pgx transaction and the store's view of it to
// storetest.Tx.
type postgresTx struct {
	*record.PostgresTx
	tx pgx.Tx
}

func (t postgresTx) Commit(ctx context.Context) error {
	if err := t.tx.Commit(ctx); err != nil {
		if errors.Is(err, pgx.ErrTxClosed) {
			return record.ErrTxDone
		}
		return err
	}
	return nil
}

func (t postgresTx) Rollback(ctx context.Context) error {
	if err := t.tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return err
	}
	return nil
}

func TestPostgresConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		pool := testserver.PostgresPool(t)
		s := record.NewPostgres(pool)
		return storetest.Harness{
			Store: s,
			Begin: func(ctx context.Context) (storetest.Tx, error) {
				tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
				if err != nil {
					return nil, err
				}
				return postgresTx{PostgresTx: s.Tx(tx), tx: tx}, nil
			},
		}
	})
}
