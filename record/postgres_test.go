package record_test

import (
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/record"
	"github.com/proteanhq/protean-host/record/storetest"
)

func TestMain(m *testing.M) { testserver.Main(m) }

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
			Begin: testserver.BeginWith(pool, func(tx pgx.Tx, end testserver.PgxTx) storetest.Tx {
				return postgresTx{PostgresTx: s.Tx(tx), PgxTx: end}
			}),
		}
	})
}
