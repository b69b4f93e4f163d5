package outbox_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/outbox"
	"github.com/proteanhq/protean-host/outbox/storetest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testserver.Stop()
	if code == 0 {
		// The relay's goroutines, and the pools and clients tests open,
		// all end by the time their tests do.
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
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
			Store: s,
			Begin: func(ctx context.Context) (storetest.Tx, error) {
				tx, end, err := testserver.Begin(ctx, pool)
				if err != nil {
					return nil, err
				}
				return postgresTx{PostgresTx: s.Tx(tx), PgxTx: end}, nil
			},
		}
	})
}
