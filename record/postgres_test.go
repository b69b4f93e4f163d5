package record_test

import (
	"context"
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

// postgresTx is the store's view of a pgx transaction plus its commit
// and rollback: a storetest.Tx.
type postgresTx struct {
	*record.PostgresTx
	testserver.PgxTx
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
				return postgresTx{PostgresTx: s.Tx(tx), PgxTx: testserver.PgxTx{Tx: tx, Done: record.ErrTxDone}}, nil
			},
		}
	})
}
