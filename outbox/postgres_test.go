package outbox_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/outbox"
	"github.com/proteanhq/protean-host/outbox/storetest"
	"github.com/proteanhq/protean-host/position"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// postgresTx is the store's view of a pgx transaction plus its commit
// and rollback: a storetest.Tx.
type postgresTx struct {
	*outbox.PostgresTx
	testserver.PgxTx
}

func TestPostgresConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T, now func() time.Time) storetest.Harness {
		pool := testserver.PostgresPool(t)
		s := outbox.NewPostgres(pool, now)
		return storetest.Harness{
			Store: s, Positions: position.NewPostgres(pool, now),
			Begin: testserver.BeginWith(pool, func(tx pgx.Tx, end testserver.PgxTx) storetest.Tx {
				return postgresTx{PostgresTx: s.Tx(tx), PgxTx: end}
			}),
		}
	})
}
