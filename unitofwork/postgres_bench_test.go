package unitofwork_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/outbox"
	"github.com/proteanhq/protean-host/record"
	"github.com/proteanhq/protean-host/unitofwork"
)

// BenchmarkRawInsertCommit is the floor for BenchmarkUnitOfWorkCommit, on
// the same server in the same run: BEGIN, one single-row INSERT, COMMIT.
// BenchmarkUnitOfWorkCommit is what the unit of work's storage costs on
// top of it: BEGIN, one record write, one event append, one outbox row,
// COMMIT, through the PostgreSQL backend.

// benchDatabase returns a pool on a fresh, migrated database, or skips
// when no PostgreSQL server can be had.
func benchDatabase(b *testing.B) *pgxpool.Pool {
	b.Helper()
	if err := testserver.PostgresAvailable(); err != nil {
		b.Skipf("no PostgreSQL server: %v", err)
	}
	return testserver.PostgresPool(b)
}

func BenchmarkRawInsertCommit(b *testing.B) {
	pool := benchDatabase(b)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_raw (id bigserial PRIMARY KEY, k text NOT NULL, data jsonb)`); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		tx, err := pool.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO bench_raw (k, data) VALUES ($1, $2)`, fmt.Sprintf("raw-%d", i), `{"status":"placed"}`); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkUnitOfWorkCommit(b *testing.B) {
	pool := benchDatabase(b)
	backend := unitofwork.NewPostgres(pool)
	ctx := context.Background()
	run := eventstore.NewID()[:8] // fresh keys and streams per run
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("%s%d", run, i)
		tx, err := backend.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		err = tx.Write(ctx, []record.Write{{Key: record.Key{Kind: record.KindAggregate, Type: "order", ID: id}, Data: json.RawMessage(`{"status":"placed"}`)}})
		if err != nil {
			b.Fatal(err)
		}
		evs, err := tx.Append(ctx, []eventstore.NewEvent{{Stream: "order-" + id, Type: "OrderPlaced", Data: json.RawMessage(`{"order_id":"x"}`), ExpectedVersion: eventstore.NoStream}})
		if err != nil {
			b.Fatal(err)
		}
		key := "client-" + id
		err = tx.Add(ctx, []outbox.Row{{MessageID: evs[0].ID, Stream: "order-" + id, Type: "OrderPlaced", Data: evs[0].Data, PartitionKey: &key, TargetBroker: "default"}})
		if err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
