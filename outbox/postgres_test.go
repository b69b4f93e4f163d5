package outbox_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/pglisten"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/testwait"
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

// TestPostgresRelayWakesOverASharedListener: with ListenOver, the relays'
// wake-ups come over the process's listener, each to its broker's relay,
// and ListenRelayWakes holds no connection of its own.
func TestPostgresRelayWakesOverASharedListener(t *testing.T) {
	t.Parallel()
	pool := testserver.PostgresPool(t)
	config := pool.Config().ConnConfig.Copy()
	config.RuntimeParams["application_name"] = "shared-listener"
	l := pglisten.NewListener(config, nil, outbox.RelayWakeChannel)
	s := outbox.NewPostgres(pool, nil)
	s.ListenOver(l)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Go(func() { _ = l.Run(ctx) })
	heard := map[string]chan struct{}{"default": make(chan struct{}, 1000), "other": make(chan struct{}, 1000)}
	for broker, ch := range heard {
		wg.Go(func() {
			err := s.ListenRelayWakes(ctx, broker, nil, func() { ch <- struct{}{} })
			assert.ErrorIs(t, err, context.Canceled)
		})
	}
	testwait.For(t, "default's wake heard", func() (bool, string) {
		require.NoError(t, s.WakeRelay(ctx, "default"))
		return len(heard["default"]) > 0, ""
	})
	assert.Empty(t, heard["other"], "a wake of another broker's relay")
	var sessions int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND query LIKE 'LISTEN %'`).Scan(&sessions))
	assert.Equal(t, 1, sessions, "sessions LISTENing: the shared listener's alone")
}
