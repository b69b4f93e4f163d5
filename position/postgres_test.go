package position_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/position"
	"github.com/proteanhq/protean-host/position/positiontest"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// postgresTx is the store's view of a pgx transaction plus its commit and
// rollback: a positiontest.Tx.
type postgresTx struct {
	*position.PostgresTx
	testserver.PgxTx
}

func TestPostgresConformance(t *testing.T) {
	t.Parallel()
	positiontest.Run(t, func(t *testing.T, now func() time.Time) positiontest.Harness {
		pool := testserver.PostgresPool(t)
		s := position.NewPostgres(pool, now)
		return positiontest.Harness{
			Store: s,
			Begin: testserver.BeginWith(pool, func(tx pgx.Tx, end testserver.PgxTx) positiontest.Tx {
				return postgresTx{PostgresTx: s.Tx(tx), PgxTx: end}
			}),
		}
	})
}
