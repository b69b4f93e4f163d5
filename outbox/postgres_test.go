package outbox_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/outbox"
	"github.com/proteanhq/protean-host/outbox/storetest"
	"github.com/proteanhq/protean-host/position"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// row is a row of stream for the default broker, with the metadata the
// unit of work writes.
func row(id, stream string, k *string, prio int) outbox.Row {
	return outbox.Row{MessageID: id, Stream: stream, Type: "T", Data: json.RawMessage(`{}`), PartitionKey: k, Priority: prio,
		TargetBroker: "default", Metadata: json.RawMessage(`{"position": 3, "global_position": 9, "time": "2026-11-30T00:00:00Z"}`)}
}

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
